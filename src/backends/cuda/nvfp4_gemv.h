// Internal to the CUDA backend: the NVFP4 weight-only GEMM for decode (M <= kNvfp4GemvMaxM
// tokens) as a matrix-vector kernel: y[M, N] = x[M, K] W^T (+ bias, or SwiGLU of a fused gate/up
// weight), W in the kCudaTiled layout (nvfp4_layout.h). At decode M the product is a stream of
// weight bytes, so the kernel spends as few instructions per byte as it can: each lane loads its
// own 16 bytes of a tile chunk straight into registers (the layout puts them in mma A-fragment
// order), two batches in flight, dequantizes them exactly and multiplies on tensor cores
// (mma.sync m16n8k16, tokens on the n side). No shared-memory ring, no stream-K units, no
// workspace: a CTA of 8 warps owns a block of row tiles, its warps split K, and the sums are
// added in one fixed order (the same bits on every call). The first weights are loaded before
// the kernel waits for the previous one (programmatic dependent launch), except for products by
// id, whose ids that kernel writes.
// cuda::nvfp4_gemm / nvfp4_gemm_swiglu and the by-id products of a MoE decode
// (nvfp4_gemm_indexed) time it against the streaming kernel (stream_gemm.h) once per problem
// and keep the faster.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/cuda/cta_trace.h"
#include "backends/cuda/gemv_domain_plan.h"  // kGemvMaxParts, kGemvMaxDomains
#include "backends/cuda/stream_gemm.h"       // StreamWeightRef

namespace locus::ops {
struct Nvfp4Weight;
}
namespace locus::cuda {
struct DomainSlice;
}

namespace locus::cuda::detail {

constexpr int64_t kNvfp4GemvMaxM = 16;
constexpr int kNvfp4GemvMaxProducts = 8;

// One by-id product of a launch (ops::nvfp4_gemm_indexed): entry b < entries is one token's row,
// y row b (at y_offset + b y_ld elements of Nvfp4GemvArgs::y) = x row b / x_entry_div times
// table[ids[b]]^T. The ids are read on the device after the previous kernel in the stream has
// finished; an id outside [0, count) gives the entry a row of zeros.
struct Nvfp4GemvIndexed {
  const StreamWeightRef* table = nullptr;
  const int32_t* ids = nullptr;
  int32_t count = 0, entries = 0, x_entry_div = 1;
  const uint16_t* x = nullptr;  // bf16 rows of K, 16-byte aligned, row stride x_ld (elements)
  int64_t x_ld = 0;
  int64_t y_offset = 0, y_ld = 0;
};

struct Nvfp4GemvArgs {
  const uint16_t* x = nullptr;  // bf16 [m, k], rows 16-byte aligned, row stride x_ld (elements)
  int64_t x_ld = 0;
  const uint8_t* codes = nullptr;      // the prepared weight's codes (kCudaTiled)
  const uint16_t* scales = nullptr;    // its scale codes
  const float* global_scale = nullptr;  // device pointer (rewritten by in-place reloads)
  const void* bias = nullptr;           // [n] bf16 or fp32 (bias_f32), or nullptr; not with SwiGLU
  bool bias_f32 = false;
  bool swiglu = false;  // the weight is [2n, k]: gate rows, then up rows from row n (n % 16 == 0)
  void* y = nullptr;    // [m, n] bf16 or fp32 (y_f32), row stride y_ld
  int64_t y_ld = 0;
  bool y_f32 = false;
  int64_t m = 0, n = 0, k = 0;  // n: output columns
  // By-id products (num_indexed > 0): x, x_ld, codes, scales, global_scale and m are unused, every
  // product has this n, k, SwiGLU and y type; no bias.
  int32_t num_indexed = 0;
  Nvfp4GemvIndexed indexed[kNvfp4GemvMaxProducts];
  // A timeline of the CTAs (one weight, and the domain-aware launch), for
  // cuda_gemv_timeline_bench; off (null) unless a benchmark sets it.
  CtaTrace trace;
};
// The words of a traced CTA's record.
enum Nvfp4GemvTraceWord {
  kGemvTraceStart = kCtaTraceStart,  // its first instruction
  kGemvTraceWaited,                  // its wait for the previous kernel returned
  kGemvTraceUnit,                    // its first block known (domain-aware: the counters' first answer)
  kGemvTraceBody,                    // its last block's outputs written
  kGemvTraceExit,                    // it leaves (domain-aware: after the counters' last refusal)
  kGemvTraceWords
};

// CTAs an SM the kernels' launch bounds promise, by blocks of 8 tokens, tiles a warp and form:
// three where the registers allow 80 a thread (one tile and one block of tokens, or the lean
// form), else two.
__host__ __device__ constexpr int nvfp4_gemv_resident_ctas(int mb, int tw, bool lean = false) {
  return lean || mb * tw == 1 ? 3 : 2;
}

// The arguments of y = x w^T (+ bias; with swiglu, SwiGLU of w's gate and up halves) for
// tensors on the device: x bf16 [m, k], w prepared (kCudaTiled), y bf16/fp32 [m, n] rows of unit
// column stride, bias [n] or undefined. Not checked: nvfp4_gemv_eligible says whether the
// kernel takes them.
Nvfp4GemvArgs nvfp4_gemv_args(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y,
                              bool swiglu);

// Whether the kernel takes the problem: 1 <= m <= kNvfp4GemvMaxM, k a positive multiple of 16,
// x's rows 16-byte aligned, with SwiGLU n a multiple of 16 (the up rows start on a tile); by-id
// products: 1..kNvfp4GemvMaxProducts of them, each with entries and aligned rows.
bool nvfp4_gemv_eligible(const Nvfp4GemvArgs& a);

// The block shape a launch takes: `tiles_per_warp` 16-row tiles a warp streams side by side (they
// share its activation loads; with SwiGLU always 2: a gate tile and its up tile) and
// `warps_per_slot` warps that split K of one such slot (8 / warps_per_slot slots a CTA).
// `lean` (only with two blocks of tokens, one tile a warp, no SwiGLU: nvfp4_gemv_lean_fits): each
// chunk's activations are loaded just before its products, so a thread fits 80 registers and an
// SM holds 3 CTAs instead of 2. Each warp then waits on its activation loads, but more warps
// stream: faster where the extra CTAs fill waves that 2 an SM would leave part empty (the
// thirty-first session's sweep: 18432 x 7168 and 24576 x 1536 at 16 tokens), slower where 2 an
// SM already fill them.
struct Nvfp4GemvShape {
  int tiles_per_warp = 1;
  int warps_per_slot = 8;
  bool lean = false;
};
// Whether the lean form takes the problem: two blocks of tokens (9-16), one weight, no SwiGLU.
bool nvfp4_gemv_lean_fits(const Nvfp4GemvArgs& a);
// The shape a launch takes when none is given, for a problem on `sms` SMs.
// One weight (or the domain-aware launch's shards), one block of tokens (1-8), no SwiGLU: of the
// one-wave shapes (every CTA resident at once; two tiles a warp or one, 1-8 warps a slot) the one
// whose busiest SM streams the fewest tiles (its CTAs, ceil(CTAs / SMs), times each one's tiles);
// a tie goes to two tiles a warp, then to more warps a slot. In the thirty-eighth session's sweep
// (H100) that is the fastest shape, or within 0.3 us of it, on the seven benchmark shapes at 1 and
// 8 tokens (4096 x 7168: two tiles, 8.1-8.2 us against 8.7-9.0 in the fuller waves of one tile;
// 18432 x 7168: 288 one-wave CTAs, 28.8-30.3 us against 29.9-30.8 in 1152 short ones); the
// domain-aware launch in the same blocks ran 0.3-2.7 us faster there (18432 x 7168 at 8 tokens
// 32.9-33.0 -> 30.3-30.4 us) and its outputs keep the one-weight kernel's bits.
// Otherwise, and where no shape fits one wave, the candidates are: per tile count a warp (2, whose
// activation loads serve two tiles, and 1; SwiGLU: 2) the most warps a slot whose CTAs are all
// resident at once, and the many short CTAs of nvfp4_gemv_short_shape (waves that the block
// scheduler balances). It takes the one whose waves are fullest (CTAs over resident CTAs, over
// whole waves; a tie goes to two tiles a warp): the fastest shape, or within 7 % of it (4 % in all
// but 3 of 63 cells), in the twenty-ninth session's three sweeps (docs/benchmarks.md), and at 16
// tokens the fastest in the thirty-eighth's. With `allow_lean` and where the lean form fits, one
// tile a warp in that form (short CTAs or one wave, at 3 CTAs an SM) then wins at strictly fuller
// waves. A forced shape (set_nvfp4_gemv_shape) wins; its lean flag is dropped where the form does
// not fit.
Nvfp4GemvShape nvfp4_gemv_shape(const Nvfp4GemvArgs& a, int sms, bool allow_lean = true);
// Warps split K so that each warp's part is about 8 tile chunks long (two batches in flight,
// then two more).
Nvfp4GemvShape nvfp4_gemv_short_shape(const Nvfp4GemvArgs& a, int tiles_per_warp);
// Forces a shape for the launches that follow ({0, 0}: the built-in choice again), for benchmarks
// and tests.
void set_nvfp4_gemv_shape(Nvfp4GemvShape forced);

// Blocks of 8 tokens a launch multiplies at once (a by-id entry is one token).
int nvfp4_gemv_token_blocks(const Nvfp4GemvArgs& a);
// CTA blocks of one weight's product in `shape` (8 / warps_per_slot slots a block).
int64_t nvfp4_gemv_blocks(const Nvfp4GemvArgs& a, Nvfp4GemvShape shape);

// Enqueues the product on `stream` in `shape` (by default nvfp4_gemv_shape's); the problem must
// be eligible.
void launch_nvfp4_gemv(const Nvfp4GemvArgs& a, cudaStream_t stream);
void launch_nvfp4_gemv(const Nvfp4GemvArgs& a, Nvfp4GemvShape shape, cudaStream_t stream);

// Runs, on `stream`, the faster (timed once per problem, path_choice.h) of `streaming` (the op's
// launch of the streaming kernel, the untimed choice inside a capture) and the kernel. The
// problem must be eligible.
void run_nvfp4_gemv_fastest(const Nvfp4GemvArgs& a, const std::function<void(cudaStream_t)>& streaming,
                            cudaStream_t stream);

// While on, run_nvfp4_gemv_fastest launches the kernel (in nvfp4_gemv_shape's shape) without
// timing or remembering anything: tests and benchmarks reach it through the ops so.
void set_nvfp4_gemv_always(bool on);
bool nvfp4_gemv_always();

// The paths of a partitioned NVFP4 op at decode M (cuda::nvfp4_gemm_partitioned_fastest): the
// faster as timed, the streaming kernel's one domain-aware launch, the fork/join of
// per-partition ops, or this kernel's domain-aware launch (launch_nvfp4_gemv_domains). Tests and
// benchmarks force one; where it does not take the problem, the fork/join runs.
enum class Nvfp4PartitionedPath { kTimed, kStreamingLaunch, kForkJoin, kMatrixVectorLaunch };
void set_nvfp4_partitioned_path(Nvfp4PartitionedPath path);
Nvfp4PartitionedPath nvfp4_partitioned_path();

// Whether cuda::nvfp4_gemm may take the kernel (timed against the streaming kernel): on unless
// LOCUS_NVFP4_GEMV=0; set_nvfp4_gemv_enabled (cuda_ops.h) overrides it.
bool nvfp4_gemv_enabled();
// The path choice's key: what decides which path is faster (shape, strides, types, SwiGLU, the
// SMs of a partition stream).
std::string nvfp4_gemv_problem_key(const Nvfp4GemvArgs& a, cudaStream_t stream);

// ---- the domain-aware form: a partitioned NVFP4 op's shards in one launch ----

// One shard: a prepared weight (kCudaTiled) whose n output columns (SwiGLU: 2n rows, gate then
// up) are columns [col0, col0 + n) of y and of the bias, owned by domain `domain`.
struct Nvfp4GemvPart {
  const uint8_t* codes = nullptr;
  const uint16_t* scales = nullptr;
  const float* global_scale = nullptr;
  int64_t n = 0, col0 = 0;
  int32_t domain = 0;
};

// The shards' product into one output: `common` holds x, the bias (by output column), SwiGLU, y
// (column 0), its leading dimension and type, m and k (its weight fields, n and by-id products
// are unused). sm_domain: the %smid -> domain table of the partitions (domain_table.h); nullptr
// makes every SM domain 0 (the others' blocks are then taken by stealing).
struct Nvfp4GemvDomainArgs {
  Nvfp4GemvArgs common;
  Nvfp4GemvPart parts[kGemvMaxParts];
  int32_t num_parts = 0, num_domains = 1;
  const uint8_t* sm_domain = nullptr;
  const uint8_t* sm_rank = nullptr;  // %smid -> rank among its domain's SMs (domain_table.h), with sm_domain
  int32_t domain_sms[kGemvMaxDomains] = {};
};

// Whether the domain-aware kernel takes the problem: what nvfp4_gemv_eligible asks of each part
// as a product of its own, 1..kGemvMaxParts parts with domains below num_domains <= kGemvMaxDomains.
bool nvfp4_gemv_domains_eligible(const Nvfp4GemvDomainArgs& a);
// Enqueues the product on `stream` as one launch: persistent CTAs take the one-weight kernel's
// blocks (so every output has the bits that kernel gives it in the same block shape) from their
// SM's domain first, then from the others. In the forms of 1-8 tokens with two tiles a warp (no
// SwiGLU), where every domain's blocks fit its SMs' CTA slots and the domains' SM tables are set
// (sm_rank, domain_sms), each CTA claims its SM's block before the previous kernel ends and asks
// for its weights at once (unit_claims.cuh; *claims set true); otherwise the blocks come from
// per-domain counters that the launch leaves at zero. The block shape is nvfp4_gemv_shape's for
// all the parts' columns on the whole device. The problem must be eligible.
void launch_nvfp4_gemv_domains(const Nvfp4GemvDomainArgs& a, cudaStream_t stream, bool* claims = nullptr);
// The arguments of the partitioned y = x [shards]^T (+ bias; with swiglu each shard is [gate
// rows; up rows] of its slice) on the domains of `slices` (shard p makes y's columns
// [n0, n1) of slices[p]); false where the kernel does not take them.
bool nvfp4_gemv_domain_args(const Tensor& x, const std::vector<ops::Nvfp4Weight>& shards, const Tensor& bias,
                            const Tensor& y, bool swiglu, const std::vector<DomainSlice>& slices,
                            Nvfp4GemvDomainArgs* a);
// Whether launch_nvfp4_gemv_domains lets its CTAs claim their blocks by SM rank where it can
// (unit_claims.cuh) instead of asking per-domain counters (LOCUS_NVFP4_GEMV_CLAIMS, default on):
// 1 on, 0 off, negative back to the environment's setting.
void set_nvfp4_gemv_claims(int on);
// The block shape launch_nvfp4_gemv_domains takes on `sms` SMs (never the lean form).
Nvfp4GemvShape nvfp4_gemv_domains_shape(const Nvfp4GemvDomainArgs& a, int sms);

}  // namespace locus::cuda::detail
