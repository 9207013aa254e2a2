#include "ops/host_readback.h"

#include "core/error.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/host_readback.h"
#endif

namespace locus::ops {

struct HostReadback::Pending {
#if defined(LOCUS_WITH_CUDA)
  cuda::HostReadback copy;
#endif
};

HostReadback::HostReadback(const Tensor& src, const Stream& stream) : src_(src) {
  LOCUS_CHECK(src.defined() && src.is_contiguous(), "HostReadback: needs a contiguous tensor, got ",
              src.defined() ? src.describe() : std::string("an undefined tensor"));
  if (src.device().is_cpu()) return;
#if defined(LOCUS_WITH_CUDA)
  pending_ = std::make_unique<Pending>(Pending{cuda::HostReadback(src, stream.native)});
#else
  (void)stream;
  LOCUS_THROW("HostReadback: ", src.describe(), " is on ", src.device().name(), " but this build has no CUDA backend");
#endif
}

HostReadback::~HostReadback() = default;

Tensor HostReadback::wait() {
  if (!pending_) return src_;
#if defined(LOCUS_WITH_CUDA)
  return Tensor::from_blob(const_cast<void*>(pending_->copy.wait()), src_.shape(), src_.dtype(), Device::cpu());
#else
  return src_;  // unreachable: the constructor refused
#endif
}

}  // namespace locus::ops
