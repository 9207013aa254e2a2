// Module-name patterns shared by the locality policy's excludes and the ModelOpt quantization
// excludes: fnmatch(3) semantics without FNM_PATHNAME ('*' also matches '.'), applied to the
// name and to each of its dotted prefixes, so "model.layers.0.self_attn*" and
// "model.layers.0.self_attn" both cover "model.layers.0.self_attn.q_a_proj".
#pragma once
#include <string>

namespace locus {

bool module_pattern_matches(const std::string& pattern, const std::string& name);

}  // namespace locus
