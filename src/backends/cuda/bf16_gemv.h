// Internal to the CUDA backend: the BF16 matrix-vector kernel for decode (M <= kBf16GemvMaxM
// tokens), y[M, N] = alpha * x[M, K] w[N, K]^T (+ bias). At decode M the product reads each
// weight byte once and does a few flops on it, so its speed is the weight stream's: the kernel
// keeps every SM's loads in flight, starts them before the previous kernel ends (programmatic
// dependent launch: the weights do not depend on it) and needs no split-K workspace, memset or
// reduce kernel. Each output is reduced in one fixed order: the same bits on every call.
// cuda::gemm times it against cuBLASLt once per problem (cuda_ops.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace locus::cuda::detail {

constexpr int64_t kBf16GemvMaxM = 4;

struct Bf16GemvArgs {
  const void* x = nullptr;  // bf16 [m, k], row stride x_ld (elements)
  int64_t x_ld = 0;
  const void* w = nullptr;  // bf16 [n, k], row stride w_ld
  int64_t w_ld = 0;
  const void* bias = nullptr;  // [n] bf16 or fp32 (bias_f32), or nullptr
  bool bias_f32 = false;
  const float* alpha = nullptr;  // device scalar multiplying the product, or nullptr (1)
  void* y = nullptr;             // [m, n] bf16 or fp32 (y_f32), row stride y_ld
  int64_t y_ld = 0;
  bool y_f32 = false;
  int64_t m = 0, n = 0, k = 0;
};

// Whether the kernel takes the problem: 1 <= m <= kBf16GemvMaxM, k a multiple of 8 and x's and
// w's rows 16-byte aligned (every load is a 16-byte vector).
bool bf16_gemv_eligible(const Bf16GemvArgs& a);
// Row slots one CTA reduces (its 8 warps split K among them), for n slots of k on `sms` SMs:
// enough CTAs to fill the GPU, each warp's part of a slot a few 16-byte loads per lane.
int bf16_gemv_slots_per_cta(int64_t n, int64_t k, int sms);
// Rows a slot holds at m tokens: 2 from m = 2 on (one warp's activation loads serve both; their
// cost per weight byte grows with m), else 1. LOCUS_BF16_GEMV_ROW_PAIRS=0: always 1.
int bf16_gemv_rows_per_warp(int64_t m);
// Two rows a warp from m = 2 on (1), one row always (0), or back to the environment's (negative),
// for tests and benchmarks.
void set_bf16_gemv_row_pairs(int on);
// Enqueues the product on `stream`; the problem must be eligible.
void launch_bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream);

// Whether cuda::gemm may take the kernel (timed against cuBLASLt): on unless LOCUS_BF16_GEMV=0;
// set_bf16_gemv_enabled (cuda_ops.h) overrides it.
bool bf16_gemv_enabled();
// The path choice's key for a problem on `stream`: what decides which path is faster (shape,
// strides, output and bias types, alpha, the SMs of a partition stream).
std::string bf16_gemv_problem_key(const Bf16GemvArgs& a, cudaStream_t stream);

}  // namespace locus::cuda::detail
