// A debugging aid: with LOCUS_ROUTING_DUMP=FILE every MoE routing decision is appended to FILE (the
// router's fp32 logits, its correction bias, the routing config and the chosen expert ids), so
// that two runs of the same prompts (CUDA and CPU, say) can be compared layer by layer with
// tools/gpu/compare_routing.py: which tokens chose other experts, and by how small a margin.
// Off (the default), it costs one check per MoE call.
//
// LOCUS_ROUTING_REPLAY=FILE (CPU backend) does the reverse: each MoE call takes the expert ids of
// its layer's next record in FILE (a dump of the same prompts, e.g. from a CUDA run) instead of
// choosing them, and computes the routing weights from its own router logits. So a CPU run can
// follow another run's routing past a near-tie, and the two runs' logits can then be compared.
#pragma once
#include <map>
#include <mutex>
#include <string>
#include <vector>

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

// The expert ids of a routing dump's records, per layer in the order they were written.
class RoutingReplay {
 public:
  // Reads every record of the dump at `path`; a missing file or a malformed record is an Error
  // naming the file and the record.
  explicit RoutingReplay(const std::string& path);
  // ops::moe_route_forced with the ids of `layer`'s next record: weights fp32 [T, k] and ids i32
  // [T, k] (CPU tensors). An Error when the layer has no record left or the record's tokens,
  // experts or top_k differ from this call's.
  void route(const std::string& layer, const Tensor& logits, const ops::MoeRoutingConfig& cfg, const Tensor& weights,
             const Tensor& ids);

 private:
  struct Record {
    int64_t tokens = 0, experts = 0, top_k = 0;
    std::vector<int32_t> ids;  // [tokens, top_k]
  };
  std::string path_;
  std::map<std::string, std::vector<Record>> records_;  // by layer
  std::map<std::string, size_t> next_;                 // records used so far, by layer
  std::mutex mu_;
};

// The replay of LOCUS_ROUTING_REPLAY's file (read at the first call), or null when it is unset.
RoutingReplay* routing_replay();

}  // namespace locus::modules
