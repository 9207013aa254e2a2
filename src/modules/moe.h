// MoE: DeepSeek mixture of experts = router gate + routed experts (fused SwiGLU) + shared experts.
//   y = sum_i w_i * expert_{e_i}(x) + shared_experts(x)
// - gate: VANILLA BF16 Linear [E, hidden] with fp32 output ("<name>.gate"), never partitioned;
//   e_score_correction_bias fp32 [E] (sigmoid scoring) used for selection only.
// - routing: ops::moe_route (sigmoid + bias + group-limited top-k, or softmax for V2 configs).
// - experts: per expert a FUSED_GATE_UP Linear [2I, hidden] and a VANILLA Linear [hidden, I]
//   (BF16 or NVFP4). Grouped execution: the tokens routed to each expert are gathered into
//   contiguous rows, one GEMM per active expert, combined back with the routing weights.
//   Localized per plan_moe ("<name>.experts"): each expert's gate/up split along I (SwiGLU kept
//   local, one partition per domain) and its down projection split along hidden; all partitions
//   run inside one fork/join per GEMM stage.
// - shared_experts: a GatedMLP of intermediate I * n_shared_experts ("<name>.shared_experts"),
//   unpartitioned through the policy's exclude pattern.
//
// Checkpoint names accepted by load() (relative to the MoE module, e.g. "model.layers.3.mlp"):
//   gate.weight, gate.e_score_correction_bias,
//   experts.{e}.{gate_proj,up_proj,down_proj}.{weight,weight_scale,weight_scale_2,input_scale}
//     (DeepSeek / ModelOpt per-expert form),
//   experts.gate_up_proj [E, 2I, hidden], experts.down_proj [E, hidden, I] (HF in-memory fused form),
//   shared_experts.{gate_proj,up_proj,down_proj}.{...}.
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "modules/gated_mlp.h"
#include "modules/linear.h"
#include "ops/nvfp4_indexed.h"
#include "ops/moe_routing.h"
#include "ops/nvfp4_row_blocks.h"

namespace locus::modules {

struct MoeConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // moe_intermediate_size (per expert)
  int64_t num_experts = 0;        // n_routed_experts
  int64_t top_k = 1;              // num_experts_per_tok
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.f;
  ops::MoeScoring scoring = ops::MoeScoring::kSigmoid;
  bool correction_bias = true;    // gate.e_score_correction_bias present (noaux_tc)
  int64_t n_shared_experts = 0;   // 0: no shared experts
  locality::QuantKind expert_quant = locality::QuantKind::kBF16;
  locality::QuantKind shared_quant = locality::QuantKind::kBF16;
};

class MoE : public Module {
 public:
  MoE(ModuleContext ctx, MoeConfig cfg);

  const MoeConfig& config() const { return cfg_; }
  ops::MoeRoutingConfig routing_config() const;
  LifecycleState state() const override;

  void load(const std::string& piece, const Tensor& t) override;
  // Per-expert form: proj is "gate_proj", "up_proj" or "down_proj"; piece a Linear piece
  // ("weight", "weight_scale", "weight_scale_2", "input_scale").
  void load_expert(int64_t expert, const std::string& proj, const std::string& piece, const Tensor& t);
  // HF in-memory fused form (BF16): gate_up [E, 2I, hidden] (gate rows first), down [E, hidden, I].
  void load_fused_experts(const Tensor& gate_up, const Tensor& down);
  std::vector<std::string> missing_pieces() const override;
  void transform() override;
  void localize() override;
  void reload(const WeightMap& weights) override;  // same names as load(); any subset
  void check_reload(const WeightMap& weights) const override;
  void rebuild() override;
  MemoryUsage memory() const override;
  void collect_plans(std::vector<PlanRecord>* out) const override;

  // x bf16 [T, hidden] -> y bf16 or fp32 [T, hidden]: route, group the (token, choice) pairs per
  // expert (ops::moe_group, on x's device), gather, run_experts, shared experts, combine. Expert
  // outputs are kept in fp32 and combined with the routing weights in fp32, rounded once into y.
  // CUDA graph capture: routing, grouping, gather, the expert GEMMs themselves and the combine are
  // stream-ordered kernels, but forward() as a whole is NOT capturable yet:
  //  - run_experts needs each expert's row count on the host, so forward() copies the E + 1
  //    offsets back once (a stream synchronization; under capture that copy throws an Error);
  //  - its workspaces (routing, grouped rows, expert activations) are allocated per call with
  //    Tensor::empty (cudaMalloc), as in the other modules.
  // A device-side grouped GEMM that reads `offsets` on the GPU, plus workspaces allocated once,
  // would make it capturable; run_experts is the one place to replace.
  void forward(const Tensor& x, const Tensor& y, const Stream& stream = {}) const;
  // Router only: weights fp32 [T, top_k], ids i32 [T, top_k].
  void route(const Tensor& x, const Tensor& weights, const Tensor& ids, const Stream& stream = {}) const;

  const locality::Plan& experts_plan() const { return experts_plan_; }
  Linear& gate() { return *gate_; }
  const Tensor& correction_bias() const { return bias_; }
  Linear& expert_gate_up(int64_t e) { return *gate_up_.at(e); }
  Linear& expert_down(int64_t e) { return *down_.at(e); }
  GatedMLP* shared_experts() { return shared_.get(); }  // null when n_shared_experts == 0

 private:
  // Per-child weight maps parsed from checkpoint names (shared by load validation and reload).
  struct Split {
    WeightMap gate;
    std::vector<WeightMap> gate_up, down;  // per expert
    WeightMap shared;
    Tensor bias;  // gate.e_score_correction_bias, when given
  };
  Split split_names(const WeightMap& weights) const;
  std::vector<Module*> children() const;
  void check_expert(int64_t e) const;
  void check_bias(const Tensor& t) const;
  bool experts_partitioned() const;
  // The expert GEMM stage: rows [offsets[e], offsets[e + 1]) of xg (bf16 [R, hidden], grouped by
  // expert) go through expert e's gate/up + SwiGLU into hg (bf16 [R, I]) and its down projection
  // into og (fp32 [R, hidden]); with a localized plan, one fork/join per stage across the domains.
  // NVFP4 experts run as row blocks (nvfp4_stage). offsets are host values (E + 1 of them).
  void run_experts(const Tensor& xg, const std::vector<int64_t>& offsets, const Tensor& hg, const Tensor& og,
                   const Stream& stream) const;
  // One expert stage as row blocks (ops::nvfp4_gemm_row_blocks; on CUDA, experts with equal row
  // counts may share a launch): the `active` experts' NVFP4 gate/up (+ SwiGLU) and down weights,
  // unpartitioned (p < 0) or partition p's shards, and the columns of hg and og they write. False
  // where an expert's linears are not single NVFP4 weights (then they run one by one).
  struct Nvfp4Stage {
    std::vector<ops::Nvfp4RowBlock> gate_up, down;
    int64_t h0 = 0, h1 = 0, o0 = 0, o1 = 0;
  };
  bool nvfp4_stage(int p, const std::vector<int64_t>& offsets, const std::vector<int64_t>& active,
                   Nvfp4Stage* st) const;
  // The output columns partition p of an expert linear writes (every expert's plan splits
  // alike), or all of them for p < 0.
  static void expert_columns(const Linear& l, int p, int64_t* c0, int64_t* c1);

  // Decode: with few (token, choice) pairs per expert, NVFP4 experts take their weights by the
  // routed ids on the device (ops::nvfp4_gemm_indexed), so the offsets are never read back and
  // nothing waits for the device; partitioned experts do so per partition, each on its shards
  // and its columns of the two stages' outputs, inside the same fork/joins as the grouped path.
  // Null where that does not apply: an expert's linears are not single NVFP4 weights (per
  // partition), more than one pair in 2 experts would be routed (each pair reads its expert's
  // weight, so tokens sharing one would read it again), or LOCUS_MOE_INDEXED=0.
  struct IndexedPart {
    IndexedPart(std::vector<const ops::Nvfp4Weight*> gu, std::vector<const ops::Nvfp4Weight*> dn)
        : gate_up(std::move(gu)), down(std::move(dn)) {}
    ops::Nvfp4WeightSet gate_up, down;
    int64_t h0 = 0, h1 = 0, o0 = 0, o1 = 0;  // the columns of the gate/up and down outputs
  };
  struct IndexedExperts {
    std::vector<std::unique_ptr<IndexedPart>> parts;  // one per partition, or one (unpartitioned)
    // The shared expert as a set of one weight (shared_in_launch), or null.
    std::unique_ptr<IndexedPart> shared;
  };
  // The shared expert's NVFP4 units where it can ride in the routed experts' by-id launches
  // (a second product whose ids are a column of zeros): one expert of the routed experts' shapes,
  // a fused gate/up unit, unpartitioned, with the routed experts unpartitioned too. False otherwise.
  bool shared_in_launch(const ops::Nvfp4Weight** gate_up, const ops::Nvfp4Weight** down) const;
  const IndexedExperts* indexed_experts(int64_t tokens) const;
  // y from the routing (w, ids) through indexed_experts(T) and the shared experts.
  void forward_indexed(const IndexedExperts& ix, const Tensor& x, const Tensor& w, const Tensor& ids, const Tensor& y,
                       const Stream& stream) const;
  // The slot map of pairs in (token, choice) order (slot[t, j] = t * k + j) for T tokens, on
  // the experts' device; made once per T.
  const Tensor& pair_order_slots(int64_t tokens) const;
  // i32 [T, 1] zeros on the experts' device (the shared expert's ids in the routed launches); made
  // once per T.
  const Tensor& zero_ids(int64_t tokens) const;
  // The i32 [T, cols] table `cache` holds for T tokens, made on first use on the experts' device:
  // each element its row-major index, or zeros.
  const Tensor& token_table(std::map<int64_t, Tensor>& cache, int64_t tokens, int64_t cols,
                            bool row_major_index) const;

  MoeConfig cfg_;
  std::unique_ptr<Linear> gate_;
  Tensor bias_;  // fp32 [E]
  std::vector<std::unique_ptr<Linear>> gate_up_, down_;
  std::unique_ptr<GatedMLP> shared_;
  locality::Plan experts_plan_;
  bool localized_ = false;
  mutable std::unique_ptr<IndexedExperts> indexed_;      // rebuilt when the expert weights move
  mutable std::map<int64_t, Tensor> pair_order_slots_;  // by token count
  mutable std::map<int64_t, Tensor> zero_ids_;          // by token count
};

// Whether MoE decode may take NVFP4 experts by id on the device (MoE's indexed_experts):
// LOCUS_MOE_INDEXED (default on where at most one (token, choice) pair in 2 experts is routed;
// "0" off; "all": at any batch, an expert chosen by several tokens then streamed once per token);
// tests and benchmarks switch it (set_moe_indexed_experts(true) is the default mode).
bool moe_indexed_experts();
void set_moe_indexed_experts(bool on);

}  // namespace locus::modules
