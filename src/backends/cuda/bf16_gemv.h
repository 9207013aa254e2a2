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

#include "backends/cuda/gemv_domain_plan.h"  // kGemvMaxParts, kGemvMaxDomains

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

// ---- the domain-aware form: a partitioned GEMM's shards in ONE launch (gemm_partitioned) ----

// One shard: `rows` weight rows (row stride w_ld) that produce output columns [col0, col0 + rows),
// owned by domain `domain`.
struct Bf16GemvPart {
  const void* w = nullptr;
  int64_t w_ld = 0, rows = 0, col0 = 0;
  int32_t domain = 0;
};

// The shards' product into one output: `common` holds x, the bias (indexed by output column),
// alpha, y (column 0), its leading dimension and type, m and k (its w, w_ld and n are unused).
// sm_domain: the %smid -> domain table of the partitions (domain_table.h); nullptr makes every
// SM domain 0 (the others' work is then taken by stealing).
struct Bf16GemvDomainArgs {
  Bf16GemvArgs common;
  Bf16GemvPart parts[kGemvMaxParts];
  int32_t num_parts = 0, num_domains = 1;
  const uint8_t* sm_domain = nullptr;
};

// Whether the domain-aware kernel takes the problem: what bf16_gemv_eligible asks of each part,
// 1..kGemvMaxParts parts with domains below num_domains <= kGemvMaxDomains.
bool bf16_gemv_domains_eligible(const Bf16GemvDomainArgs& a);
// Enqueues the product on `stream` as one launch: persistent CTAs take blocks of rows (the
// one-weight kernel's blocks, so every output has the bits that kernel gives it at the same block
// shape) from their SM's domain first, then from the others, through per-domain counters that
// the launch leaves at zero (graph replays need no reset). The problem must be eligible.
void launch_bf16_gemv_domains(const Bf16GemvDomainArgs& a, cudaStream_t stream);

}  // namespace locus::cuda::detail
