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
// Greedy decode can chain steps on the device: greedy_tokens() writes a step's argmax into the
// ids of its key's tables (as well as bringing it to the host), every step leaves its tables'
// lengths one further, so the next step of the same key and caches (step_chained) needs nothing
// from the host and may be launched before the previous step's tokens are read (BatchStepper's
// lookahead). A chained step replays a second graph of its key, without the uploads.
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

  // The greedy tokens of the last step (its logits, as step() or step_chained() returned them):
  // queues the argmax of each row into the ids of that step's tables, and its copy to the host.
  class GreedyTokens {
   public:
    GreedyTokens(GreedyTokens&&) noexcept;
    ~GreedyTokens();
    // Waits for the copy: one token per row. Error where every logit of a row is NaN.
    std::vector<int32_t> wait();

   private:
    friend class DecodeGraphs;
    GreedyTokens(const Tensor& small, int64_t rows, int64_t vocab);
    struct Copy;  // the readback in flight (or, on the CPU, the values taken at once)
    std::unique_ptr<Copy> copy_;
    int64_t rows_, vocab_;
  };
  GreedyTokens greedy_tokens(const Tensor& logits);

  // The step after the last one, from the device alone: its ids are the last step's greedy
  // tokens (greedy_tokens() must have been queued), its lengths the last step's plus one. Runs
  // only where the last step ran this batch's key over the same caches, which hold what it left
  // them; otherwise returns an undefined tensor and runs nothing. Host-side cache lengths advance
  // as in step(). Its ids in `batch` are not read (placeholders).
  Tensor step_chained(const std::vector<models::SequenceStep>& batch);

  struct Stats {
    int64_t eager_steps = 0;  // first steps of a key, run from the tables without a graph
    int64_t recorded = 0;     // graphs recorded
    int64_t replays = 0;      // steps run by a graph replay (chained ones included)
    int64_t chained = 0;      // steps run by step_chained
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
  Key key_of(const std::vector<models::SequenceStep>& batch) const;  // checks the caches too
  void fill_tables(Entry& e, const std::vector<models::SequenceStep>& batch);
  // Records `graph` with `body` when it is not yet; false (the key is remembered as failed) when
  // the capture fails.
  bool ensure_recorded(Entry& e, ops::StepGraph& graph, const ops::StepGraph::Body& body, bool twin = false);
  void advance_lengths(Entry& e, const std::vector<models::SequenceStep>& batch);  // host-side, after a step

  void make_room();  // drops the least recently used graph when max_graphs are recorded

  models::DeepseekV3ForCausalLM& model_;
  int max_graphs_;
  int64_t clock_ = 0;  // steps run, for least-recently-used eviction
  std::map<Key, std::unique_ptr<Entry>> entries_;
  // The last step's entry (null after clear() or a declined step) and whether its greedy tokens
  // were queued since: what step_chained needs.
  Entry* last_ = nullptr;
  bool last_tokens_queued_ = false;
  Stats stats_;
};

}  // namespace locus::runtime
