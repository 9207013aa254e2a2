// runtime::DecodeGraphs: per key, tables staged on the host before each step and uploaded by the
// step itself (the graph's first copy), an eager first step, then a recorded graph replayed on the
// default stream; host-side cache lengths advanced after. Greedy steps may chain: the argmax goes
// into the tables' ids and every step advances the tables' lengths on the device, so the next
// step of the key replays a second graph without the uploads.
#include "runtime/decode_graphs.h"

#include <algorithm>

#include "core/env_switch.h"
#include "core/error.h"
#include "core/host_profile.h"
#include "ops/host_readback.h"
#include "ops/host_upload.h"
#include "ops/kv_table.h"
#include "runtime/sampler.h"

namespace locus::runtime {

// One key's graphs and the device tables they read (allocated once: the graphs hold their
// addresses).
struct DecodeGraphs::Entry {
  models::DecodeTables tables;   // ids and lengths are views of `small`
  Tensor small;                  // i32 [3B] on the model's device: [ids | lengths | argmax values (fp32)]
  Tensor small_host, rows_host;  // staging (page-locked for CUDA): i32 [2B] (ids, lengths), i64 [layers, B]
  bool warmed = false;           // the key's first (eager) step ran
  int64_t last_used = 0;         // DecodeGraphs::clock_ at its last step
  bool failed = false;           // a capture failed: its steps are declined
  ops::StepGraph graph;          // uploads the staged tables, then the step
  ops::StepGraph chained;        // the step alone, from the tables as the last step left them
  std::vector<int64_t> lengths_after;  // the caches' lengths after its last step (what its tables hold)

  // The step from the tables, which it leaves for the next one: lengths one further.
  ops::StepGraph::Body forward(models::DeepseekV3ForCausalLM* model) const {
    return [model, t = tables](const Stream& stream) {
      Tensor logits = model->forward_decode_table(t, stream);
      ops::kv_lengths_advance(t.lengths, stream);
      return logits;
    };
  }
  // The staged tables up to the device (on the CPU the tables are the staging), then the step.
  ops::StepGraph::Body staged(models::DeepseekV3ForCausalLM* model) const {
    return [step = forward(model), t = tables, small = small, small_host = small_host,
            rows_host = rows_host](const Stream& stream) {
      if (!small.device().is_cpu()) {
        ops::upload(small_host, small.slice(0, 0, small_host.size(0)), stream);
        ops::upload(rows_host, t.kv_rows, stream);
      }
      return step(stream);
    };
  }
};

struct DecodeGraphs::GreedyTokens::Copy {
  Tensor taken;                               // CPU: the tokens and values as the argmax left them
  std::unique_ptr<ops::HostReadback> back;    // CUDA: their copy in flight
};

DecodeGraphs::GreedyTokens::GreedyTokens(const Tensor& small, int64_t rows, int64_t vocab)
    : copy_(new Copy), rows_(rows), vocab_(vocab) {
  // On the CPU the buffer is the next step's ids and is rewritten by it: take the values now.
  if (small.device().is_cpu()) copy_->taken = small.clone();
  else copy_->back = std::make_unique<ops::HostReadback>(small);
}
DecodeGraphs::GreedyTokens::GreedyTokens(GreedyTokens&&) noexcept = default;
DecodeGraphs::GreedyTokens::~GreedyTokens() = default;

std::vector<int32_t> DecodeGraphs::GreedyTokens::wait() {
  const Tensor host = copy_->back ? copy_->back->wait() : copy_->taken;
  const int32_t* ids = host.data<int32_t>();
  return argmax_tokens(ids, reinterpret_cast<const float*>(ids + 2 * rows_), rows_, vocab_);
}

DecodeGraphs::DecodeGraphs(models::DeepseekV3ForCausalLM& model, int max_graphs)
    : model_(model), max_graphs_(max_graphs) {
  LOCUS_CHECK(max_graphs >= 1, "DecodeGraphs: max_graphs must be at least 1, got ", max_graphs);
}
DecodeGraphs::~DecodeGraphs() = default;

void DecodeGraphs::clear() {
  entries_.clear();
  last_ = nullptr;
}

void DecodeGraphs::make_room() {
  int recorded = 0;
  ops::StepGraph* oldest = nullptr;
  int64_t oldest_use = 0;
  for (auto& [key, e] : entries_) {
    for (ops::StepGraph* g : {&e->graph, &e->chained}) {
      if (!g->recorded()) continue;
      ++recorded;
      if (!oldest || e->last_used < oldest_use) {
        oldest = g;
        oldest_use = e->last_used;
      }
    }
  }
  if (recorded < max_graphs_ || !oldest) return;
  oldest->clear();  // its tables stay; the key records again when it comes back
  ++stats_.evicted;
}

int64_t DecodeGraphs::key_bound(int64_t max_length) {
  int64_t bound = 64;
  while (bound < max_length + 1) bound *= 2;
  return bound;
}

DecodeGraphs::Entry& DecodeGraphs::entry(const Key& key) {
  auto& slot = entries_[key];
  if (!slot) {
    const int64_t B = key.first, L = model_.config().num_hidden_layers;
    const Device dev = model_.options().device;
    auto e = std::make_unique<Entry>();
    e->small_host = ops::host_staging({2 * B}, DType::kI32, dev);
    e->rows_host = ops::host_staging({L, B}, DType::kI64, dev);
    e->small = Tensor::empty({3 * B}, DType::kI32, dev);
    if (dev.is_cpu()) e->small_host = e->small.slice(0, 0, 2 * B);  // the CPU's tables are the staging
    e->tables.ids = e->small.slice(0, 0, B);
    e->tables.lengths = e->small.slice(0, B, 2 * B);
    e->tables.kv_rows = dev.is_cpu() ? e->rows_host : Tensor::empty({L, B}, DType::kI64, dev);
    e->tables.max_keys = key.second;
    slot = std::move(e);
  }
  return *slot;
}

void DecodeGraphs::fill_tables(Entry& e, const std::vector<models::SequenceStep>& batch) {
  const int64_t B = static_cast<int64_t>(batch.size()), L = model_.config().num_hidden_layers;
  // The previous step's upload may still read the staging: wait for the default stream (it has
  // usually run dry already, the caller having read the step's tokens back).
  ops::synchronize(model_.options().device);
  int32_t* small = e.small_host.data<int32_t>();
  int64_t* rows = e.rows_host.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const models::DeepseekV3Cache& cache = *batch[static_cast<size_t>(b)].cache;
    small[b] = batch[static_cast<size_t>(b)].ids[0];
    small[B + b] = static_cast<int32_t>(cache.length());
    for (int64_t l = 0; l < L; ++l)
      rows[l * B + b] = static_cast<int64_t>(
          reinterpret_cast<intptr_t>(cache.layers[static_cast<size_t>(l)].latent.data_ptr()));
  }
}

DecodeGraphs::Key DecodeGraphs::key_of(const std::vector<models::SequenceStep>& batch) const {
  model_.check_step(batch);
  const Device dev = model_.options().device;
  int64_t max_length = 0;
  for (const models::SequenceStep& s : batch) {
    // Every layer's cache must be one contiguous block on the model's device (the tables hold
    // row 0's address and the ops step by the row width).
    for (const modules::MlaKvCache& c : s.cache->layers)
      LOCUS_CHECK(c.latent.is_contiguous() && c.latent.device() == dev, "decode graphs: a KV cache is ",
                  c.latent.describe(), ", not a contiguous tensor on ", dev.name());
    max_length = std::max(max_length, s.cache->length());
  }
  return {static_cast<int64_t>(batch.size()), key_bound(max_length)};
}

bool DecodeGraphs::ensure_recorded(Entry& e, ops::StepGraph& graph, const ops::StepGraph::Body& body, bool twin) {
  if (graph.recorded()) return true;
  HostProfileScope profile("decode graphs: record");
  make_room();
  try {
    graph.record(model_.options().device, body, twin);
    ++stats_.recorded;
    return true;
  } catch (const Error& err) {
    e.failed = true;
    stats_.capture_failure = err.what();
    return false;
  }
}

void DecodeGraphs::advance_lengths(Entry& e, const std::vector<models::SequenceStep>& batch) {
  e.lengths_after.clear();
  for (const models::SequenceStep& s : batch) {
    for (modules::MlaKvCache& c : s.cache->layers) ++c.length;
    e.lengths_after.push_back(s.cache->length());
  }
}

Tensor DecodeGraphs::step(const std::vector<models::SequenceStep>& batch) {
  last_ = nullptr;  // whatever happens below, no step may chain on the one before
  for (const models::SequenceStep& s : batch) {
    if (s.ids.size() != 1) {
      model_.check_step(batch);
      ++stats_.declined;
      return {};
    }
  }
  Entry& e = entry(key_of(batch));
  if (e.failed) {
    ++stats_.declined;
    return {};
  }
  e.last_used = ++clock_;
  {
    HostProfileScope profile("decode graphs: tables staged");
    fill_tables(e, batch);
  }
  Tensor logits;
  const Device dev = model_.options().device;
  if (!e.warmed) {
    logits = e.staged(&model_)(Stream{dev, nullptr});
    e.warmed = true;
    ++stats_.eager_steps;
  } else {
    if (!ensure_recorded(e, e.graph, e.staged(&model_))) {
      ++stats_.declined;
      return {};
    }
    HostProfileScope profile("decode graphs: replay");
    logits = e.graph.replay(Stream{dev, nullptr});
    ++stats_.replays;
  }
  advance_lengths(e, batch);
  last_ = &e;
  last_tokens_queued_ = false;
  return logits;
}

DecodeGraphs::GreedyTokens DecodeGraphs::greedy_tokens(const Tensor& logits) {
  LOCUS_CHECK(last_ != nullptr, "DecodeGraphs::greedy_tokens: no step to take the tokens of");
  const int64_t B = last_->tables.ids.size(0);
  LOCUS_CHECK(logits.defined() && logits.dim() == 2 && logits.size(0) == B, "DecodeGraphs::greedy_tokens: logits must be [",
              B, ", vocab], got ", logits.defined() ? logits.describe() : std::string("an undefined tensor"));
  // Indices into the tables' ids, values into the buffer's third part; both come back together.
  auto* base = static_cast<int32_t*>(last_->small.data_ptr());
  queue_argmax_rows(logits, base, reinterpret_cast<float*>(base + 2 * B), Stream{model_.options().device, nullptr});
  last_tokens_queued_ = true;
  return GreedyTokens(last_->small, B, logits.size(1));
}

Tensor DecodeGraphs::step_chained(const std::vector<models::SequenceStep>& batch) {
  Entry* prev = last_;
  if (!prev || !last_tokens_queued_ || prev->failed) return {};
  const Key key = key_of(batch);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.get() != prev) return {};
  // The same caches, in the same order and at the same lengths, as the tables hold (the last step
  // staged or kept them).
  const int64_t B = key.first;
  const int64_t* rows = prev->rows_host.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const auto* cache = batch[static_cast<size_t>(b)].cache;
    if (rows[b] != static_cast<int64_t>(reinterpret_cast<intptr_t>(cache->layers[0].latent.data_ptr())) ||
        cache->length() != prev->lengths_after[static_cast<size_t>(b)])
      return {};
  }
  last_ = nullptr;
  // Twin executables: this replay is queued while the last one may still run (the lookahead).
  static const bool twin = env_switch_on("LOCUS_CHAINED_GRAPH_TWINS");  // an A/B switch, read once
  if (!ensure_recorded(*prev, prev->chained, prev->forward(&model_), twin)) return {};
  prev->last_used = ++clock_;
  Tensor logits;
  {
    HostProfileScope profile("decode graphs: replay");
    logits = prev->chained.replay(Stream{model_.options().device, nullptr});
  }
  ++stats_.replays;
  ++stats_.chained;
  advance_lengths(*prev, batch);
  last_ = prev;
  last_tokens_queued_ = false;
  return logits;
}

}  // namespace locus::runtime
