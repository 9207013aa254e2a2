// Decode steps replayed from CUDA graphs (LlmArgs::cuda_graphs): an eager step launches a few
// hundred kernels, each costing the host several microseconds, and the device idles between
// them; a replay is one launch.
//
// A step qualifies when every sequence takes one token. It then runs from device tables
// (models::DecodeTables: token ids, cache lengths and each layer's cache addresses), which the
// step copies up first, so one recorded graph serves every later step of its key: the batch size
// and a key bound (the longest sequence's keys rounded up to a power of two, at least 64), which
// sizes the attention launch. A key's first step runs eagerly from the same tables, so one-time
// work (tactic and path timing, device tables of expert weights) never lands in a capture; its
// second step records the graph, and every later one replays it. A key whose step cannot be
// captured (the MoE reads expert offsets back to the host when many pairs share experts) is
// remembered, and its steps are left to the caller's eager path. The CPU runs the same logic,
// with ops::StepGraph's CPU form (the recorded function run again), which holds the graphs to
// reading every changing input from the tables.
//
// Each graph keeps its step's scratch (its eager peak) on the device, so at most max_graphs are
// kept: recording one more drops the least recently replayed (its key records again when it
// comes back). Weights reloaded in place keep their addresses, so graphs stay valid; anything that
// moves weights (localize, rebuild after a transform) must clear() first.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/deepseek_v3.h"
#include "ops/step_graph.h"

namespace locus::runtime {

class DecodeGraphs {
 public:
  static constexpr int kDefaultMaxGraphs = 32;
  explicit DecodeGraphs(models::DeepseekV3ForCausalLM& model, int max_graphs = kDefaultMaxGraphs);
  ~DecodeGraphs();

  // Runs `batch` when it qualifies and returns its fp32 logits [B, vocab] on the model's device
  // (on CUDA a graph's output: valid until the next step); every cache then holds one more
  // token. Returns an undefined tensor, with nothing run or changed, when the step is not for
  // graphs (a sequence with several tokens, a key that could not be captured). Errors as
  // models::DeepseekV3ForCausalLM::forward (checked before anything runs).
  Tensor step(const std::vector<models::SequenceStep>& batch);

  struct Stats {
    int64_t eager_steps = 0;  // first steps of a key, run from the tables without a graph
    int64_t recorded = 0;     // graphs recorded
    int64_t replays = 0;      // steps run by a graph replay
    int64_t declined = 0;     // steps left to the caller
    int64_t evicted = 0;      // graphs dropped to keep at most max_graphs
    std::string capture_failure;  // why the last key that failed could not be captured
  };
  const Stats& stats() const { return stats_; }
  // Drops every graph and table (their next steps start over with an eager one).
  void clear();

  // The key bound of a step whose longest sequence holds `max_length` tokens before it.
  static int64_t key_bound(int64_t max_length);

 private:
  struct Entry;
  using Key = std::pair<int64_t, int64_t>;  // (batch size, key bound)
  Entry& entry(const Key& key);
  void fill_tables(Entry& e, const std::vector<models::SequenceStep>& batch);

  void make_room();  // drops the least recently used graph when max_graphs are recorded

  models::DeepseekV3ForCausalLM& model_;
  int max_graphs_;
  int64_t clock_ = 0;  // steps run, for least-recently-used eviction
  std::map<Key, std::unique_ptr<Entry>> entries_;
  Stats stats_;
};

}  // namespace locus::runtime
