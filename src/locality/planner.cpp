#include "locality/planner.h"

#include "core/error.h"

namespace locus::locality {

const char* weight_mode_name(WeightMode m) {
  switch (m) {
    case WeightMode::kVanilla: return "VANILLA";
    case WeightMode::kFusedGateUp: return "FUSED_GATE_UP";
    case WeightMode::kFusedQkv: return "FUSED_QKV";
  }
  return "invalid";
}

const char* quant_kind_name(QuantKind q) {
  switch (q) {
    case QuantKind::kBF16: return "bf16";
    case QuantKind::kNVFP4: return "nvfp4";
    case QuantKind::kFP8: return "fp8";
  }
  return "invalid";
}

QuantKind quant_kind_from_name(const std::string& name) {
  for (QuantKind q : {QuantKind::kBF16, QuantKind::kNVFP4, QuantKind::kFP8}) {
    if (name == quant_kind_name(q)) return q;
  }
  LOCUS_THROW("unknown quantization '", name, "' (expected bf16, nvfp4 or fp8)");
}

std::string Plan::describe() const {
  if (!enabled) return "not partitioned: " + reason;
  std::string s = "partitioned " + layout.describe();
  if (!down_layout.parts.empty()) s += "; down " + down_layout.describe();
  return s;
}

Planner::Planner(LocalityDomainPolicy policy, Topology topology)
    : policy_(std::move(policy)), topology_(std::move(topology)) {
  policy_.validate();
  LOCUS_CHECK(topology_.num_domains >= 1, "Planner: topology must have at least 1 domain, got ",
              topology_.num_domains);
}

int Planner::partitions() const { return policy_.num_partitions > 0 ? policy_.num_partitions : topology_.num_domains; }

namespace {

Plan disabled(Plan plan, std::string reason) {
  plan.enabled = false;
  plan.reason = std::move(reason);
  plan.layout = {};
  plan.down_layout = {};
  return plan;
}

int64_t k_align(QuantKind q) { return q == QuantKind::kNVFP4 ? kNvfp4KAlign : kBf16KAlign; }
int64_t row_align(QuantKind q) { return q == QuantKind::kNVFP4 ? kNvfp4RowAlign : kBf16RowAlign; }

std::string k_reason(const char* what, int64_t k, QuantKind q) {
  if (q == QuantKind::kNVFP4) {
    return str(what, " K=", k, " is not a multiple of ", kNvfp4KAlign, " (NVFP4 packed-K alignment: 16-byte rows)");
  }
  return str(what, " K=", k, " is not a multiple of ", kBf16KAlign, " (bf16 rows need 16-byte alignment)");
}

}  // namespace

// Rules 1, 2, 4 and 5 (shared by every op); returns the reason or "".
std::string Planner::common_reason(const std::string& module, OpKind op) const {
  if (!policy_.enabled) return "locality domains are disabled by the policy (enable with --enable-locality-domains)";
  if (policy_.num_partitions == 1) return "policy num_partitions=1: nothing to split across";
  if (partitions() < 2) {
    return str("only 1 locality domain (topology from ", topology_.source,
               ") and policy num_partitions is not above 1: nothing to split across");
  }
  if (!policy_.allowed_ops.count(op)) {
    return str("op ", op_kind_name(op), " is not in the policy's allowed_ops ", policy_.allowed_ops_str());
  }
  if (const std::string pattern = policy_.excluding_pattern(module); !pattern.empty()) {
    return str("module '", module, "' is excluded by policy pattern '", pattern, "'");
  }
  return "";
}

Plan Planner::plan_linear(const std::string& module, int64_t in_features, int64_t out_features, QuantKind quant,
                          WeightMode mode) const {
  LOCUS_CHECK(in_features >= 1 && out_features >= 1, "plan_linear(", module, "): in_features and out_features must be positive, got ",
              in_features, " and ", out_features);
  Plan plan;
  plan.module = module;
  plan.num_partitions = partitions();
  plan.op = quant == QuantKind::kNVFP4 ? OpKind::kNvfp4Linear : OpKind::kBf16Linear;
  if (!policy_.enabled || partitions() < 2) return disabled(plan, common_reason(module, plan.op));
  if (quant == QuantKind::kFP8) {
    return disabled(plan, "quantization fp8 is not supported by locality-domain Linear (supported: bf16, nvfp4)");
  }
  if (std::string why = common_reason(module, plan.op); !why.empty()) return disabled(plan, why);
  if (mode != WeightMode::kVanilla && mode != WeightMode::kFusedGateUp) {
    return disabled(plan, str("weight mode ", weight_mode_name(mode), " is not supported (supported: VANILLA, FUSED_GATE_UP)"));
  }
  if (in_features % k_align(quant) != 0) return disabled(plan, k_reason("in_features", in_features, quant));
  const bool fused = mode == WeightMode::kFusedGateUp;
  std::string why;
  auto layout = make_partitioned_layout(out_features, plan.num_partitions, row_align(quant), fused, &why);
  if (!layout) return disabled(plan, str(fused ? "intermediate size (FUSED_GATE_UP): " : "out_features: ", why));
  plan.enabled = true;
  plan.layout = std::move(*layout);
  return plan;
}

Plan Planner::plan_bmm(const std::string& module, int64_t heads, int64_t k, int64_t n) const {
  LOCUS_CHECK(heads >= 1 && k >= 1 && n >= 1, "plan_bmm(", module, "): heads, K and N must be positive, got ", heads,
              ", ", k, ", ", n);
  Plan plan;
  plan.module = module;
  plan.num_partitions = partitions();
  plan.op = OpKind::kBf16Bmm;
  if (std::string why = common_reason(module, plan.op); !why.empty()) return disabled(plan, why);
  if (k % kBmmAlign != 0) return disabled(plan, k_reason("bmm", k, QuantKind::kBF16));
  if (n % kBmmAlign != 0) {
    return disabled(plan, str("bmm N=", n, " is not a multiple of ", kBmmAlign, " (bf16 output rows need 16-byte alignment)"));
  }
  if (heads < plan.num_partitions) {
    return disabled(plan, str("heads=", heads, " are fewer than the ", plan.num_partitions,
                              " partitions (a partition would get no head)"));
  }
  std::string why;
  auto layout = make_partitioned_layout(heads, plan.num_partitions, 1, false, &why);
  LOCUS_CHECK(layout.has_value(), "plan_bmm: head split failed: ", why);  // align 1 never pads
  plan.enabled = true;
  plan.layout = std::move(*layout);
  return plan;
}

Plan Planner::plan_moe(const std::string& module, int64_t num_experts, int64_t hidden, int64_t intermediate,
                       QuantKind quant) const {
  LOCUS_CHECK(num_experts >= 1 && hidden >= 1 && intermediate >= 1, "plan_moe(", module,
              "): num_experts, hidden and intermediate must be positive, got ", num_experts, ", ", hidden, ", ",
              intermediate);
  Plan plan;
  plan.module = module;
  plan.num_partitions = partitions();
  plan.op = quant == QuantKind::kNVFP4 ? OpKind::kNvfp4Moe : OpKind::kBf16Moe;
  if (!policy_.enabled || partitions() < 2) return disabled(plan, common_reason(module, plan.op));
  if (quant == QuantKind::kFP8) {
    return disabled(plan, "quantization fp8 is not supported by locality-domain MoE (supported: bf16, nvfp4)");
  }
  if (std::string why = common_reason(module, plan.op); !why.empty()) return disabled(plan, why);
  if (hidden % k_align(quant) != 0) return disabled(plan, k_reason("expert gate_up hidden", hidden, quant));
  if (intermediate % k_align(quant) != 0) return disabled(plan, k_reason("expert down intermediate", intermediate, quant));
  std::string why;
  auto gate_up = make_partitioned_layout(intermediate, plan.num_partitions, row_align(quant), true, &why);
  if (!gate_up) return disabled(plan, "expert gate_up intermediate: " + why);
  auto down = make_partitioned_layout(hidden, plan.num_partitions, row_align(quant), false, &why);
  if (!down) return disabled(plan, "expert down hidden: " + why);
  plan.enabled = true;
  plan.layout = std::move(*gate_up);
  plan.down_layout = std::move(*down);
  return plan;
}

}  // namespace locus::locality
