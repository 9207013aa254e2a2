// Planner: per-op decision to partition across locality domains, with the layout when it does
// and a human-readable reason when it does not (DESIGN.md section 3).
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

struct Plan {
  bool enabled = false;
  std::string reason;        // why disabled ("" when enabled); e.g. "K=7169 is not a multiple of 8 (bf16 needs 16-byte rows)"
  OpKind op = OpKind::kBf16Linear;
  int num_partitions = 1;
  PartitionedLayout layout;  // valid when enabled
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
  // MoE expert GEMMs: every expert's gate/up (fused SwiGLU) and down split along N per partition.
  Plan plan_moe(const std::string& module, int64_t num_experts, int64_t hidden, int64_t intermediate,
                QuantKind quant) const;

  const LocalityDomainPolicy& policy() const { return policy_; }
  const Topology& topology() const { return topology_; }
  int partitions() const;  // policy.num_partitions or the topology's count

 private:
  LocalityDomainPolicy policy_;
  Topology topology_;
};

}  // namespace locus::locality
