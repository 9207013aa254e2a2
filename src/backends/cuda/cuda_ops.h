// The CUDA backend's op implementations, called by the dispatchers in src/ops/ when the tensors
// live on a CUDA device. Same contracts as the ops/ headers; `stream` is a cudaStream_t
// (nullptr = the legacy default stream). Only compiled when LOCUS_WITH_CUDA is defined.
// No CUDA header is included here, so host code in other layers can include this file.
#pragma once
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "ops/nvfp4.h"
#include "ops/nvfp4_indexed.h"
#include "ops/nvfp4_row_blocks.h"

namespace locus::cuda {

// True when a CUDA device is usable (driver present, at least one GPU). Never throws.
bool device_available();

void gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, void* stream);
// At decode M (<= 4 tokens) gemm, gemm_swiglu and the partitioned GEMMs' per-partition calls take
// the faster, timed once per problem, of cuBLASLt and our matrix-vector kernel (bf16_gemv.h).
// This turns the kernel off (cuBLASLt only) or on again for the calls that follow (benchmarks
// compare the two); the default is on unless LOCUS_BF16_GEMV=0.
void set_bf16_gemv_enabled(bool on);
void gemm_swiglu(const Tensor& x, const Tensor& w_gate_up, const Tensor& y, void* stream);
void swiglu(const Tensor& gate_up, const Tensor& y, void* stream);
void bmm(const Tensor& a, const Tensor& b, const Tensor& y, void* stream);

// Shuffles a kLinear weight into the kernel's kCudaTiled layout (nvfp4_layout.h) on the device,
// tagged with `domain`. The fp32 global scale lives in device memory after the scale array.
ops::Nvfp4Weight nvfp4_prepare(const ops::Nvfp4Weight& linear_cpu, int device_index, int domain);
// In-place reload: rewrites a prepared weight's buffers (same device pointers, so captured
// graphs use the new values, global scale included). Shapes must match.
void nvfp4_prepare_into(const ops::Nvfp4Weight& linear_cpu, const ops::Nvfp4Weight& tiled);
// A device copy of a prepared (kCudaTiled) weight, global scale included, tagged with `domain`.
ops::Nvfp4Weight nvfp4_clone(const ops::Nvfp4Weight& tiled, int domain);
// Device pointer to a prepared weight's fp32 global scale (kept after its scale array, so that
// in-place reloads rewrite it and kernels read the current value).
const float* nvfp4_global_scale_device(const ops::Nvfp4Weight& tiled);
// NVFP4 GEMM: for M <= kNvfp4StreamMaxM the weight-streaming kernel (stream_gemm.h) or, where
// detail::nvfp4_use_wgmma says so, the wgmma decode-batch kernel (nvfp4_wgmma.h), else the weight
// dequantized to BF16 in stream-ordered scratch and cuBLASLt (exact: the global scale is the
// matmul's alpha, read on the device, so in-place reloads reach captured graphs too).
constexpr int64_t kNvfp4StreamMaxM = 64;
void nvfp4_gemm(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y, void* stream);
void nvfp4_gemm_swiglu(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& y, void* stream);
// At decode M (<= 16 tokens) nvfp4_gemm and nvfp4_gemm_swiglu take the faster, timed once per
// problem, of the streaming kernel and our NVFP4 matrix-vector kernel (nvfp4_gemv.h). This turns
// the latter off or on again for the calls that follow; the default is on unless
// LOCUS_NVFP4_GEMV=0.
void set_nvfp4_gemv_enabled(bool on);

// ---- the weight-streaming kernel (stream_gemm.h) and its single-launch locality-domain form ----
// Largest M for which cuda::gemm / gemm_swiglu (and the partitioned BF16 ops) use the streaming
// kernel rather than cuBLASLt; LOCUS_STREAM_GEMM_BF16_MAX_M overrides it.
int stream_gemm_bf16_max_m();
// BF16 y = x w^T (+ bias) or, with swiglu, silu(x wg^T) * (x wu^T) for w = [gate; up], by the
// streaming kernel whatever M: false (nothing launched) when the problem is outside its range
// (M > 32, unaligned rows, K % 8 != 0).
bool stream_gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, bool swiglu, void* stream);

// One partition of a partitioned op: output columns [n0, n1) from the shard of the same index,
// owned by the domain whose partition stream is `stream`.
struct DomainSlice {
  int64_t n0 = 0, n1 = 0;
  void* stream = nullptr;
};
// The partitioned GEMMs as ONE launch on `caller`: each CTA works on the shards of the domain
// its SM belongs to (the green-context partition of that stream), then steals. Output slices are
// written in place; no fork/join. False (nothing launched) when the problem is outside the
// streaming kernel's range (then the caller forks/joins per partition). With swiglu each shard
// is [gate rows; up rows] of its slice.
bool gemm_domains(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y, bool swiglu,
                  const std::vector<DomainSlice>& slices, void* caller);
// The partitioned BF16 GEMM y = x w^T (+ bias) at decode M (1..4 tokens) where our matrix-vector
// kernel's domain-aware form takes it (bf16_gemv.h: one launch, each CTA on its SM's domain's
// shards first): by the faster of that launch and `fork_join` (the caller's fork/join of
// per-partition cuda::gemm calls, from the origin stream it is given), timed once per problem
// (path_choice.h). False, with nothing run, when the kernel does not take the operands, or
// LOCUS_BF16_GEMV=0 or LOCUS_BF16_GEMV_DOMAINS=0.
bool gemm_partitioned_fastest(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y,
                              const std::vector<DomainSlice>& slices, void* caller,
                              const std::function<void(void*)>& fork_join);
// The same for the partitioned GEMM + SwiGLU (each shard [gate rows; up rows] of its slice, at
// most 4 shards): the launch writes fp32 gate/up sums to scratch, one SwiGLU kernel rounds them
// into y.
bool gemm_swiglu_partitioned_fastest(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& y,
                                     const std::vector<DomainSlice>& slices, void* caller,
                                     const std::function<void(void*)>& fork_join);
// Turns the one-launch form of the two above off (always the fork/join) or on again for the
// calls that follow (benchmarks time the fork/join alone); on unless LOCUS_BF16_GEMV_DOMAINS=0.
void set_bf16_gemv_domains_enabled(bool on);
// BMM y[h] = a[h] b[h] (ops/bmm.h shapes) by the streaming kernel, for b a transposed view of
// per-head [N, K] weights (stride(1) == 1) and M <= 32; false otherwise (nothing launched).
bool stream_bmm(const Tensor& a, const Tensor& b, const Tensor& y, void* stream);
// The BMM partitioned over heads as one domain-aware launch: slice p = heads [n0, n1) with
// weights b_shards[p] ([n1 - n0, K, N], transposed views); false when not eligible.
bool bmm_domains(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                 const std::vector<DomainSlice>& slices, void* caller);
// BMM y[h] = a[h] b[h] (ops/bmm.h shapes) by the TMA-fed decode kernel (bmm_tma.h): b row-major
// [B, K, N] or a transposed view of per-head [N, K] weights, M <= 64, K <= 512, on an sm_90 GPU;
// false (nothing launched) otherwise, or when LOCUS_BMM_TMA=0. cuda::bmm does not use it (on the
// H200 cuBLASLt is faster unpartitioned); the partitioned BMM does (bmm_partitioned_fastest).
bool bmm_tma(const Tensor& a, const Tensor& b, const Tensor& y, void* stream);
// Turns bmm_tma (and bmm_tma_domains) off or on again for the calls that follow (benchmarks
// compare it with cuBLASLt); the default is on unless LOCUS_BMM_TMA=0.
void set_bmm_tma_enabled(bool on);
// The same partitioned over heads as one domain-aware launch (slice p = heads [n0, n1) with
// weights b_shards[p], all laid out alike). Bitwise equal to bmm_tma.
bool bmm_tma_domains(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                     const std::vector<DomainSlice>& slices, void* caller);
// The partitioned BMM where bmm_tma_domains can take it: by the faster of that launch and
// `fork_join` (the caller's fork/join of per-partition cuBLASLt calls, from the origin stream it
// is given), timed once per problem (path_choice.h). False, with nothing run, when the kernel
// cannot take it.
bool bmm_partitioned_fastest(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                             const std::vector<DomainSlice>& slices, void* caller,
                             const std::function<void(void*)>& fork_join);
// NVFP4 (prepared shards), M <= kNvfp4StreamMaxM, by the streaming or the wgmma kernel (as
// nvfp4_gemm chooses); false when M is larger or a fused gate/up shard's up rows do not start on
// a 16-row tile.
bool nvfp4_gemm_domains(const Tensor& x, const std::vector<ops::Nvfp4Weight>& shards, const Tensor& bias,
                        const Tensor& y, bool swiglu, const std::vector<DomainSlice>& slices, void* caller);
// The partitioned NVFP4 GEMM (or GEMM + SwiGLU) at decode M (<= 16 tokens): the fastest, timed
// once per problem (path_choice.h), of the streaming kernel's one domain-aware launch
// (nvfp4_gemm_domains), `fork_join` (the caller's fork/join of per-partition nvfp4_gemm calls,
// each of which times the matrix-vector kernel on its partition, from the origin stream it is
// given) and the matrix-vector kernel's one domain-aware launch (launch_nvfp4_gemv_domains, where
// it takes the shards); detail::set_nvfp4_partitioned_path forces one. False, with nothing run,
// at M = 0 or above 16, or with LOCUS_NVFP4_GEMV=0.
bool nvfp4_gemm_partitioned_fastest(const Tensor& x, const std::vector<ops::Nvfp4Weight>& shards, const Tensor& bias,
                                    const Tensor& y, bool swiglu, const std::vector<DomainSlice>& slices, void* caller,
                                    const std::function<void(void*)>& fork_join);
// ops::nvfp4_gemm_row_blocks's shared launches: blocks of one row count (at most 32, below the
// wgmma kernel's range) go to the streaming kernel together, up to kStreamGemmMaxParts weights
// per launch, each weight with its own activation and output rows. Returns the blocks with rows
// that it did not launch (a row count no other block has, a weight it does not take), for the
// caller to run one by one. While nvfp4_row_block_launches() is false it launches nothing: on by
// default (an H200 decoded 16-23% faster at DeepSeek-V3's widths, docs/benchmarks.md);
// LOCUS_NVFP4_ROW_BLOCKS=0 or the setter turns it off.
std::vector<size_t> nvfp4_gemm_row_blocks(const Tensor& x, const std::vector<ops::Nvfp4RowBlock>& blocks,
                                          const Tensor& y, bool swiglu, void* stream);
// A device table of prepared (kCudaTiled) weights' buffers, in order (detail::StreamWeightRef
// each): what ops::Nvfp4WeightSet hands the indexed kernel.
Tensor nvfp4_weight_table(const std::vector<const ops::Nvfp4Weight*>& weights);
// ops::nvfp4_gemm_indexed (operands checked there): one launch of the streaming kernel, one
// batched part per product whose entry t*k + j reads its x row t and looks weight ids[t, j] up
// in its set's table.
void nvfp4_gemm_indexed(const std::vector<ops::Nvfp4IndexedProduct>& products, bool swiglu, void* stream);
bool nvfp4_row_block_launches();
void set_nvfp4_row_block_launches(bool on);

// Fork/join across streams with events (capture-safe: stream events, never green-context events).
// fork: every stream in `targets` waits for the work queued so far on `origin`.
// join: `origin` waits for the work queued so far on every stream in `targets`.
void fork_streams(void* origin, const std::vector<void*>& targets);
void join_streams(void* origin, const std::vector<void*>& targets);
// The device's side stream (ops::SideStream): non-blocking, made on first use (in relaxed capture
// mode, so a first use inside a capture is legal), kept for the process.
void* side_stream(int device_index);

}  // namespace locus::cuda
