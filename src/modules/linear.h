// Linear: y = x W^T (+ bias), the weight owner behind every projection of the model.
//
// Weight modes
// - VANILLA: W [out_features, in_features].
// - FUSED_GATE_UP: W [2I, K] holding gate rows [0, I) then up rows [I, 2I); out_features = I.
//   forward() applies SwiGLU (y [M, I] = silu(x Wg^T) * (x Wu^T)) in the GEMM epilogue;
//   forward_unfused() gives the same through an fp32 [gate | up] buffer and ops::swiglu.
//   Partitioned, partition p holds the matching gate and up rows of its range, so SwiGLU stays
//   local to the partition.
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
// so policy excludes apply). FUSED_GATE_UP first asks for the fused split (SwiGLU local to each
// partition); when that split is refused for its shape, the [gate | up] rows are planned as a
// VANILLA weight of 2I rows instead ("unfused split", TensorRT-LLM's canonical gate | up
// mapping): each partition computes its rows into an fp32 [M, 2I] buffer, and ops::swiglu runs
// after the join. NVFP4 gate/up with separate scales only take that split when no partition
// straddles the gate/up boundary (else the plan is disabled at transform(), with the reason). partitionable = false (router gate, kv_a_proj_with_mqa) records a
// disabled plan with the given reason. set_plan() lets a composite (MoE) impose its own plan.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/stream.h"
#include "modules/module.h"
#include "ops/nvfp4.h"
#include "ops/partitioned.h"

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
  // Throws exactly as reload(weights) would, without writing anything (composites validate every
  // child before reloading any).
  void check_reload(const WeightMap& weights) const override;
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
  // FUSED_GATE_UP planned as an unfused split (see above): forward() runs forward_unfused().
  bool unfused_split() const { return unfused_split_; }

  // ---- forward (x bf16 [M, K] row-major; y bf16 or fp32, may be a column slice of a wider tensor) ----
  // VANILLA: y [M, N] = x W^T + bias. FUSED_GATE_UP: y [M, I] = swiglu.
  void forward(const Tensor& x, const Tensor& y, const Stream& stream = {}) const;
  // FUSED_GATE_UP only: the same y [M, I] through the unfused path: the gate/up products into an
  // fp32 buffer (per partition when partitioned), then ops::swiglu. Rounds once, like forward().
  void forward_unfused(const Tensor& x, const Tensor& y, const Stream& stream = {}) const;
  // Partition p only, on `stream`: writes the columns partition p owns of the full-width y
  // (VANILLA [n0, n1); FUSED_GATE_UP the SwiGLU columns [n0, n1) of y [M, I]). Needs partitioned().
  // For composites (MoE) that run many Linears inside one fork/join.
  void forward_partition(int p, const Tensor& x, const Tensor& y, const Stream& stream) const;
  // The one NVFP4 weight that forward() (p < 0, unpartitioned) or forward_partition(p) multiplies
  // by (with FUSED_GATE_UP: the fused gate/up weight or shard, SwiGLU in the epilogue), or nullptr
  // where it does more or else (BF16, a bias, gate and up apart, p not how the module runs).
  // forward_partition(p) writes columns plan().layout.parts[p] of y. Composites (MoE) hand it to
  // ops::nvfp4_gemm_row_blocks in place of forward() / forward_partition(p), with the same result.
  const ops::Nvfp4Weight* nvfp4_unit(int p = -1) const;

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
  // A complete, validated set of new weights (staging for reload), on the module's device
  // (BF16) or the host in the checkpoint layout (NVFP4).
  struct Assembled {
    Tensor dense;            // BF16 [rows, K]
    Tensor packed, scales;   // NVFP4 kLinear [rows, K/2], [rows, K/16]
    float g_first = 0.f, g_second = 0.f;
    Tensor bias;
  };
  std::string canonical_piece(const std::string& piece) const;
  std::vector<std::string> required_pieces() const;
  void check_piece(const std::string& canonical, const Tensor& t) const;  // throws naming the piece
  void stage_piece(const std::string& canonical, const Tensor& t, Assembled* into);
  Assembled assemble(const WeightMap& weights) const;
  void commit(const Assembled& a);
  void check_forward_ready(const char* what) const;
  void check_strict() const;
  ops::Nvfp4Weight host_nvfp4(const Tensor& packed, const Tensor& scales, int64_t row0, int64_t row1,
                              float global) const;
  void build_nvfp4_units(const Tensor& packed, const Tensor& scales);
  // Partition p's NVFP4 shard(s) cut from checkpoint-layout tensors: one fused unit, or gate and up.
  void nvfp4_shard(const Tensor& packed, const Tensor& scales, float g_first, float g_second, int p,
                   ops::Nvfp4Weight* fused, ops::Nvfp4Weight* gate, ops::Nvfp4Weight* up) const;
  void release_staging();
  Stream partition_stream(int p) const;
  std::vector<ops::PartitionSlice> slices() const;

  LinearConfig cfg_;
  locality::Plan plan_;
  std::map<std::string, bool> have_;  // required canonical pieces staged so far
  Assembled staged_;                  // what load() staged (EMPTY / LOADED)

  // BF16
  Tensor full_;                 // [rows, K] on the device, domain -1 (released by localize)
  std::vector<Tensor> shards_;  // per partition: [r_p, K] (VANILLA) or [2 r_p, K] (gate rows, up rows)
  Tensor bias_;                 // [N], kept whole, outside any domain

  // NVFP4: the staged checkpoint-layout weight (host) and the device weights built from it.
  Tensor q_packed_, q_scales_;           // [rows, K/2] u8, [rows, K/16] e4m3 on the host (kLinear)
  float g_first_ = 0.f, g_second_ = 0.f;  // weight_scale_2 of the weight (or gate) and of up
  bool per_half_ = false;
  bool unfused_split_ = false;  // FUSED_GATE_UP weight split as VANILLA rows of [gate | up]
  // One unit = the full weight (not partitioned) or one partition's shard.
  std::vector<ops::Nvfp4Weight> nv_;               // fused units (VANILLA, or gate/up sharing a scale)
  std::vector<ops::Nvfp4Weight> nv_gate_, nv_up_;  // per-half units (gate/up with their own scales)
};

}  // namespace locus::modules
