// A debugging aid: with LOCUS_ROUTING_DUMP=FILE every MoE routing decision is appended to FILE (the
// router's fp32 logits, its correction bias, the routing config and the chosen expert ids), so
// that two runs of the same prompts (CUDA and CPU, say) can be compared layer by layer with
// tools/gpu/compare_routing.py: which tokens chose other experts, and by how small a margin.
// Off (the default), it costs one check per MoE call.
#pragma once
#include <string>

#include "core/tensor.h"
#include "ops/moe_routing.h"

namespace locus::modules {

// The file named by LOCUS_ROUTING_DUMP, or empty (read once).
const std::string& routing_dump_path();

// Appends one record to the file at `path` (waits for the device where the tensors lie). Record,
// little-endian: "LRD1", u32 name length, the name, u32 T, E, K, n_group, topk_group, scoring (0
// sigmoid, 1 softmax), has_bias; f32 logits [T, E]; f32 bias [E] if has_bias; i32 ids [T, K].
void dump_routing(const std::string& path, const std::string& layer, const Tensor& logits, const Tensor& bias,
                  const ops::MoeRoutingConfig& cfg, const Tensor& ids);

}  // namespace locus::modules
