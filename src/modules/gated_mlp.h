// GatedMLP: down( silu(gate(x)) * up(x) ), the dense DeepSeek MLP and the shared experts.
// gate and up are one FUSED_GATE_UP Linear ("<name>.gate_up_proj"), down a VANILLA Linear
// ("<name>.down_proj"); each is planned on its own.
//
// SwiGLU paths:
// - fused (default): the gate/up Linear's SwiGLU epilogue, partitioned when its plan is enabled
//   (each partition holds matching gate and up rows, so SwiGLU stays local to it);
// - unfused fallback (gemm into an fp32 [M, 2I] buffer, then ops::swiglu): used when the fused
//   SwiGLU path is refused: the planner refused the fused gate/up split but accepted [gate | up]
//   as plain rows (Linear::unfused_split(); SwiGLU then runs after the join), NVFP4 gate/up with
//   different global scales, or fuse_swiglu = false.
//   Rounding happens once from fp32 in both paths.
//
// Checkpoint names (relative): gate_proj.*, up_proj.*, down_proj.* with the Linear pieces
// (weight, and for NVFP4 weight_scale, weight_scale_2, input_scale).
#pragma once
#include <memory>

#include "modules/linear.h"

namespace locus::modules {

struct GatedMlpConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  locality::QuantKind quant = locality::QuantKind::kBF16;
  bool fuse_swiglu = true;
};

class GatedMLP : public Module {
 public:
  GatedMLP(ModuleContext ctx, GatedMlpConfig cfg);

  const GatedMlpConfig& config() const { return cfg_; }
  LifecycleState state() const override;

  void load(const std::string& piece, const Tensor& t) override;
  std::vector<std::string> missing_pieces() const override;
  void transform() override;
  void localize() override;
  void reload(const WeightMap& weights) override;
  void check_reload(const WeightMap& weights) const override;
  void rebuild() override;
  MemoryUsage memory() const override;
  void collect_plans(std::vector<PlanRecord>* out) const override;

  // x bf16 [M, hidden] -> y bf16 or fp32 [M, hidden].
  void forward(const Tensor& x, const Tensor& y, const Stream& stream = {}) const;
  // True when forward uses the fused SwiGLU epilogue (false: gemm + ops::swiglu).
  bool uses_fused_swiglu() const;

  Linear& gate_up_proj() { return *gate_up_; }
  Linear& down_proj() { return *down_; }
  const Linear& gate_up_proj() const { return *gate_up_; }
  const Linear& down_proj() const { return *down_; }

 private:
  static std::string map_piece(const std::string& piece, bool* to_down);
  void split(const WeightMap& weights, WeightMap* gate_up, WeightMap* down) const;
  GatedMlpConfig cfg_;
  std::unique_ptr<Linear> gate_up_, down_;
};

}  // namespace locus::modules
