// Linear: y = x W^T (+ bias), the weight owner behind every projection of the model.
//
// Weight modes
// - VANILLA: W [out_features, in_features].
// - FUSED_GATE_UP: W [2I, K] holding gate rows [0, I) then up rows [I, 2I); out_features = I.
//   forward() applies SwiGLU (y [M, I] = silu(x Wg^T) * (x Wu^T)); forward_gate_up() returns
//   the raw [gate | up] product [M, 2I]. Partitioned, partition p holds the matching gate and
//   up rows of its range, so SwiGLU stays local to the partition.
// Weight formats: BF16, or NVFP4 (ModelOpt layout, weight-only; see ops/nvfp4.h).
//
// Pieces accepted by load()/reload() (relative names):
//   BF16  VANILLA       "weight" bf16|fp32 [N, K]                 (+ "bias" [N] when configured)
//   BF16  FUSED_GATE_UP "gate" and "up" [I, K] (aliases "gate.weight", "up.weight"),
//                       or "weight" [2I, K] already fused (HF in-memory experts.gate_up_proj[e])
//   NVFP4 VANILLA       "weight" u8|fp4x2 [N, K/2], "weight_scale" e4m3 [N, K/16],
//                       "weight_scale_2" fp32 0-d or [1]; "input_scale" is accepted and ignored
//                       (weight-only: activations stay BF16)
//   NVFP4 FUSED_GATE_UP "gate.weight", "gate.weight_scale", "gate.weight_scale_2" and the same
//                       three for "up." (or "weight"/"weight_scale" [2I, ..] + one "weight_scale_2")
//
// NVFP4 gate and up with different global scales (weight_scale_2): values are kept exact by
// keeping one scale per half. transform() picks the representation:
//   - equal scales: one fused weight, forward uses the fused NVFP4 SwiGLU epilogue;
//   - different scales: gate and up are two weights with their own scales; forward computes
//     both products in fp32 and applies ops::swiglu (same result up to the one final rounding).
// A reload must keep the relation (equal / different) chosen at transform(), otherwise it throws
// before writing anything (the storage layouts differ).
//
// Plans: built at construction from the context's planner (plan_linear with the module name,
// so policy excludes apply). partitionable = false (router gate, kv_a_proj_with_mqa) records a
// disabled plan with the given reason. set_plan() lets a composite (MoE) impose its own plan.
#pragma once
#include <string>
#include <vector>

#include "core/stream.h"
#include "modules/module.h"
#include "ops/nvfp4.h"

namespace locus::modules {

struct LinearConfig {
  int64_t in_features = 0;
  int64_t out_features = 0;  // FUSED_GATE_UP: the intermediate size I (the weight has 2I rows)
  locality::QuantKind quant = locality::QuantKind::kBF16;     // kBF16 or kNVFP4
  locality::WeightMode mode = locality::WeightMode::kVanilla;  // kVanilla or kFusedGateUp
  bool bias = false;                                           // VANILLA only
  bool partitionable = true;
  std::string unpartitioned_reason = "module is never partitioned";  // used when !partitionable
};

class Linear : public Module {
 public:
  Linear(ModuleContext ctx, LinearConfig cfg);

  const LinearConfig& config() const { return cfg_; }
  int64_t in_features() const { return cfg_.in_features; }
  int64_t out_features() const { return cfg_.out_features; }
  int64_t weight_rows() const;  // N, or 2I for FUSED_GATE_UP

  // ---- lifecycle (see module.h) ----
  void load(const std::string& piece, const Tensor& t) override;
  std::vector<std::string> missing_pieces() const override;
  void transform() override;
  void localize() override;
  void reload(const WeightMap& weights) override;
  void rebuild() override;
  MemoryUsage memory() const override;
  void collect_plans(std::vector<PlanRecord>* out) const override;

  // ---- plan ----
  const locality::Plan& plan() const { return plan_; }
  // Replaces the plan (before localize(); throws once localized). The layout must cover
  // out_features (fused_gate_up for FUSED_GATE_UP) and have at most runtime->num_domains() parts.
  void set_plan(locality::Plan plan);
  // True once localized with an enabled plan: forward runs one partition per domain.
  bool partitioned() const;
  int num_partitions() const;  // 1 when not partitioned
  // NVFP4 FUSED_GATE_UP only: true when gate and up keep separate global scales.
  bool per_half_scales() const { return per_half_; }

  // ---- forward (x bf16 [M, K] row-major; y bf16 or fp32, may be a column slice of a wider tensor) ----
  // VANILLA: y [M, N] = x W^T + bias. FUSED_GATE_UP: y [M, I] = swiglu.
  void forward(const Tensor& x, const Tensor& y, const Stream& stream = {}) const;
  // FUSED_GATE_UP only: y [M, 2I] = [x Wg^T | x Wu^T] (the unfused path; y fp32 keeps it exact).
  void forward_gate_up(const Tensor& x, const Tensor& y, const Stream& stream = {}) const;
  // Partition p only, on `stream`: writes the columns partition p owns of the full-width y
  // (VANILLA [n0, n1); FUSED_GATE_UP the SwiGLU columns [n0, n1) of y [M, I]). Needs partitioned().
  // For composites (MoE) that run many Linears inside one fork/join.
  void forward_partition(int p, const Tensor& x, const Tensor& y, const Stream& stream) const;

  // ---- inspection (tests, `locus plan`) ----
  const Tensor& weight() const { return full_; }  // BF16 full weight; undefined once localized
  const std::vector<Tensor>& shards() const { return shards_; }  // BF16 shards, one per partition
  const Tensor& bias() const { return bias_; }
  // Data pointers of everything the module holds for its weights (full or shards, scales):
  // stable across reload().
  std::vector<const void*> weight_data_ptrs() const;
  // BF16: a fresh contiguous copy of the full weight [rows, K], assembled from the shards when
  // localized (MLA re-derives its absorbed weights from it).
  Tensor gather_weight() const;

 private:
  void check_forward_ready(const char* what) const;
  void validate_piece(const std::string& piece, const Tensor& t) const;
  void write_piece(const std::string& canonical, const Tensor& t);
  std::string canonical_piece(const std::string& piece) const;
  std::vector<std::string> required_pieces() const;
  void apply_strict_guard() const;
  void build_nvfp4_views();
  Stream partition_stream(int p) const;

  LinearConfig cfg_;
  locality::Plan plan_;

  // BF16
  Tensor full_;                 // [rows, K] on the device, domain -1 (released by localize)
  std::vector<Tensor> shards_;  // [2 r_p or r_p, K] in domain p
  Tensor bias_;                 // [N], kept whole

  // NVFP4: packed/scales in the checkpoint (kLinear) layout as staged, plus device weights.
  Tensor q_packed_, q_scales_;          // [rows, K/2], [rows, K/16] staged (host, kLinear)
  float g_first_ = 0.f, g_second_ = 0.f;  // weight_scale_2 of the whole (or gate) and up halves
  bool have_g_first_ = false, have_g_second_ = false;
  bool per_half_ = false;
  // Device weights: index 0 = full (not partitioned) or one entry per partition.
  // Each unit: fused (one Nvfp4Weight) or per-half (gate, up).
  std::vector<ops::Nvfp4Weight> nv_fused_;
  std::vector<ops::Nvfp4Weight> nv_gate_, nv_up_;
  std::vector<bool> loaded_;     // per required piece
  std::vector<std::string> piece_names_;
};

}  // namespace locus::modules
