// ops/host_upload.h: checks and dispatch; the CUDA side is backends/cuda/host_upload.cpp.
#include "ops/host_upload.h"

#include "core/error.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/host_upload.h"
#endif

namespace locus::ops {

Tensor host_staging(const Shape& shape, DType dtype, Device device) {
#if defined(LOCUS_WITH_CUDA)
  if (device.is_cuda()) return cuda::pinned_host_empty(shape, dtype);
#endif
  (void)device;
  return Tensor::empty(shape, dtype);
}

void upload(const Tensor& src, const Tensor& dst, const Stream& stream) {
  LOCUS_CHECK(src.defined() && dst.defined() && src.device().is_cpu() && src.is_contiguous() && dst.is_contiguous() &&
                  src.shape() == dst.shape() && src.dtype() == dst.dtype(),
              "upload: needs a contiguous CPU source and a contiguous destination of its shape and dtype, got ",
              src.defined() ? src.describe() : std::string("nothing"), " -> ",
              dst.defined() ? dst.describe() : std::string("nothing"));
  if (dst.device().is_cpu()) {
    Tensor view = dst;  // a handle on the same storage
    view.copy_(src);
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  cuda::upload(src, dst, stream.native);
#else
  (void)stream;
  LOCUS_THROW("upload: ", dst.describe(), " is on ", dst.device().name(), " but this build has no CUDA backend");
#endif
}

void synchronize(Device device, const Stream& stream) {
  if (device.is_cpu()) return;
#if defined(LOCUS_WITH_CUDA)
  cuda::stream_synchronize(device.index, stream.native);
#else
  (void)stream;
  LOCUS_THROW("synchronize: ", device.name(), " needs the CUDA backend, which this build does not have");
#endif
}

}  // namespace locus::ops
