// Planner: per-op decision to partition across locality domains, with the layout when it does
// and a human-readable reason when it does not (DESIGN.md section 3).
//
// Rules, checked in this order (the first failing one is the reason):
//   1. the policy is enabled;
//   2. there is something to split: policy.num_partitions > 1, or (num_partitions unset) the
//      topology has more than one domain. Partition p runs on domain p % num_domains;
//   3. the quantization has a partitioned kernel (bf16, nvfp4; fp8 is refused);
//   4. the op kind is in policy.allowed_ops;
//   5. the module is not excluded by a policy pattern;
//   6. (Linear) the weight mode is VANILLA or FUSED_GATE_UP (FUSED_QKV is refused);
//   7. K is aligned: bf16 8 elements (16-byte rows), nvfp4 32 elements (16-byte packed rows);
//   8. the N split is padding-free: every partition's rows are a multiple of the row alignment
//      (bf16 16 rows; nvfp4 128 rows, see kNvfp4RowAlign), and no partition is empty.
// Any partition count works (not hard-wired to 2); the first partitions take the extra blocks.
//
// MoE (plan_moe): both expert GEMMs are split along their output dimension N, like
// TensorRT-LLM, so every output element is still one full-K dot product in the same order as
// the unpartitioned kernel and the result is bit-identical:
//   - gate_up [2I, hidden]: partition p holds gate rows [i0, i1) and the matching up rows
//     [I + i0, I + i1) of every expert, so SwiGLU is fused locally and p produces intermediate
//     columns [i0, i1) (Plan::layout, fused_gate_up);
//   - down [hidden, I]: partition p holds hidden rows [h0, h1) of every expert over the full K = I
//     and writes output columns [h0, h1) (Plan::down_layout). It therefore reads the whole
//     intermediate activation, i.e. a join between the two GEMMs; that activation is tokens x I
//     (small next to the weights), while every weight byte stays in its own domain.
//   Splitting down along K instead would keep the activation local but needs a cross-partition
//   sum of fp32 partials, which changes the summation order (no longer exact) and costs a
//   reduction; we do not do that.
#pragma once
#include <cstdint>
#include <string>

#include "locality/layout.h"
#include "locality/policy.h"
#include "locality/topology.h"

namespace locus::locality {

enum class WeightMode { kVanilla, kFusedGateUp, kFusedQkv };
enum class QuantKind { kBF16, kNVFP4, kFP8 };
const char* weight_mode_name(WeightMode m);  // "VANILLA", "FUSED_GATE_UP", "FUSED_QKV"
const char* quant_kind_name(QuantKind q);    // "bf16", "nvfp4", "fp8"
QuantKind quant_kind_from_name(const std::string& name);  // throws naming the unknown kind

// Alignment rules (elements / rows).
inline constexpr int64_t kBf16KAlign = 8;     // 8 bf16 = 16-byte weight and activation rows
inline constexpr int64_t kNvfp4KAlign = 32;   // 32 e2m1 = 16 packed bytes per row
inline constexpr int64_t kBf16RowAlign = 16;  // rows per partition (output slices 32-byte aligned)
// NVFP4 weights need 32-row partitions; DESIGN.md also asks scale rows in multiples of 128.
// Our checkpoint scales are linear row-major (a partition's scale rows are exactly its weight
// rows), but the CUDA kernel's tiled layout groups scales in 128-row tiles: with 128-row
// partitions every shard is a whole number of tiles, so a shard can be tiled on its own without
// padding and matches the same rows of the full tiled weight. Hence lcm(32, 128) = 128 rows.
inline constexpr int64_t kNvfp4RowAlign = 128;
inline constexpr int64_t kBmmAlign = 8;       // BMM K and N: 16-byte bf16 rows

struct Plan {
  bool enabled = false;
  std::string reason;        // why disabled ("" when enabled); e.g. "K=7169 is not a multiple of 8 (bf16 needs 16-byte rows)"
  OpKind op = OpKind::kBf16Linear;
  int num_partitions = 1;
  std::string module;        // the module planned
  PartitionedLayout layout;  // valid when enabled (plan_moe: the experts' fused gate_up split)
  PartitionedLayout down_layout;  // plan_moe only: the experts' down_proj split along hidden
  std::string describe() const;  // "partitioned 2 x [...]" or "not partitioned: <reason>"
};

class Planner {
 public:
  Planner(LocalityDomainPolicy policy, Topology topology);

  // A Linear y = x W^T with W [out_features(, x2 for FUSED_GATE_UP), in_features].
  // For kFusedGateUp, out_features is the intermediate size I (the weight has 2I rows).
  Plan plan_linear(const std::string& module, int64_t in_features, int64_t out_features, QuantKind quant,
                   WeightMode mode) const;
  // MLA absorbed BMMs [B=heads, M, K] x [B, K, N]: split over heads.
  Plan plan_bmm(const std::string& module, int64_t heads, int64_t k, int64_t n) const;
  // MoE expert GEMMs: every expert's gate/up (fused SwiGLU) and down split along N per partition
  // (see the top of this file). `intermediate` is the per-expert moe_intermediate_size.
  Plan plan_moe(const std::string& module, int64_t num_experts, int64_t hidden, int64_t intermediate,
                QuantKind quant) const;

  const LocalityDomainPolicy& policy() const { return policy_; }
  const Topology& topology() const { return topology_; }
  int partitions() const;  // policy.num_partitions or the topology's count

 private:
  std::string common_reason(const std::string& module, OpKind op) const;  // rules 1, 2, 4, 5 or ""

  LocalityDomainPolicy policy_;
  Topology topology_;
};

}  // namespace locus::locality
