// runtime::DecodeGraphs: per key, tables staged on the host before each step and uploaded by the
// step itself (the graph's first copy), an eager first step, then a recorded graph replayed on the
// default stream; host-side cache lengths advanced after.
#include "runtime/decode_graphs.h"

#include <algorithm>

#include "core/error.h"
#include "core/host_profile.h"
#include "ops/host_upload.h"

namespace locus::runtime {

// One key's graph and the device tables it reads (allocated once: the graph holds their addresses).
struct DecodeGraphs::Entry {
  models::DecodeTables tables;   // ids and lengths share one i32 buffer, [ids | lengths]
  Tensor small;                  // i32 [2B] on the model's device
  Tensor small_host, rows_host;  // staging (page-locked for CUDA): i32 [2B], i64 [layers, B]
  bool warmed = false;           // the key's first (eager) step ran
  int64_t last_used = 0;         // DecodeGraphs::clock_ at its last step
  bool failed = false;           // its capture failed: its steps are declined
  ops::StepGraph graph;

  // The step: the staged tables up to the device (on the CPU the tables are the staging), then
  // the model from them.
  ops::StepGraph::Body body(models::DeepseekV3ForCausalLM* model) const {
    return [model, t = tables, small = small, small_host = small_host, rows_host = rows_host](const Stream& stream) {
      if (!small.device().is_cpu()) {
        ops::upload(small_host, small, stream);
        ops::upload(rows_host, t.kv_rows, stream);
      }
      return model->forward_decode_table(t, stream);
    };
  }
};

DecodeGraphs::DecodeGraphs(models::DeepseekV3ForCausalLM& model, int max_graphs)
    : model_(model), max_graphs_(max_graphs) {
  LOCUS_CHECK(max_graphs >= 1, "DecodeGraphs: max_graphs must be at least 1, got ", max_graphs);
}
DecodeGraphs::~DecodeGraphs() = default;

void DecodeGraphs::clear() { entries_.clear(); }

void DecodeGraphs::make_room() {
  int recorded = 0;
  Entry* oldest = nullptr;
  for (auto& [key, e] : entries_) {
    if (!e->graph.recorded()) continue;
    ++recorded;
    if (!oldest || e->last_used < oldest->last_used) oldest = e.get();
  }
  if (recorded < max_graphs_ || !oldest) return;
  oldest->graph.clear();  // its tables stay; the key records again when it comes back
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
    e->small = dev.is_cpu() ? e->small_host : Tensor::empty({2 * B}, DType::kI32, dev);
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

Tensor DecodeGraphs::step(const std::vector<models::SequenceStep>& batch) {
  model_.check_step(batch);
  const Device dev = model_.options().device;
  int64_t max_length = 0;
  for (const models::SequenceStep& s : batch) {
    if (s.ids.size() != 1) {
      ++stats_.declined;
      return {};
    }
    // Every layer's cache must be one contiguous block on the model's device (the tables hold
    // row 0's address and the ops step by the row width).
    for (const modules::MlaKvCache& c : s.cache->layers)
      LOCUS_CHECK(c.latent.is_contiguous() && c.latent.device() == dev, "decode graphs: a KV cache is ",
                  c.latent.describe(), ", not a contiguous tensor on ", dev.name());
    max_length = std::max(max_length, s.cache->length());
  }
  Entry& e = entry({static_cast<int64_t>(batch.size()), key_bound(max_length)});
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
  if (!e.warmed) {
    logits = e.body(&model_)(Stream{dev, nullptr});
    e.warmed = true;
    ++stats_.eager_steps;
  } else {
    if (!e.graph.recorded()) {
      HostProfileScope profile("decode graphs: record");
      make_room();
      try {
        e.graph.record(dev, e.body(&model_));
        ++stats_.recorded;
      } catch (const Error& err) {
        e.failed = true;
        stats_.capture_failure = err.what();
        ++stats_.declined;
        return {};
      }
    }
    HostProfileScope profile("decode graphs: replay");
    logits = e.graph.replay(Stream{dev, nullptr});
    ++stats_.replays;
  }
  for (const models::SequenceStep& s : batch)
    for (modules::MlaKvCache& c : s.cache->layers) ++c.length;
  return logits;
}

}  // namespace locus::runtime
