// The streaming GEMM's host side shared by its two feeds (stream_gemm_launch.h): the tuning, the
// plan of a launch's rows, occupancy, the checks, and the choice of feed.
#include "backends/cuda/stream_gemm_launch.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <tuple>
#include <mutex>
#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/stream_scratch.h"

namespace locus::cuda::detail {
namespace {

std::mutex g_tuning_mu;
StreamGemmTuning g_tuning;  // benchmarks and tests set it between launches
std::atomic<uint64_t> g_feed_launches[2];

// The tuning in force (the built-in heuristics where a field is 0), read once per launch.
StreamGemmTuning stream_gemm_tuning() {
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  return g_tuning;
}

}  // namespace

void set_stream_gemm_tuning(const StreamGemmTuning& t) {
  LOCUS_CHECK(t.feed == 0 || t.feed == 1, "streaming GEMM: feed ", t.feed, " (0: cp.async rings, 1: TMA producer)");
  LOCUS_CHECK(t.warps == 0 || t.warps == kWideWarps || (t.feed == 0 && t.warps == kNarrowWarps) ||
                  (t.feed == 1 && t.warps == 2 * kWideWarps),
              "streaming GEMM: ", t.warps, " warps per CTA with feed ", t.feed, " (0, ", kNarrowWarps, " or ",
              kWideWarps, " with the cp.async rings; 0, ", kWideWarps, " or ", 2 * kWideWarps,
              " consumer warps with the TMA producer)");
  const int max_stages = t.feed == 1 ? kStreamTmaMaxStages : kStreamRingMaxStages;
  LOCUS_CHECK(t.stages == 0 || (t.stages >= 2 && t.stages <= max_stages), "streaming GEMM: ring depth ", t.stages,
              " (0, or 2..", max_stages, " with feed ", t.feed,
              "; deeper cp.async rings were slower: docs/benchmarks.md, tenth session)");
  LOCUS_CHECK(t.prefetch_kb >= 0 && t.prefetch_kb <= (1 << 16), "streaming GEMM: prefetch of ", t.prefetch_kb,
              " KB per CTA (0..65536)");
  std::lock_guard<std::mutex> lock(g_tuning_mu);
  g_tuning = t;
}

uint64_t stream_gemm_feed_launches(int feed) { return feed == 0 || feed == 1 ? g_feed_launches[feed].load() : 0; }

StreamRows plan_stream_rows(StreamGemmArgs& a, int h, int64_t* groups_total, int64_t* rows_total) {
  constexpr int R = kStreamGroupTiles;
  StreamRows work;
  work.chunks = (a.k + kStreamChunkK - 1) / kStreamChunkK;
  work.num_domains = a.num_domains;
  *groups_total = *rows_total = 0;
  for (int i = 0; i < a.num_parts; ++i) {
    StreamGemmPart& p = a.parts[i];
    p.tiles = (p.rows + 15) / 16;
    p.groups = (p.tiles + R - 1) / R;
    const int64_t rows = static_cast<int64_t>(p.batch) * p.groups * h;
    LOCUS_CHECK(work.rows[p.domain] + rows < (1LL << 30), "streaming GEMM: too many row groups");
    p.row_begin = work.rows[p.domain];
    work.rows[p.domain] += static_cast<int32_t>(rows);
    p.group_base = static_cast<int32_t>(*groups_total);
    *groups_total += static_cast<int64_t>(p.batch) * p.groups;
    p.slot_row_base = static_cast<int32_t>(*rows_total);
    *rows_total += rows;
  }
  return work;
}

int resident_ctas_per_sm(const void* kernel, const void* traced, int threads, int smem_bytes) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int>, int> cache;  // (device, kernel, bytes) -> CTAs per SM
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({dev, kernel, smem_bytes});
  if (it != cache.end()) return it->second;
  int n = 0;
  if (smem_bytes <= max_dynamic_smem(kernel)) {
    for (const void* k : {kernel, traced}) raise_dynamic_smem_limit(k, smem_bytes);
    LOCUS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem_bytes));
  }
  cache[{dev, kernel, smem_bytes}] = n;
  return n;
}

int shared_memory_per_sm() {
  int device = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&device));
  return device_attribute(device, cudaDevAttrMaxSharedMemoryPerMultiprocessor);
}

bool stream_gemm_eligible(const StreamGemmArgs& a) {
  if (a.m < 1 || a.m > kStreamGemmMaxM || a.k < 1) return false;
  if (!aligned16(a.x) || a.x_ld % 8 != 0) return false;
  if (a.y_ld < 0) return false;
  for (int i = 0; i < a.num_parts; ++i) {
    const StreamGemmPart& p = a.parts[i];
    if (p.x && !aligned16(p.x)) return false;
    if (p.x_batch_stride % 8 != 0) return false;
  }
  if (a.format == StreamWeight::kBF16) {
    if (a.k % 8 != 0) return false;
    for (int i = 0; i < a.num_parts; ++i) {
      const StreamGemmPart& p = a.parts[i];
      if (!aligned16(p.w) || p.ldw % 8 != 0 || p.w_batch_stride % 8 != 0) return false;
    }
  } else {
    if (a.k % 16 != 0) return false;
  }
  return true;
}

void check_stream_gemm_parts(const StreamGemmArgs& a, const char* kernel) {
  LOCUS_CHECK(a.num_parts >= 1 && a.num_parts <= kStreamGemmMaxParts, kernel, ": ", a.num_parts,
              " weight parts (1..", kStreamGemmMaxParts, ")");
  LOCUS_CHECK(a.num_domains >= 1 && a.num_domains <= kStreamGemmMaxDomains, kernel, ": ", a.num_domains,
              " domains (1..", kStreamGemmMaxDomains, ")");
  for (int i = 0; i < a.num_parts; ++i) {
    const StreamGemmPart& p = a.parts[i];
    const bool indexed = p.weight_ids != nullptr;
    LOCUS_CHECK((p.w != nullptr || indexed) && p.rows >= 1 && p.batch >= 1 && p.y_offset >= 0 && p.domain >= 0 &&
                    p.domain < a.num_domains && p.x_entry_div >= 1,
                kernel, ": part ", i, " is malformed (rows ", p.rows, ", batch ", p.batch, ", domain ", p.domain,
                ", x_entry_div ", p.x_entry_div, ")");
    LOCUS_CHECK(!indexed || (a.format == StreamWeight::kNVFP4 && p.weight_table != nullptr && p.weight_count >= 1),
                kernel, ": part ", i, " indexes weights without an NVFP4 weight table");
    LOCUS_CHECK(p.batch == 1 || a.format == StreamWeight::kBF16 || indexed, kernel,
                ": batched NVFP4 parts need a weight table (weight_ids)");
    LOCUS_CHECK(a.format == StreamWeight::kBF16 || indexed || (p.scales != nullptr && p.global_scale != nullptr),
                kernel, ": NVFP4 part ", i, " has no scales");
  }
}

void launch_stream_gemm(StreamGemmArgs& a, cudaStream_t stream) {
  LOCUS_CHECK(stream_gemm_eligible(a), "streaming GEMM: ineligible problem (M = ", a.m, ", K = ", a.k,
              "; needs 1 <= M <= ", kStreamGemmMaxM, " and 16-byte aligned rows)");
  check_stream_gemm_parts(a, "streaming GEMM");
  int64_t groups_total = 0, rows_total = 0;
  const StreamRows work = plan_stream_rows(a, a.swiglu ? 2 : 1, &groups_total, &rows_total);
  const int sms = sm_count_for(stream);
  const StreamGemmTuning t = stream_gemm_tuning();
  if (t.feed == 1 && launch_stream_gemm_tma(a, work, groups_total, rows_total, sms, t, stream)) {
    ++g_feed_launches[1];
    return;
  }
  launch_stream_gemm_rings(a, work, groups_total, rows_total, sms, t, stream);
  ++g_feed_launches[0];
}

}  // namespace locus::cuda::detail
