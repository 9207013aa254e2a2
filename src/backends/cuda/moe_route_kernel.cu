// DeepSeek routing (ops::moe_route) on CUDA: one warp per token. Every value is computed with the
// same fp32 operations in the same order as the CPU code (backends/cpu/moe_routing.cpp): accurate
// expf (never __expf), IEEE division and explicit _rn intrinsics so that no flag or contraction
// changes a rounding; sequential sums where the CPU sums sequentially. Top-k uses the CPU's strict
// total order (a number before NaN, larger first, lower index on ties), which makes the chosen set
// and its order unique, so any selection algorithm under that order gives the CPU's answer.
#include <climits>
#include <cmath>

#include "backends/cuda/cuda_moe_ops.h"
#include "backends/cuda/moe_route_order.h"
#include "backends/cuda/small_ops_launch.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

// Largest sizes the kernel handles: one warp per token keeps its scores (2 * E floats) in shared
// memory, one group score and one chosen expert per lane.
constexpr int kMaxExperts = 512;
constexpr int kMaxTopK = 32;
constexpr int kMaxGroups = 32;
constexpr int kWarps = 4;  // tokens per block
constexpr unsigned kFull = 0xffffffffu;

struct MoeRouteArgs {
  const float* logits; int64_t logits_ld;
  const float* bias; int64_t bias_stride;  // bias == nullptr: no correction bias
  float* weights; int64_t weights_ld;
  int32_t* ids; int64_t ids_ld;
  int64_t tokens;
  int experts, top_k, n_group, topk_group;
  bool softmax;  // false: sigmoid scoring
  bool norm_topk_prob;
  float routed_scaling_factor;
};

// The best (by ranks_before) of the lanes' (v, i); every lane receives its index. Lanes without
// a candidate pass (NaN, INT_MAX), which every real candidate outranks. The best key first, then
// the lowest index among the lanes holding it (redux.sync: one instruction each).
__device__ __forceinline__ int warp_best_index(float v, int i) {
  const unsigned key = route_order_key(v);
  const unsigned best = __reduce_max_sync(kFull, key);
  return static_cast<int>(__reduce_min_sync(kFull, key == best ? static_cast<unsigned>(i) : UINT_MAX));
}

// Scores s (for the weights) and selection scores sel of one token into shared memory.
__device__ void token_scores(const MoeRouteArgs& a, const float* row, float* s, float* sel, int lane) {
  const int E = a.experts;
  if (!a.softmax) {
    for (int e = lane; e < E; e += 32) s[e] = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-row[e])));
  } else {
    // max is exact in any order (NaN never replaces it, as with std::max on the CPU).
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = mx < row[e] ? row[e] : mx;
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(kFull, mx, off);
      mx = mx < o ? o : mx;
    }
    for (int e = lane; e < E; e += 32) s[e] = expf(__fsub_rn(row[e], mx));
    __syncwarp();
    // The CPU sums in expert order; so does lane 0 (E <= 512 additions).
    float sum = 0.f;
    if (lane == 0)
      for (int e = 0; e < E; ++e) sum = __fadd_rn(sum, s[e]);
    sum = __shfl_sync(kFull, sum, 0);
    for (int e = lane; e < E; e += 32) s[e] = __fdiv_rn(s[e], sum);
  }
  for (int e = lane; e < E; e += 32) sel[e] = __fadd_rn(s[e], a.bias ? a.bias[e * a.bias_stride] : 0.f);
  __syncwarp();
}

// Masks the experts of all but the topk_group best groups to -inf (group score: the sum of the
// two largest selection scores for sigmoid scoring, the largest for softmax). Lane g scores
// group g, scanning it in expert order like the CPU.
__device__ void limit_groups(const MoeRouteArgs& a, float* sel, int lane) {
  const int G = a.n_group, gs = a.experts / G;
  float score = NAN;
  int index = INT_MAX;
  if (lane < G) {
    const float* p = sel + lane * gs;
    if (!a.softmax) {
      float x = -INFINITY, y = -INFINITY;
      for (int i = 0; i < gs; ++i) {
        if (p[i] > x) {
          y = x;
          x = p[i];
        } else if (p[i] > y) {
          y = p[i];
        }
      }
      score = gs >= 2 ? __fadd_rn(x, y) : x;
    } else {
      score = p[0];  // std::max_element: the first of the largest (a NaN first element stays)
      for (int i = 1; i < gs; ++i)
        if (score < p[i]) score = p[i];
    }
    index = lane;
  }
  bool kept = false;
  for (int k = 0; k < a.topk_group; ++k)
    if (warp_best_index(kept ? NAN : score, kept ? INT_MAX : index) == lane) kept = true;
  const unsigned kept_groups = __ballot_sync(kFull, kept);
  __syncwarp();
  for (int e = lane; e < a.experts; e += 32)
    if (!((kept_groups >> (e / gs)) & 1u)) sel[e] = -INFINITY;
  __syncwarp();
}

__global__ void __launch_bounds__(kWarps * 32) moe_route_kernel(MoeRouteArgs a) {
  small_op_start();
  extern __shared__ float scores[];  // per warp: s [E], sel [E]
  __shared__ int chosen[kWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int E = a.experts, K = a.top_k;
  float* s = scores + static_cast<size_t>(warp) * 2 * E;
  float* sel = s + E;
  const bool groups = a.n_group > 1 && a.topk_group < a.n_group;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < a.tokens;
       t += static_cast<int64_t>(gridDim.x) * kWarps) {
    token_scores(a, a.logits + t * a.logits_ld, s, sel, lane);
    if (groups) limit_groups(a, sel, lane);
    // Top-k: k rounds of a warp-wide best over the experts not yet taken. Lane l owns experts
    // l, l + 32, ...; bit i of `taken` marks expert l + 32 i.
    unsigned taken = 0;
    for (int j = 0; j < K; ++j) {
      float v = NAN;
      int best = INT_MAX;
      for (int i = 0, e = lane; e < E; ++i, e += 32)
        if (!((taken >> i) & 1u) && ranks_before(sel[e], e, v, best)) {
          v = sel[e];
          best = e;
        }
      best = warp_best_index(v, best);
      if (best % 32 == lane) taken |= 1u << (best / 32);
      if (lane == 0) chosen[warp][j] = best;
    }
    __syncwarp();
    // Weights: s at the chosen experts, over their sum (in choice order, like the CPU).
    float sum = 0.f;
    if (lane == 0)
      for (int j = 0; j < K; ++j) sum = __fadd_rn(sum, s[chosen[warp][j]]);
    sum = __shfl_sync(kFull, sum, 0);
    const float denom = a.norm_topk_prob ? __fadd_rn(sum, 1e-20f) : 1.f;
    if (lane < K) {
      const int e = chosen[warp][lane];
      a.ids[t * a.ids_ld + lane] = e;
      a.weights[t * a.weights_ld + lane] = __fmul_rn(__fdiv_rn(s[e], denom), a.routed_scaling_factor);
    }
    __syncwarp();  // s, sel and chosen are rewritten for the next token
  }
}

}  // namespace

void moe_route(const Tensor& logits, const Tensor& correction_bias, const ops::MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, void* stream) {
  const char* op = "moe_route";
  LOCUS_CHECK(cfg.num_experts <= kMaxExperts && cfg.top_k <= kMaxTopK && cfg.n_group <= kMaxGroups, op,
              " on CUDA supports num_experts <= ", kMaxExperts, ", top_k <= ", kMaxTopK, " and n_group <= ", kMaxGroups,
              "; got num_experts=", cfg.num_experts, ", top_k=", cfg.top_k, ", n_group=", cfg.n_group);
  if (!start_op(op, logits, logits.size(0))) return;
  MoeRouteArgs a{};
  a.logits = logits.data<float>();
  a.logits_ld = logits.stride(0);
  a.bias = correction_bias.defined() ? correction_bias.data<float>() : nullptr;
  a.bias_stride = correction_bias.defined() ? correction_bias.stride(0) : 0;
  a.weights = weights.data<float>();
  a.weights_ld = weights.stride(0);
  a.ids = ids.data<int32_t>();
  a.ids_ld = ids.stride(0);
  a.tokens = logits.size(0);
  a.experts = static_cast<int>(cfg.num_experts);
  a.top_k = static_cast<int>(cfg.top_k);
  a.n_group = static_cast<int>(cfg.n_group);
  a.topk_group = static_cast<int>(cfg.topk_group);
  a.softmax = cfg.scoring == ops::MoeScoring::kSoftmax;
  a.norm_topk_prob = cfg.norm_topk_prob;
  a.routed_scaling_factor = cfg.routed_scaling_factor;
  const size_t smem = static_cast<size_t>(kWarps) * 2 * a.experts * sizeof(float);
  // The kernel strides over the tokens beyond the grid.
  launch_small_op(moe_route_kernel, grid_blocks((a.tokens + kWarps - 1) / kWarps), kWarps * 32, smem, as_stream(stream),
                  "moe_route kernel launch", a);
}

}  // namespace locus::cuda
