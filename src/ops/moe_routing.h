// MoE routing (DeepSeek V3 noaux_tc and V2-style softmax) and the token permutation helpers
// the grouped expert GEMMs need.
#pragma once
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"
#include "ops/host_readback.h"

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
// CUDA: E <= 512, top_k <= 32, n_group <= 32; the same fp32 operations in the same order as the
// CPU (accurate expf, IEEE division). The device expf may differ from the host's by an ulp, so the
// two backends choose the same experts except at near-ties of the selection scores.
void moe_route(const Tensor& logits, const Tensor& correction_bias, const MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, const Stream& stream = {});

// moe_route with the experts given (forced_ids i32 [T, k], each in [0, E)) in place of steps 2-4:
// ids = forced_ids, weights from step 5. For replaying another run's routing
// (modules/moe_routing_dump.h), so that two backends can be compared past a near-tie. CPU only.
void moe_route_forced(const Tensor& logits, const MoeRoutingConfig& cfg, const Tensor& forced_ids,
                      const Tensor& weights, const Tensor& ids, const Stream& stream = {});

// Groups the (token, choice) pairs by expert, for the grouped expert GEMMs. ids i32 [T, k]
// (row-major); outputs, all i32 and on ids' device: offsets [E + 1], rows [T * k], slot [T, k].
// - offsets[0] = 0 and offsets[e + 1] - offsets[e] = the number of pairs routed to expert e, so
//   the rows of expert e are [offsets[e], offsets[e + 1]);
// - within an expert the pairs are ordered by token t, then by j: rows[r] = t of the pair placed
//   at row r, and slot[t, j] = r (the row of moe_gather's output / the expert output that holds
//   token t's j-th choice, as moe_combine reads it).
// Bad ids: on the CPU an id outside [0, E) is an Error naming it. On CUDA the ids are not read
// on the host (that would need a synchronization); a pair with such an id is skipped: it is not
// counted in offsets, its slot is -1 (moe_combine skips it) and the rows past offsets[E] are -1,
// so offsets[E] < T * k is the visible mark. Deterministic on both backends.
void moe_group(const Tensor& ids, int64_t num_experts, const Tensor& offsets, const Tensor& rows, const Tensor& slot,
               const Stream& stream = {});

// moe_group's offsets [E + 1] (i32, any device, contiguous) read back to the host without
// draining the stream first (ops/host_readback.h): the constructor queues the copy, wait() blocks
// until it is done and returns them.
class MoeOffsetsReadback {
 public:
  explicit MoeOffsetsReadback(const Tensor& offsets, const Stream& stream = {});
  std::vector<int64_t> wait();

 private:
  HostReadback copy_;
};

// MoeOffsetsReadback(offsets, stream).wait(): the copy, waited for at once.
std::vector<int64_t> moe_offsets_to_host(const Tensor& offsets, const Stream& stream = {});

// y[i, :] = x[rows[i], :] for i in [0, R): gathers the tokens routed to each expert into
// contiguous rows. x [T, H] (any dtype, bf16 in the MoE); rows i32 [R]; y [R, H] of x's dtype.
// Rows out of [0, T): on the CPU an Error naming the row; on CUDA (rows not read on the host)
// y[i, :] is zero-filled, never an out-of-bounds read.
void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, const Stream& stream = {});

// Weighted combine of the expert outputs back to token order:
//   y[t, :] = shared[t, :] + sum_j weights[t, j] * expert_out[slot[t, j], :]
// computed in fp32 with j ascending, rounded once into y. expert_out bf16/fp32 [R, H];
// slot i32 [T, k] (row of expert_out holding token t's j-th expert; -1 = skipped);
// weights fp32 [T, k]; shared undefined or bf16/fp32 [T, H]; y bf16/fp32 [T, H].
// A slot outside [-1, R): on the CPU an Error naming it; on CUDA (not read on the host) that
// term is skipped like -1.
void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, const Stream& stream = {});

}  // namespace locus::ops
