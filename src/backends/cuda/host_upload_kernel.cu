// Copies by a kernel between device memory and page-locked host memory through its mapped address
// (host_upload.h): cuda::upload's from the staging and HostReadback's small copies back, rather
// than copy-engine transfers. Inside a decode graph a copy node hands over to the next kernel node
// about 15 us later, and an eager copy after a kernel starts 5-7 us after it (H100 traces,
// docs/benchmarks.md); a kernel hands over as any kernel does. Reads use ld.global.cv, so a
// replay never sees the previous step's values.
#include <cstdint>

#include "backends/cuda/host_upload.h"
#include "backends/cuda/small_ops_launch.cuh"

namespace locus::cuda {
namespace {

template <typename V>
__global__ void host_copy_kernel(const V* __restrict__ src, V* __restrict__ dst, int64_t n) {
  detail::small_op_start();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __ldcv(src + i);
}

template <typename V>
void launch_copy(const void* src, void* dst, size_t bytes, cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(V));
  constexpr int kThreads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 64));
  detail::launch_small_op(host_copy_kernel<V>, blocks, kThreads, 0, stream, "copy kernel launch",
                          static_cast<const V*>(src), static_cast<V*>(dst), n);
}

}  // namespace

void copy_by_kernel(const void* src, void* dst, size_t bytes, void* stream) {
  const cudaStream_t s = detail::as_stream(stream);
  const auto a = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | bytes;
  if (a % 16 == 0) return launch_copy<uint4>(src, dst, bytes, s);
  if (a % 8 == 0) return launch_copy<unsigned long long>(src, dst, bytes, s);
  if (a % 4 == 0) return launch_copy<unsigned>(src, dst, bytes, s);
  launch_copy<unsigned char>(src, dst, bytes, s);
}

}  // namespace locus::cuda
