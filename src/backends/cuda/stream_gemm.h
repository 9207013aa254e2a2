// Internal to the CUDA backend: the weight-streaming GEMM for skinny activations (decode, M <= 32),
// y[M, N] = x[M, K] W^T, with W in BF16 (row-major) or NVFP4 (kCudaTiled, nvfp4_layout.h), and
// its locality-domain form: ONE launch over the whole GPU in which every CTA reads the SM it runs
// on, maps it to a domain (a %smid -> domain table built from the green-context partitions) and
// takes work from that domain's weight shards first ("own queue first, then steal"), writing its
// output columns in place. So a partitioned op costs no fork/join and no second launch, and the
// result never depends on where the CTAs land.
//
// Work decomposition. Each weight part (the whole weight, or one domain's shard; for BMM a batch
// of per-head weights) is cut into row groups of four 16-row tiles (64 rows), streamed in chunks
// of 64 K (NVFP4 from its pre-shuffled layout, BF16 from its rows, 128 bytes of each); with
// SwiGLU a group has two halves (its gate rows and the matching up rows). A "row" of work is one
// group-half over the whole K, C chunks long. A unit of work is either one whole row (when the
// rows nearly fill the resident CTA slots in one round), or an equal contiguous range of chunks of
// the domain's rows laid end to end (about one per resident CTA: stream-K), which may end inside
// a row for the next unit to finish (it touches at most 3 rows). A CTA (W warps: 8, or 4 where 8
// fit only one CTA per SM) takes one unit at a time from its domain's atomic counter; each warp
// streams a contiguous 1/W of the unit's chunks through its own cp.async shared-memory ring,
// across row boundaries, into mma.sync m16n8k16 (tokens on the n side; NVFP4 dequantized exactly
// in registers) and leaves each row's sums in shared memory; then, for each row segment of the
// unit, the warps' sums are added in warp order and
//   - the segment is the whole row and there is no SwiGLU: the CTA writes the outputs directly;
//   - else: it stores its fp32 partial, and the group's last segment (an atomic count) adds the
//     partials in segment order (deterministic), applies scale/bias/SwiGLU and writes y.
// Counters are reset by the kernel itself, so graph replays need no memset. The kernel is launched
// as a programmatic dependent launch: its CTAs may start while the previous kernel in the stream
// drains, ask L2 for their first weights, and wait for that kernel before reading anything else.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backends/cuda/cta_trace.h"

namespace locus {
class Tensor;
}

namespace locus::cuda::detail {

constexpr int kStreamGemmMaxParts = 8;
constexpr int kStreamGemmMaxDomains = 8;
constexpr int kStreamGemmMaxM = 32;
constexpr uint8_t kNoDomain = 0xFF;

enum class StreamWeight : uint8_t { kBF16, kNVFP4 };

// One NVFP4 weight of a table that a batched part indexes on the device (StreamGemmPart::weight_ids).
struct StreamWeightRef {
  const void* w = nullptr;
  const uint16_t* scales = nullptr;
  const float* global_scale = nullptr;
};

// One weight, or one domain's shard of it, and the outputs it produces. A part may be a batch of
// weights (BMM: one per head), each with its own activations and output rows.
struct StreamGemmPart {
  const void* w = nullptr;              // BF16: row-major rows of `ldw` elements; NVFP4: the tiles
  const uint16_t* scales = nullptr;     // NVFP4: per-lane scale codes (nvfp4_layout.h)
  const float* global_scale = nullptr;  // NVFP4: device pointer (rewritten by in-place reloads)
  int64_t ldw = 0;                      // BF16: row stride in elements
  int64_t up_offset = 0;                // SwiGLU: BF16 row / NVFP4 row-tile where the up rows start
  const void* bias = nullptr;           // bias of this part's columns (bf16 or fp32), or nullptr
  const uint16_t* x = nullptr;          // its activations (nullptr: StreamGemmArgs::x)
  int64_t y_offset = 0;                 // element offset of its output column 0 in y (row 0, batch 0)
  int32_t rows = 0;                     // output columns of this part (gate rows with SwiGLU)
  int32_t batch = 1;                    // BF16 only: weights at w + b * w_batch_stride, b < batch,
  int64_t w_batch_stride = 0;           //   activations at x + b * x_batch_stride,
  int64_t x_batch_stride = 0;           //   outputs at y + y_offset + b * y_batch_stride (elements)
  int64_t y_batch_stride = 0;
  // NVFP4 batched (MoE decode: which expert each (token, choice) slot takes is known only on the
  // device): entry b streams weight_table[weight_ids[b]], read by the kernel after the previous
  // kernel in the stream has finished (w, scales, global_scale unused); every weight of the table
  // has this part's shape. An id outside [0, weight_count) gives the entry zero outputs (it reads
  // entry 0 at scale 0). Entry b reads activation entry b / x_entry_div (each token's k slots
  // share its row).
  const StreamWeightRef* weight_table = nullptr;
  const int32_t* weight_ids = nullptr;
  int32_t weight_count = 0;
  int32_t x_entry_div = 1;
  int32_t domain = 0;                   // the domain whose SMs own it
  // Filled by launch_stream_gemm:
  int32_t tiles = 0;                    // ceil(rows / 16) per batch entry
  int32_t groups = 0;                   // row groups (several tiles streamed together) per batch entry
  int32_t row_begin = 0;                // its first row in its domain's rows
  int32_t group_base = 0;               // its first row-group counter
  int32_t slot_row_base = 0;            // its first row in the partial slots (all parts' rows)
};

struct StreamGemmArgs {
  StreamWeight format = StreamWeight::kBF16;
  bool swiglu = false;
  bool bias_f32 = false;
  bool y_f32 = false;
  const uint16_t* x = nullptr;  // bf16 [m, k], rows 16-byte aligned (parts may override it)
  int64_t x_ld = 0;
  int32_t m = 0;
  int64_t k = 0;
  void* y = nullptr;            // bf16 or fp32 rows of y_ld elements
  int64_t y_ld = 0;
  int32_t num_parts = 0;
  StreamGemmPart parts[kStreamGemmMaxParts];
  // SM id -> domain (kNoDomain for SMs outside every domain), 1024 entries in device memory;
  // nullptr: every SM belongs to domain 0.
  const uint8_t* sm_domain = nullptr;
  int32_t num_domains = 1;
};

// Whether a pointer is 16-byte aligned (what the weight kernels' 16-byte copies need).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Throws, naming `kernel`, unless `a` has 1..kStreamGemmMaxParts well-formed parts over
// 1..kStreamGemmMaxDomains domains (NVFP4 parts: unbatched, with scales).
void check_stream_gemm_parts(const StreamGemmArgs& a, const char* kernel);

// Arguments with x [M, K] (bf16 rows, on the GPU), y [M, N] (bf16 or fp32 rows), SwiGLU and the
// bias's dtype filled in (stream_gemm_ops.cpp); the parts are the caller's to add.
StreamGemmArgs stream_gemm_args(StreamWeight format, const Tensor& x, const Tensor& y, bool swiglu,
                                const Tensor& bias);

// True when the streaming kernel takes this problem: 1 <= m <= kStreamGemmMaxM, x rows
// 16-byte aligned; BF16 weights also need K % 8 == 0 and 16-byte aligned rows.
bool stream_gemm_eligible(const StreamGemmArgs& a);
// Launches on `stream` (capturable: per-stream scratch is allocated on first use, in relaxed
// capture mode, and reused). Throws on invalid arguments.
void launch_stream_gemm(StreamGemmArgs& a, cudaStream_t stream);

// Tuning knobs for benchmarks (0 = the built-in heuristic).
struct StreamGemmTuning {
  int units_per_cta = 0;  // 0: the heuristic; > 0: the stream-K cut with this many units per
                          // resident CTA; < 0: whole rows as units
  int warps = 0;          // warps per CTA: 0 the heuristic, else 4 or 8 (feed = 1: consumer warps,
                          // 8 or 16; 16 leaves no room for the next launch's CTA beside)
  int stages = 0;         // ring depth per warp: 0 the heuristic, else 2..4 (2..6 with feed = 1)
  int dependent_launch = 1;  // 1: programmatic dependent launch (start during the previous
                             // kernel's tail, prefetching weights); 0: plain stream order
  int prefetch_kb = 0;  // before the previous kernel ends, ask L2 for this many KB of the CTA's
                        // first unit (0: the built-in amount)
  // How chunks reach shared memory: 0 per-warp cp.async rings; 1 (NVFP4, M <= 16; else 0) a
  // TMA producer warp, one CTA per SM in at most half of its memory, so that the next
  // launch's CTAs sit beside the running ones and fill their rings before it ends
  // (stream_gemm_tma_kernel.cu). `stages` is then each consumer warp's ring depth, 2..6, and
  // `prefetch_kb` what a CTA asks L2 for beyond its rings' early stages (default none).
  int feed = 0;
  CtaTrace trace;  // a timeline of the launches (bench/cuda/stream_timeline_bench.cpp), or off
};
// The words of a CTA's timeline record (times of its last unit where it takes several).
enum StreamTraceWord {
  kStreamTraceStart = kCtaTraceStart,  // its first instruction
  kStreamTraceWaited,    // its wait for the previous kernel returned
  kStreamTraceFirst,     // warp 0's first chunk landed in its ring
  kStreamTraceStreamed,  // every warp has streamed its share of the unit
  kStreamTraceEnd,       // the unit's outputs (or partials) are written
  kStreamTraceWords
};
void set_stream_gemm_tuning(const StreamGemmTuning& t);
// Launches so far of each feed (StreamGemmTuning::feed: 0 or 1), so that tests can tell which
// kernel ran.
uint64_t stream_gemm_feed_launches(int feed);

}  // namespace locus::cuda::detail
