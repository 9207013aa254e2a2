// Internal to the CUDA backend: the BF16 matrix-vector kernels for decode (a few tokens),
// y[M, N] = alpha * x[M, K] w[N, K]^T (+ bias). At decode M the product reads each weight byte
// once and does a few flops on it, so its speed is the weight stream's: the kernels keep every
// SM's loads in flight, start them before the previous kernel ends (programmatic dependent
// launch: the weights do not depend on it) and need no split-K workspace, memset or reduce
// kernel. Each output is reduced in one fixed order: the same bits on every call. Two kernels:
// - on CUDA cores (bf16_gemv_kernel.cu), M <= kBf16GemvMaxM: a warp per row, fp32 FMAs; its
//   instructions per weight byte grow with M;
// - on tensor cores (bf16_gemv_mma_kernel.cu), M <= kBf16GemvMmaMaxM: a warp per 16 rows,
//   mma.sync with the tokens as the n side; the same instructions for any M up to 8.
// cuda::gemm times both against cuBLASLt once per problem (cuda_ops.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace locus::cuda::detail {

constexpr int64_t kBf16GemvMaxM = 4;
constexpr int64_t kBf16GemvMmaMaxM = 8;

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
// Weight rows one CTA reduces (its 8 warps split K among them), for n rows of k on `sms` SMs:
// enough CTAs to fill the GPU, each warp's part of a row a few 16-byte loads per lane.
int bf16_gemv_rows_per_cta(int64_t n, int64_t k, int sms);
// Enqueues the product on `stream`; the problem must be eligible.
void launch_bf16_gemv(const Bf16GemvArgs& a, cudaStream_t stream);

// The tensor-core kernel: 1 <= m <= kBf16GemvMmaMaxM, k a multiple of 64, rows 16-byte aligned.
bool bf16_gemv_mma_eligible(const Bf16GemvArgs& a);
// Groups of 16 rows one CTA takes (its 8 warps split each group's K among them).
int bf16_gemv_mma_row_groups(int64_t n, int64_t k, int sms);
void launch_bf16_gemv_mma(const Bf16GemvArgs& a, cudaStream_t stream);

// Whether cuda::gemm may take the kernels (timed against cuBLASLt): on unless LOCUS_BF16_GEMV=0;
// set_bf16_gemv_enabled (cuda_ops.h) overrides it.
bool bf16_gemv_enabled();
// The path choice's key for a problem on `stream`: what decides which path is faster (shape,
// strides, output and bias types, alpha, the SMs of a partition stream).
std::string bf16_gemv_problem_key(const Bf16GemvArgs& a, cudaStream_t stream);

}  // namespace locus::cuda::detail
