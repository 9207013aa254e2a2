// NVFP4 weights (ModelOpt layout) and the weight-only NVFP4 x BF16 GEMM.
//
// Dequantized value: W[n,k] = e2m1(q[n,k]) * e4m3(scales[n, k/16]) * global_scale, where
// q is packed two per byte along K (element 2i in the low nibble) and global_scale is
// ModelOpt's `weight_scale_2` (dequant direction, amax / (6 * 448)). In fp32 the CPU evaluates it
// as ModelOpt does: e2m1(q) * (e4m3(scale) * global_scale), the two scales multiplied first.
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

enum class Nvfp4Layout : uint8_t {
  kLinear,     // the checkpoint layout: packed [N, K/2], scales [N, K/16] row-major
  kCudaTiled,  // the CUDA kernel's pre-shuffled layout (defined in backends/cuda)
};

struct Nvfp4Weight {
  Tensor packed;             // kFP4E2M1x2 (or kU8) [N, K/2]
  Tensor scales;             // kFP8E4M3 [N, K/16]
  float global_scale = 1.f;  // weight_scale_2
  Nvfp4Layout layout = Nvfp4Layout::kLinear;
  int64_t n = 0, k = 0;      // logical shape of the dequantized weight
};

// Quantizes a bf16/fp32 [N,K] CPU tensor as ModelOpt does (K % 16 == 0). The overload with an
// explicit global scale lets fused gate/up weights share one scale.
Nvfp4Weight nvfp4_quantize(const Tensor& w);
Nvfp4Weight nvfp4_quantize(const Tensor& w, float global_scale);
float nvfp4_global_scale_for(const Tensor& w);  // amax(|w|) / (6 * 448), 1.0 for all-zero
// Dequantizes a kLinear weight to fp32 [N,K] on the CPU.
Tensor nvfp4_dequantize(const Nvfp4Weight& w);
// An uninitialized kLinear N x K weight on the CPU, for its codes and scales to be filled in: K / 2
// code bytes and K / 16 scales per row (rounded down; only K % 16 == 0 is a valid weight, which
// the ops check, so tests can also build malformed ones).
Nvfp4Weight nvfp4_empty(int64_t n, int64_t k, float global_scale);
// Rows [n0, n1) of a kLinear weight, as views (the shard a partition owns).
Nvfp4Weight nvfp4_rows(const Nvfp4Weight& w, int64_t n0, int64_t n1);
// Moves a kLinear weight to `device` in the layout that device's kernel wants. On the CPU the
// layout stays kLinear: a weight that owns its whole storage in `domain` is returned as is, a view
// (e.g. an nvfp4_rows shard) or a weight of another domain is copied into `domain`'s memory.
Nvfp4Weight nvfp4_prepare(const Nvfp4Weight& w, Device device, int domain = -1);

// y[M,N] = x[M,K] * dequant(w)^T (+ bias[N]); x bf16, y bf16 or fp32 (may be a column slice).
// Never in place: y must not overlap x.
void nvfp4_gemm(const Tensor& x, const Nvfp4Weight& w, const Tensor& bias, const Tensor& y,
                const Stream& stream = {});
// Fused SwiGLU for an NVFP4 FUSED_GATE_UP weight [2I, K] -> y [M, I].
void nvfp4_gemm_swiglu(const Tensor& x, const Nvfp4Weight& w_gate_up, const Tensor& y,
                       const Stream& stream = {});

}  // namespace locus::ops
