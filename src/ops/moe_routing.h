// MoE routing (DeepSeek V3 noaux_tc and V2-style softmax) and the token permutation helpers
// the grouped expert GEMMs need.
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

enum class MoeScoring : uint8_t {
  kSigmoid,  // DeepSeek-V3: s = sigmoid(logits)
  kSoftmax,  // DeepSeek-V2 / V2-Lite: s = softmax(logits)
};

struct MoeRoutingConfig {
  int64_t num_experts = 0;
  int64_t top_k = 1;
  int64_t n_group = 1;     // experts are split into n_group equal groups
  int64_t topk_group = 1;  // groups kept per token
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.f;
  MoeScoring scoring = MoeScoring::kSigmoid;
};

// Per token:
//  1. s = sigmoid(logits) (or softmax over the experts);
//  2. selection scores s' = s + correction_bias (bias undefined -> s' = s); the bias is used only
//     to choose experts, never in the weights;
//  3. group score: sigmoid -> sum of the top-2 s' in the group (V3 noaux_tc); softmax -> the max
//     s' in the group (V2 group_limited_greedy); keep the topk_group best groups, the others are
//     masked to -inf (not 0: s' may be negative);
//  4. the top_k experts by s' among the kept groups (ties: lower index first);
//  5. weights = s at those experts, divided by their sum (+1e-20) when norm_topk_prob, times
//     routed_scaling_factor.
// logits fp32 [T, E]; correction_bias fp32 [E] or undefined; weights fp32 [T, k]; ids i32 [T, k]
// (experts in descending order of s').
void moe_route(const Tensor& logits, const Tensor& correction_bias, const MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, const Stream& stream = {});

// y[i, :] = x[rows[i], :] for i in [0, R): gathers the tokens routed to each expert into
// contiguous rows. x bf16 [T, H]; rows i32 [R] (each in [0, T), else an Error naming it); y bf16 [R, H].
void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, const Stream& stream = {});

// Weighted combine of the expert outputs back to token order:
//   y[t, :] = shared[t, :] + sum_j weights[t, j] * expert_out[slot[t, j], :]
// computed in fp32 with j ascending, rounded once into y. expert_out bf16/fp32 [R, H];
// slot i32 [T, k] (row of expert_out holding token t's j-th expert; -1 = skipped);
// weights fp32 [T, k]; shared undefined or bf16/fp32 [T, H]; y bf16/fp32 [T, H].
void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, const Stream& stream = {});

}  // namespace locus::ops
