// Internal to the CUDA backend: host-side launchers for the MoE routing kernels (moe_*.cu), so
// that cuda_moe_ops.cpp stays plain host code. Pointers are device pointers; strides and leading
// dimensions are in elements.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace locus::cuda::detail {

// Largest sizes the routing kernel handles: one warp per token keeps its scores (2 * E floats)
// in shared memory and one group score and one chosen expert per lane.
inline constexpr int kRouteMaxExperts = 512;
inline constexpr int kRouteMaxTopK = 32;
inline constexpr int kRouteMaxGroups = 32;

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
void launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream);

struct MoeGroupArgs {
  const int32_t* ids; int64_t ids_ld;  // [tokens, top_k]
  int64_t tokens; int top_k;
  int experts;
  int32_t* offsets;                    // [experts + 1], contiguous
  int32_t* rows;                       // [tokens * top_k], contiguous
  int32_t* slot; int64_t slot_ld;      // [tokens, top_k]
};
void launch_moe_group(const MoeGroupArgs& a, cudaStream_t stream);

struct MoeGatherArgs {
  const void* x; int64_t x_ld; int64_t x_rows;  // [x_rows, cols]
  const int32_t* rows; int64_t rows_stride;     // [n]
  void* y; int64_t y_ld;                        // [n, cols]
  int64_t n, cols;
  int elem_bytes;
};
void launch_moe_gather(const MoeGatherArgs& a, cudaStream_t stream);

struct MoeCombineArgs {
  const void* expert_out; int64_t eo_ld; int64_t eo_rows; bool eo_f32;
  const int32_t* slot; int64_t slot_s0, slot_s1;
  const float* weights; int64_t w_s0, w_s1;
  const void* shared; int64_t shared_ld; bool shared_f32;  // shared == nullptr: none
  void* y; int64_t y_ld; bool y_f32;
  int64_t tokens, hidden; int top_k;
};
void launch_moe_combine(const MoeCombineArgs& a, cudaStream_t stream);

}  // namespace locus::cuda::detail
