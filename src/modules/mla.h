// MLA: DeepSeek multi-head latent attention with its latent KV cache.
//
// Projections (all BF16 Linears, names as in the checkpoint, relative to the MLA module):
//   q_a_proj [q_lora_rank, hidden] -> q_a_layernorm [q_lora_rank] -> q_b_proj [H*(dn+dr), q_lora_rank]
//   (or q_proj [H*(dn+dr), hidden] when q_lora_rank == 0, V2-Lite)
//   kv_a_proj_with_mqa [kv_lora_rank + dr, hidden] (never partitioned) -> split [c_kv | k_pe];
//   kv_a_layernorm [kv_lora_rank] on c_kv; RoPE (interleaved pairs) on k_pe and on q_pe;
//   kv_b_proj [H*(dn+dv), kv_lora_rank]; o_proj [hidden, H*dv].
// dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim.
//
// Absorption (transform()): kv_b_proj viewed [H, dn+dv, dc] gives k_b = W_UK [H, dn, dc] and
// v_b = W_UV [H, dv, dc] as their own contiguous weights (dc = kv_lora_rank). Decode then runs
//   q_lat[h] = q_nope[h] k_b[h]          (ops::bmm, [H, T, dn] x [H, dn, dc])
//   o_lat    = MQA over the cache        (ops::mla_attention, one latent head)
//   o[h]     = o_lat[h] v_b[h]^T         (ops::bmm, [H, T, dc] x [H, dc, dv])
// localize() shards k_b and v_b over heads per plan_bmm (one shard per domain) besides the
// Linears' own shards; every reload of kv_b_proj rewrites the absorbed weights in place too.
//
// Paths: prefill (non-absorbed: k_nope and v expanded per head from the cache by kv_b_proj) and
// decode (absorbed) give the same attention output within BF16 rounding.
// Softmax scale = (dn + dr)^-0.5 * mscale^2 (YaRN mscale from the rope table).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "modules/linear.h"
#include "modules/rmsnorm.h"
#include "ops/kv_table.h"
#include "ops/rope.h"

namespace locus::modules {

struct MlaConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q compression (plain q_proj)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  float rms_norm_eps = 1e-6f;
  ops::RopeConfig rope;         // rope.dim is set to qk_rope_head_dim
  int64_t max_positions = 4096;  // rows of the RoPE table
  // kAuto uses the absorbed path when every sequence appends at most this many tokens.
  int64_t absorbed_max_tokens = 1;
};

// The latent KV cache of one sequence for one layer: per token the normalized c_kv followed by
// the rotated k_pe, i.e. rows of kv_lora_rank + qk_rope_head_dim values (576 for V3).
// The model allocates one per (sequence, layer); MLA::forward appends to it.
struct MlaKvCache {
  Tensor latent;       // bf16 [capacity, kv_lora_rank + rope_dim]
  int64_t kv_lora_rank = 0;
  int64_t length = 0;  // tokens stored

  static MlaKvCache allocate(int64_t capacity, int64_t kv_lora_rank, int64_t rope_dim,
                             Device device = Device::cpu(), int domain = -1);
  int64_t capacity() const { return latent.defined() ? latent.size(0) : 0; }
  int64_t rope_dim() const { return latent.defined() ? latent.size(1) - kv_lora_rank : 0; }
  Tensor kv(int64_t n) const;    // [n, kv_lora_rank] view of the first n tokens
  Tensor k_pe(int64_t n) const;  // [n, rope_dim] view of the first n tokens
};

// The rows of one forward call that belong to one sequence, in order.
struct MlaSequence {
  MlaKvCache* cache = nullptr;
  int64_t num_tokens = 0;  // appended at positions cache->length ...
};

enum class MlaPath { kAuto, kPrefill, kAbsorbed };
const char* mla_path_name(MlaPath p);

class MLA : public Module {
 public:
  MLA(ModuleContext ctx, MlaConfig cfg);

  const MlaConfig& config() const { return cfg_; }
  LifecycleState state() const override;

  void load(const std::string& piece, const Tensor& t) override;
  std::vector<std::string> missing_pieces() const override;
  void transform() override;  // transforms the Linears and builds the absorbed k_b / v_b
  void localize() override;   // localizes the Linears and shards k_b / v_b over heads
  void reload(const WeightMap& weights) override;  // a subset of the children may be given
  void check_reload(const WeightMap& weights) const override;
  void rebuild() override;    // re-derives k_b / v_b from kv_b_proj's current weight
  MemoryUsage memory() const override;
  void collect_plans(std::vector<PlanRecord>* out) const override;

  // x bf16 [T, hidden]; positions i32/i64 [T] (RoPE positions; positions of sequence i's tokens
  // must be cache->length, cache->length + 1, ...); `seqs` split the T rows in order and their
  // num_tokens sum to T. Appends each sequence's latent rows to its cache (length grows; throws
  // before writing anything if a cache is too small), then y bf16 [T, hidden] = o_proj(attention).
  void forward(const Tensor& x, const Tensor& positions, const std::vector<MlaSequence>& seqs, const Tensor& y,
               MlaPath path = MlaPath::kAuto, const Stream& stream = {});

  // Decode with the caches in a device table (ops/kv_table.h), for steps captured in CUDA graphs:
  // one new token per sequence, x bf16 [B, hidden], table for this layer's caches (its lengths are
  // the new tokens' positions). Appends each token's latent row at lengths[b] and attends on the
  // absorbed path, reading every address and length on the device; the caller advances the
  // caches' host-side lengths. The same results as forward() on those caches (bitwise on the CPU).
  void forward_table(const Tensor& x, const ops::KvTable& table, const Tensor& y, const Stream& stream = {});

  float softmax_scale() const { return softmax_scale_; }
  const ops::RopeTable& rope_table() const { return rope_; }
  const locality::Plan& k_b_plan() const { return k_b_plan_; }
  const locality::Plan& v_b_plan() const { return v_b_plan_; }
  // Absorbed weights: full [H, dn, dc] / [H, dv, dc] before localize, else one shard per partition.
  const std::vector<Tensor>& k_b() const { return k_b_; }
  const std::vector<Tensor>& v_b() const { return v_b_; }

  Linear* q_a_proj() { return q_a_proj_.get(); }  // null when q_lora_rank == 0
  Linear* q_b_proj() { return q_b_proj_.get(); }  // null when q_lora_rank == 0
  Linear* q_proj() { return q_proj_.get(); }      // null when q_lora_rank > 0
  Linear& kv_a_proj_with_mqa() { return *kv_a_proj_; }
  Linear& kv_b_proj() { return *kv_b_proj_; }
  Linear& o_proj() { return *o_proj_; }

 private:
  struct Child {
    const char* prefix;  // "q_a_proj."
    Module* module;
  };
  std::vector<Child> children() const;
  std::vector<WeightMap> split(const WeightMap& weights) const;  // per child, in children() order
  void check_plan_strict(const locality::Plan& plan, const char* what) const;
  // Writes W_UK / W_UV of a kv_b_proj weight [H*(dn+dv), dc] into k_b_ / v_b_ (full or shards).
  void write_absorbed(const Tensor& kv_b_weight);
  // forward()'s and forward_table()'s shared checks: transformed, x bf16 [T, hidden], y [T, hidden].
  void check_forward(const char* fn, const Tensor& x, const Tensor& y) const;
  // q_proj (or q_a -> norm -> q_b) and RoPE on the rope part: q [T, H, dn + dr].
  Tensor queries(const Tensor& x, const Tensor& positions, const Stream& stream) const;
  // dst [T, dc + dr] = [kv_a_layernorm(c_kv) | rope(k_pe)] of kv_a_proj's output rows.
  void make_latent(const Tensor& kva, const Tensor& dst, const Tensor& positions, const Stream& stream) const;
  // Absorbed attention around `attend(q_lat, q_pe, o_lat)`: q_lat = q_nope k_b before it, o_v =
  // o_lat v_b^T after it.
  void absorbed_attention(const Tensor& q3, const Tensor& o_v, const Stream& stream,
                          const std::function<void(const Tensor&, const Tensor&, const Tensor&)>& attend) const;
  void attend_prefill(const Tensor& q3, const MlaKvCache& cache, int64_t row0, int64_t n, const Tensor& o_v,
                      const Stream& stream) const;
  void absorbed_bmm(const Tensor& a, const std::vector<Tensor>& weights, bool transpose_weights,
                    const locality::Plan& plan, const Tensor& y, const Stream& stream) const;

  MlaConfig cfg_;
  ops::RopeTable rope_;
  float softmax_scale_ = 1.f;
  std::unique_ptr<Linear> q_a_proj_, q_b_proj_, q_proj_, kv_a_proj_, kv_b_proj_, o_proj_;
  std::unique_ptr<RMSNorm> q_a_layernorm_, kv_a_layernorm_;
  locality::Plan k_b_plan_, v_b_plan_;
  std::vector<Tensor> k_b_, v_b_;  // one entry (full) or one per partition
};

}  // namespace locus::modules
