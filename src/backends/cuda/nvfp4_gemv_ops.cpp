// The NVFP4 matrix-vector kernel (nvfp4_gemv.h) as one of the timed paths of an NVFP4 op, beside
// the op's streaming-kernel launch.
#include <atomic>

#include "backends/cuda/cuda_ops.h"  // nvfp4_global_scale_device
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/path_choice.h"
#include "core/tensor.h"
#include "ops/nvfp4.h"

namespace locus::cuda::detail {

namespace {
std::atomic<bool> g_always{false};
}  // namespace

Nvfp4GemvArgs nvfp4_gemv_args(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y,
                              bool swiglu) {
  Nvfp4GemvArgs a;
  a.x = x.data<uint16_t>();
  a.x_ld = x.stride(0);
  a.codes = w.packed.data<uint8_t>();
  a.scales = w.scales.data<uint16_t>();
  a.global_scale = nvfp4_global_scale_device(w);
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.bias_f32 = bias.defined() && bias.dtype() == DType::kFP32;
  a.swiglu = swiglu;
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.y_f32 = y.dtype() == DType::kFP32;
  a.m = x.size(0);
  a.n = y.size(1);
  a.k = x.size(1);
  return a;
}

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
