// The NVFP4 matrix-vector kernel for decode (nvfp4_gemv.h): one CTA block
// (nvfp4_gemv_device.cuh) of one weight's product, or of a MoE's experts by id; its block shapes
// and its launch.
#include <algorithm>
#include <cmath>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/cta_trace.cuh"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/grid_dependency.cuh"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/nvfp4_gemv_device.cuh"
#include "backends/cuda/stream_registry.h"
#include "backends/cuda/stream_scratch.h"
#include "core/error.h"

namespace locus::cuda::detail {
namespace {

EnvToggle g_enabled{"LOCUS_NVFP4_GEMV", true};
Nvfp4GemvShape g_forced{0, 0};

// Block blockIdx.x of one weight's product, or with INDEXED of a by-id entry's (blockIdx.z the
// product, blockIdx.y its entry); see nvfp4_gemv_block for the other parameters.
template <int MB, int TW, int W, bool SWIGLU, bool LEAN, bool INDEXED>
__global__ void __launch_bounds__(kNvfp4GemvThreads, nvfp4_gemv_resident_ctas(MB, TW, LEAN))
    nvfp4_gemv_kernel(Nvfp4GemvArgs a) {
  static_assert(!INDEXED || MB == 1, "a by-id entry is one token");
  __shared__ Nvfp4GemvPartials<MB, TW> partial;
  if constexpr (INDEXED) {
    // Which weight an entry streams is known only once the kernel before (the routing) is done.
    launch_dependents();
    wait_for_previous_grid();
    const Nvfp4GemvIndexed& ip = a.indexed[blockIdx.z];
    const int entry = static_cast<int>(blockIdx.y);
    if (entry >= ip.entries) return;  // the whole CTA: a product with fewer entries than the grid
    const int32_t id = ip.ids[entry];
    const bool valid = id >= 0 && id < ip.count;
    const StreamWeightRef w = ip.table[valid ? id : 0];
    const Nvfp4GemvProblem pr{static_cast<const uint8_t*>(w.w),
                              w.scales,
                              valid ? w.global_scale : nullptr,
                              ip.x + (entry / ip.x_entry_div) * ip.x_ld,
                              0,
                              1,
                              a.n,
                              ip.y_offset + entry * ip.y_ld,
                              0};
    nvfp4_gemv_block<MB, TW, W, SWIGLU, LEAN>(a, pr, blockIdx.x, partial, [] {});
  } else {
    const Nvfp4GemvProblem pr{a.codes, a.scales, a.global_scale, a.x, a.x_ld, static_cast<int>(a.m), a.n, 0, 0};
    // The weights do not depend on the kernel before; the activations and y do.
    // Thread 0's timeline record (Nvfp4GemvArgs::trace) lives in shared memory: no register holds
    // it through the block.
    __shared__ unsigned long long* s_trace;
    if (threadIdx.x == 0) s_trace = open_trace_record(a.trace, kGemvTraceWords);
    nvfp4_gemv_block<MB, TW, W, SWIGLU, LEAN>(a, pr, blockIdx.x, partial, [] {
      launch_dependents();
      wait_for_previous_grid();
      if (threadIdx.x == 0) {
        stamp(s_trace, kGemvTraceWaited);
        stamp(s_trace, kGemvTraceUnit);
      }
    });
    if (threadIdx.x == 0) {
      stamp(s_trace, kGemvTraceBody);
      stamp(s_trace, kGemvTraceExit);
    }
  }
}

// Slots (one warp's tiles) of one weight: its output tiles, `tiles_per_warp` a slot (SwiGLU: an
// output tile's gate and up tiles).
int64_t slots_per_weight(const Nvfp4GemvArgs& a, int tiles_per_warp) {
  const int64_t out_tiles = (a.n + 15) / 16;
  return a.swiglu ? out_tiles : (out_tiles + tiles_per_warp - 1) / tiles_per_warp;
}

}  // namespace

bool nvfp4_gemv_eligible(const Nvfp4GemvArgs& a) {
  const bool common = a.n >= 1 && a.k >= 16 && a.k % 16 == 0 && a.y_ld >= 0 &&
                      (!a.swiglu || (a.n % 16 == 0 && a.bias == nullptr)) && a.n <= (int64_t{1} << 31) - 64;
  if (!common) return false;
  if (a.num_indexed == 0)
    return a.m >= 1 && a.m <= kNvfp4GemvMaxM && a.x_ld % 8 == 0 && aligned16(a.x) && aligned16(a.codes) &&
           a.scales != nullptr && a.global_scale != nullptr;
  if (a.num_indexed > kNvfp4GemvMaxProducts || a.bias != nullptr) return false;
  for (int i = 0; i < a.num_indexed; ++i) {
    const Nvfp4GemvIndexed& p = a.indexed[i];
    if (p.table == nullptr || p.ids == nullptr || p.count < 1 || p.entries < 1 || p.entries > 65535 ||
        p.x_entry_div < 1 || !aligned16(p.x) || p.x_ld % 8 != 0 || p.y_offset < 0 || p.y_ld < 0)
      return false;
  }
  return true;
}

int nvfp4_gemv_token_blocks(const Nvfp4GemvArgs& a) { return a.num_indexed > 0 || a.m <= 8 ? 1 : 2; }

bool nvfp4_gemv_lean_fits(const Nvfp4GemvArgs& a) {
  return a.num_indexed == 0 && !a.swiglu && nvfp4_gemv_token_blocks(a) == 2;
}

int64_t nvfp4_gemv_blocks(const Nvfp4GemvArgs& a, Nvfp4GemvShape shape) {
  const int64_t per_cta = kNvfp4GemvWarps / shape.warps_per_slot;
  return (slots_per_weight(a, shape.tiles_per_warp) + per_cta - 1) / per_cta;
}

namespace {

// CTAs of the kernel resident on one SM: what its launch bounds promise.
int resident_ctas_per_sm(const Nvfp4GemvArgs& a, Nvfp4GemvShape s) {
  return nvfp4_gemv_resident_ctas(nvfp4_gemv_token_blocks(a), s.tiles_per_warp, s.lean);
}

// Slots (one warp's tiles) of the whole launch, every by-id entry's included.
int64_t slots_of(const Nvfp4GemvArgs& a, int tiles_per_warp) {
  int64_t entries = 1;
  if (a.num_indexed > 0) {
    entries = 0;
    for (int i = 0; i < a.num_indexed; ++i) entries += a.indexed[i].entries;
  }
  return slots_per_weight(a, tiles_per_warp) * entries;
}

int64_t ctas_of(const Nvfp4GemvArgs& a, Nvfp4GemvShape s) {
  const int64_t per_cta = kNvfp4GemvWarps / s.warps_per_slot;
  return (slots_of(a, s.tiles_per_warp) + per_cta - 1) / per_cta;
}

// Whether every CTA of shape `s` is resident at once on `sms` SMs (one wave: each CTA's warps
// stream at their own pace to the end), each of a slot's warps with a chunk of K.
bool fits_one_wave(const Nvfp4GemvArgs& a, Nvfp4GemvShape s, int sms) {
  return s.warps_per_slot <= (a.k + 63) / 64 && ctas_of(a, s) <= int64_t{resident_ctas_per_sm(a, s)} * sms;
}

// The most warps a slot whose CTAs are all resident at once; 0 where even one warp a slot is not.
int one_wave_warps(const Nvfp4GemvArgs& a, int tiles_per_warp, bool lean, int sms) {
  for (int w = kNvfp4GemvWarps; w >= 1; w /= 2)
    if (fits_one_wave(a, {tiles_per_warp, w, lean}, sms)) return w;
  return 0;
}

// Of the one-wave shapes (nvfp4_gemv_shape), the one whose busiest SM streams the fewest tiles
// (resident CTAs go one an SM, then a second: it holds ceil(CTAs / SMs)); a tie keeps the first,
// two tiles a warp before one and more warps a slot before fewer. {0, 0} where none fits one wave.
Nvfp4GemvShape least_loaded_one_wave_shape(const Nvfp4GemvArgs& a, int sms) {
  Nvfp4GemvShape best{0, 0};
  int64_t best_tiles = 0;
  for (const int tiles : {2, 1}) {
    for (int w = kNvfp4GemvWarps; w >= 1; w /= 2) {
      const Nvfp4GemvShape s{tiles, w};
      if (!fits_one_wave(a, s, sms)) continue;
      const int64_t busiest = (ctas_of(a, s) + sms - 1) / sms * (kNvfp4GemvWarps / w) * tiles;
      if (best.warps_per_slot == 0 || busiest < best_tiles) best = s, best_tiles = busiest;
    }
  }
  return best;
}

}  // namespace

Nvfp4GemvShape nvfp4_gemv_short_shape(const Nvfp4GemvArgs& a, int tiles_per_warp) {
  Nvfp4GemvShape s{tiles_per_warp, kNvfp4GemvWarps};
  const int64_t chunks = (a.k + 63) / 64, min_chunks = 8 / tiles_per_warp;
  while (s.warps_per_slot > 1 && chunks / s.warps_per_slot < min_chunks) s.warps_per_slot /= 2;
  return s;
}

Nvfp4GemvShape nvfp4_gemv_shape(const Nvfp4GemvArgs& a, int sms, bool allow_lean) {
  const bool lean_fits = allow_lean && nvfp4_gemv_lean_fits(a);
  if (g_forced.warps_per_slot > 0) {
    const int tiles = a.swiglu ? 2 : g_forced.tiles_per_warp > 0 ? g_forced.tiles_per_warp : 1;
    return {tiles, g_forced.warps_per_slot, g_forced.lean && tiles == 1 && lean_fits};
  }
  if (a.num_indexed == 0 && !a.swiglu && nvfp4_gemv_token_blocks(a) == 1) {
    const Nvfp4GemvShape s = least_loaded_one_wave_shape(a, sms);
    if (s.warps_per_slot > 0) return s;
  }
  const int short_tiles = a.swiglu ? 2 : 1;
  Nvfp4GemvShape best = nvfp4_gemv_short_shape(a, short_tiles);
  // How full its waves are: resident-CTA slots used over those of its whole waves.
  auto fill = [&](Nvfp4GemvShape s) {
    const double waves = double(ctas_of(a, s)) / (double(resident_ctas_per_sm(a, s)) * sms);
    return waves / std::ceil(waves);
  };
  double best_fill = fill(best);
  // One wave of two tiles a warp at a fill no lower than the short CTAs' (it halves the
  // activation loads), then one tile a warp at a higher fill.
  for (const int tiles : {2, 1}) {
    if (a.swiglu && tiles == 1) continue;  // SwiGLU streams a gate tile with its up tile
    const int w = one_wave_warps(a, tiles, false, sms);
    if (w > 0 && (tiles == 2 ? fill({tiles, w}) >= best_fill : fill({tiles, w}) > best_fill))
      best = {tiles, w}, best_fill = fill(best);
  }
  if (lean_fits) {  // one tile a warp at 3 CTAs an SM, where that fills the waves better
    Nvfp4GemvShape lean = nvfp4_gemv_short_shape(a, 1);
    lean.lean = true;
    const int w = one_wave_warps(a, 1, true, sms);
    for (const Nvfp4GemvShape s : {lean, Nvfp4GemvShape{1, w, true}})
      if (s.warps_per_slot > 0 && fill(s) > best_fill) best = s, best_fill = fill(s);
  }
  return best;
}

void set_nvfp4_gemv_shape(Nvfp4GemvShape forced) { g_forced = forced; }

bool nvfp4_gemv_enabled() { return g_enabled.on(); }

std::string nvfp4_gemv_problem_key(const Nvfp4GemvArgs& a, cudaStream_t stream) {
  const int bias = a.bias == nullptr ? 0 : a.bias_f32 ? 2 : 1;
  std::string entries;  // by-id products: each one's entries
  for (int i = 0; i < a.num_indexed; ++i) entries += str(i ? "," : ":ids", a.indexed[i].entries);
  return str("nvfp4_gemv:", a.m, 'x', a.n, 'x', a.k, ':', a.x_ld, ',', a.y_ld, ':', a.y_f32, bias, a.swiglu, entries,
             ":sm", partition_stream_sm_count(stream));
}

void launch_nvfp4_gemv(const Nvfp4GemvArgs& a, cudaStream_t stream) {
  launch_nvfp4_gemv(a, nvfp4_gemv_shape(a, sm_count_for(stream)), stream);
}

void launch_nvfp4_gemv(const Nvfp4GemvArgs& a, Nvfp4GemvShape shape, cudaStream_t stream) {
  LOCUS_CHECK(nvfp4_gemv_eligible(a), "nvfp4_gemv: ineligible problem (M = ", a.m, ", N = ", a.n, ", K = ", a.k, ")");
  LOCUS_CHECK((shape.tiles_per_warp == 1 || shape.tiles_per_warp == 2) && (!a.swiglu || shape.tiles_per_warp == 2) &&
                  (shape.warps_per_slot == 1 || shape.warps_per_slot == 2 || shape.warps_per_slot == 4 ||
                   shape.warps_per_slot == 8),
              "nvfp4_gemv: no kernel for ", shape.tiles_per_warp, " tiles and ", shape.warps_per_slot,
              " warps a slot", a.swiglu ? " with SwiGLU" : "");
  LOCUS_CHECK(!shape.lean || (shape.tiles_per_warp == 1 && nvfp4_gemv_lean_fits(a)),
              "nvfp4_gemv: the lean form takes one tile a warp, 9-16 tokens of one weight and no SwiGLU (M = ", a.m,
              ", ", shape.tiles_per_warp, " tiles a warp", a.swiglu ? ", SwiGLU" : "",
              a.num_indexed > 0 ? ", by id" : "", ")");
  // By-id products: a row of CTAs per entry (y) and per product (z).
  int max_entries = 1;
  for (int i = 0; i < a.num_indexed; ++i) max_entries = std::max(max_entries, static_cast<int>(a.indexed[i].entries));
  const dim3 grid(static_cast<unsigned>(nvfp4_gemv_blocks(a, shape)), static_cast<unsigned>(max_entries),
                  static_cast<unsigned>(std::max(1, static_cast<int>(a.num_indexed))));
  DependentLaunch launch(grid, dim3(kNvfp4GemvThreads), 0, stream, small_op_overlap());
  cudaError_t err = cudaSuccess;
  dispatch_nvfp4_gemv_shape(
      nvfp4_gemv_token_blocks(a), shape.tiles_per_warp, shape.warps_per_slot, a.swiglu, shape.lean,
      [&]<int MB, int TW, int W, bool SW, bool LEAN>() {
        // By-id entries are one token each.
        if constexpr (MB == 1) {
          if (a.num_indexed > 0) {
            err = cudaLaunchKernelEx(&launch.config, nvfp4_gemv_kernel<MB, TW, W, SW, LEAN, true>, a);
            return;
          }
        }
        err = cudaLaunchKernelEx(&launch.config, nvfp4_gemv_kernel<MB, TW, W, SW, LEAN, false>, a);
      });
  LOCUS_CUDA_CHECK_NAMED(err, "nvfp4_gemv_kernel launch failed");
}

}  // namespace locus::cuda::detail

namespace locus::cuda {

void set_nvfp4_gemv_enabled(bool on) { detail::g_enabled.set(on); }

}  // namespace locus::cuda
