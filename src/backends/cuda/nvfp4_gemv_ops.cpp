// The NVFP4 matrix-vector kernel (nvfp4_gemv.h) as one of the timed paths of an NVFP4 op, beside
// the op's streaming-kernel launch.
#include <atomic>

#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/path_choice.h"

namespace locus::cuda::detail {

namespace {
std::atomic<bool> g_always{false};
}  // namespace

void set_nvfp4_gemv_always(bool on) { g_always.store(on); }
bool nvfp4_gemv_always() { return g_always.load(); }

void run_nvfp4_gemv_fastest(const Nvfp4GemvArgs& a, const PathCall& streaming, cudaStream_t stream) {
  if (g_always.load()) {
    launch_nvfp4_gemv(a, stream);
    return;
  }
  run_fastest_path(nvfp4_gemv_problem_key(a, stream),
                   {streaming, [&a](cudaStream_t s) { launch_nvfp4_gemv(a, s); }}, stream);
}

}  // namespace locus::cuda::detail
