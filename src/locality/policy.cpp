#include "locality/policy.h"

#include "core/error.h"
#include "core/module_pattern.h"
#include "locality/topology.h"

namespace locus::locality {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::kBf16Linear: return "bf16_linear";
    case OpKind::kNvfp4Linear: return "nvfp4_linear";
    case OpKind::kBf16Bmm: return "bf16_bmm";
    case OpKind::kBf16Moe: return "bf16_moe";
    case OpKind::kNvfp4Moe: return "nvfp4_moe";
  }
  return "invalid";
}

OpKind op_kind_from_name(const std::string& name) {
  for (OpKind k : kAllOpKinds) {
    if (name == op_kind_name(k)) return k;
  }
  LOCUS_THROW("unknown locality-domain op '", name,
              "' (expected bf16_linear, nvfp4_linear, bf16_bmm, bf16_moe or nvfp4_moe)");
}

std::string LocalityDomainPolicy::excluding_pattern(const std::string& module) const {
  for (const std::string& pattern : exclude_modules) {
    if (module_pattern_matches(pattern, module)) return pattern;
  }
  return "";
}

void LocalityDomainPolicy::validate() const {
  LOCUS_CHECK(num_partitions >= 0 && num_partitions <= kMaxLocalityDomains,
              "locality-domain policy num_partitions must be 0 (the topology's domain count) or in [1, ",
              kMaxLocalityDomains, "], got ", num_partitions);
  for (const std::string& pattern : exclude_modules) {
    LOCUS_CHECK(!pattern.empty(), "locality-domain policy: an empty exclude_modules pattern would match nothing");
  }
}

std::string LocalityDomainPolicy::allowed_ops_str() const {
  std::string s = "{";
  for (OpKind k : kAllOpKinds) {
    if (!allowed_ops.count(k)) continue;
    if (s.size() > 1) s += ", ";
    s += op_kind_name(k);
  }
  return s + "}";
}

}  // namespace locus::locality
