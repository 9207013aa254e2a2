// LocalityDomainPolicy: what the user allowed (from LlmArgs). Default: disabled.
#pragma once
#include <set>
#include <string>
#include <vector>

namespace locus::locality {

enum class OpKind { kBf16Linear, kNvfp4Linear, kBf16Bmm, kBf16Moe, kNvfp4Moe };
const char* op_kind_name(OpKind k);         // "bf16_linear", ...
OpKind op_kind_from_name(const std::string& name);  // throws naming the unknown op

// Modules whose outputs the design keeps whole regardless of the policy, and why. MLA's
// kv_a_proj_with_mqa writes [c_kv | k_pe], which feeds the latent cache shared by all heads.
inline constexpr const char* kKvAProjUnpartitionedReason =
    "kv_a_proj_with_mqa is never partitioned (its c_kv | k_pe output feeds the shared latent cache)";

struct LocalityDomainPolicy {
  bool enabled = false;
  int num_partitions = 0;  // 0 = the topology's domain count
  std::set<OpKind> allowed_ops = {OpKind::kBf16Linear, OpKind::kNvfp4Linear, OpKind::kBf16Bmm,
                                  OpKind::kBf16Moe, OpKind::kNvfp4Moe};
  // Patterns over module names ("model.layers.3.mlp.shared_experts.gate_up_proj"), matched as
  // core/module_pattern.h says (fnmatch on the name and each dotted prefix).
  std::vector<std::string> exclude_modules = {"*shared_experts*", "*.mlp.gate", "lm_head"};

  // The first pattern that excludes `module`, or "" when none does.
  std::string excluding_pattern(const std::string& module) const;
  // Throws an Error naming the bad field (num_partitions < 0 or above kMaxLocalityDomains).
  void validate() const;
  // "{bf16_linear, nvfp4_linear}" in OpKind order, for messages.
  std::string allowed_ops_str() const;
};

// Every OpKind, in declaration order.
inline constexpr OpKind kAllOpKinds[] = {OpKind::kBf16Linear, OpKind::kNvfp4Linear, OpKind::kBf16Bmm,
                                         OpKind::kBf16Moe, OpKind::kNvfp4Moe};

}  // namespace locus::locality
