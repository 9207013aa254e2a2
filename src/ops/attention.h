// Causal attention for MLA over a latent KV cache, in the two forms DeepSeek uses:
// - prefill (non-absorbed): per-head keys k = [k_nope_h | k_pe] and values v_h expanded from the
//   cache by kv_b_proj; qk dim = qk_nope + qk_rope, v dim = v_head_dim;
// - decode (absorbed): MQA with one latent KV head: keys [c_kv | k_pe], values c_kv;
//   qk dim = kv_lora_rank + qk_rope, v dim = kv_lora_rank.
// Both are one op: the score is split in two dot products so the rope part (shared by all heads)
// never has to be concatenated or broadcast into a buffer:
//   score(t, h, s) = (q_a[t,h] . k_a[s,h_a] + q_b[t,h] . k_b[s,h_b]) * scale
//   out[t, h]      = sum_s softmax_s(score) v[s, h_v]
// Causal: query t sits at position q_start + t and sees keys s <= q_start + t.
#pragma once
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

// q_a [T, H, Da], q_b [T, H, Db]; k_a [S, Ha, Da], k_b [S, Hb, Db], v [S, Hv, Dv] with each of
// Ha, Hb, Hv equal to H or 1 (one head shared by all query heads); out [T, H, Dv].
// Inputs bf16 or fp32, out bf16 or fp32; every tensor has a unit-stride last dim (other strides
// free: views into the cache and into projection outputs are fine). Needs S >= q_start + T.
// Scores, softmax and the weighted sum are computed in fp32 with a fixed order.
void mla_attention(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b, const Tensor& v,
                   const Tensor& out, float scale, int64_t q_start, const Stream& stream = {});

// One sequence's keys and values for mla_attention_batch: k_a [S, Ha, Da], k_b [S, Hb, Db],
// v [S, Hv, Dv], as for mla_attention.
struct AttentionKeys {
  Tensor k_a, k_b, v;
};

// mla_attention for B = keys.size() sequences at once (decode: one new token each): sequence i
// owns the T = rows / B query rows [i*T, (i+1)*T) of q_a, q_b and out, and they are its last T
// keys: q_start = S_i - T. The same as one mla_attention call per sequence (bitwise on the CPU;
// on CUDA one launch for up to 64 sequences whose keys share their layout, so that short
// sequences fill the GPU together, within fp32 rounding of the per-sequence calls).
void mla_attention_batch(const Tensor& q_a, const Tensor& q_b, const std::vector<AttentionKeys>& keys,
                         const Tensor& out, float scale, const Stream& stream = {});

}  // namespace locus::ops
