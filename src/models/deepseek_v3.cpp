#include "models/deepseek_v3.h"

#include <map>

#include "core/host_profile.h"
#include "ops/norm.h"

namespace locus::models {
namespace {

modules::ModuleContext root_context(const DeepseekV3BuildOptions& o, const std::string& name) {
  modules::ModuleContext c;
  c.device = o.device;
  c.planner = o.planner;
  c.runtime = o.runtime;
  c.require_locality = o.require_locality;
  c.name = name;
  return c;
}

// "model.layers.12.mlp.gate.weight" -> 12 and "mlp.gate.weight"; false when not a layer name.
bool parse_layer_name(const std::string& name, int64_t* index, std::string* rest) {
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.' || j - i > 9) return false;
  *index = std::stoll(name.substr(i, j - i));
  *rest = name.substr(j + 1);
  return true;
}

}  // namespace

DeepseekV3ForCausalLM::DeepseekV3ForCausalLM(DeepseekV3Config cfg, DeepseekV3BuildOptions opts)
    : Module(root_context(opts, "")), cfg_(std::move(cfg)), opts_(std::move(opts)) {
  cfg_.validate();
  LOCUS_CHECK(opts_.max_positions >= 1, "DeepseekV3ForCausalLM: max_positions must be >= 1, got ", opts_.max_positions);
  if (opts_.is_nvfp4) {
    LOCUS_CHECK(!opts_.is_nvfp4("lm_head"), "the quantization config quantizes lm_head, which Locus keeps in BF16 ",
                "(ModelOpt excludes it: add lm_head to exclude_modules)");
  }
  embed_ = std::make_unique<modules::Embedding>(root_context(opts_, "model.embed_tokens"), cfg_.vocab_size,
                                                cfg_.hidden_size);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l)
    layers_.push_back(std::make_unique<DecoderLayer>(root_context(opts_, str("model.layers.", l)), cfg_, l,
                                                     opts_.max_positions, opts_.is_nvfp4));
  norm_ = std::make_unique<modules::RMSNorm>(root_context(opts_, "model.norm"), cfg_.hidden_size,
                                             static_cast<float>(cfg_.rms_norm_eps));
  modules::LinearConfig lc;
  lc.in_features = cfg_.hidden_size;
  lc.out_features = cfg_.vocab_size;
  lc.partitionable = false;
  lc.unpartitioned_reason = "lm_head is never partitioned (its fp32 logits feed the sampler whole)";
  lm_head_ = std::make_unique<modules::Linear>(root_context(opts_, "lm_head"), lc);
}

std::vector<modules::Module*> DeepseekV3ForCausalLM::children() const {
  std::vector<modules::Module*> c = {embed_.get()};
  for (const auto& l : layers_) c.push_back(l.get());
  c.push_back(norm_.get());
  c.push_back(lm_head_.get());
  return c;
}

modules::Module* DeepseekV3ForCausalLM::route(const std::string& name, std::string* rest) const {
  auto strip = [&](const std::string& prefix) -> bool {
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0 || name[prefix.size()] != '.')
      return false;
    *rest = name.substr(prefix.size() + 1);
    return true;
  };
  if (strip("model.embed_tokens")) return embed_.get();
  if (strip("model.norm")) return norm_.get();
  if (strip("lm_head")) return lm_head_.get();
  int64_t index = -1;
  if (parse_layer_name(name, &index, rest) && index < cfg_.num_hidden_layers)
    return layers_[static_cast<size_t>(index)].get();
  return nullptr;
}

bool DeepseekV3ForCausalLM::owns(const std::string& name) const {
  std::string rest;
  return route(name, &rest) != nullptr;
}

LifecycleState DeepseekV3ForCausalLM::state() const {
  LifecycleState s = LifecycleState::kLocalized;
  for (auto* c : children()) s = std::min(s, c->state());
  return s;
}

void DeepseekV3ForCausalLM::load(const std::string& name, const Tensor& t) {
  std::string rest;
  modules::Module* m = route(name, &rest);
  LOCUS_CHECK(m != nullptr, "unexpected tensor ", name, ": DeepSeek-V3 with ", cfg_.num_hidden_layers,
              " layers has no module for it");
  m->load(rest, t);
  // Tied embeddings: the embedding table is also the output projection.
  if (cfg_.tie_word_embeddings && m == embed_.get()) lm_head_->load(rest, t);
}

std::vector<std::string> DeepseekV3ForCausalLM::missing_pieces() const {
  std::vector<std::string> out;
  for (auto* c : children())
    for (const auto& p : c->missing_pieces()) out.push_back(c->name() + "." + p);
  return out;
}

void DeepseekV3ForCausalLM::transform() {
  const auto missing = missing_pieces();
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 8) list += str(", ... (", missing.size(), " in all)");
    LOCUS_THROW("cannot transform the model: missing tensors ", list);
  }
  for (auto* c : children()) c->transform();
}

void DeepseekV3ForCausalLM::localize() {
  for (auto* c : children()) c->localize();
}
void DeepseekV3ForCausalLM::rebuild() {
  for (auto* c : children()) c->rebuild();
}

modules::ChildWeights DeepseekV3ForCausalLM::split_by_child(const modules::WeightMap& weights) const {
  modules::ChildWeights per_child;
  for (const auto& [name, t] : weights) {
    std::string rest;
    modules::Module* m = route(name, &rest);
    LOCUS_CHECK(m != nullptr, "reload: unexpected tensor ", name);
    per_child[m][rest] = t;
  }
  return per_child;
}

void DeepseekV3ForCausalLM::check_reload(const modules::WeightMap& weights) const {
  modules::check_children(split_by_child(weights));
}
void DeepseekV3ForCausalLM::reload(const modules::WeightMap& weights) {
  modules::reload_children(split_by_child(weights));
}

modules::MemoryUsage DeepseekV3ForCausalLM::memory() const {
  modules::MemoryUsage m;
  for (auto* c : children()) m += c->memory();
  return m;
}

void DeepseekV3ForCausalLM::collect_plans(std::vector<modules::PlanRecord>* out) const {
  for (auto* c : children()) c->collect_plans(out);
}

DeepseekV3Cache DeepseekV3ForCausalLM::new_cache(int64_t capacity) const {
  return DeepseekV3Cache::allocate(cfg_, capacity, opts_.device);
}

Tensor DeepseekV3ForCausalLM::forward(const std::vector<SequenceStep>& batch, bool all_logits, modules::MlaPath path,
                                      const Stream& stream) {
  Tensor logits = forward_on_device(batch, all_logits, path, stream);
  // The sampler reads the logits on the host. The copy waits for the device (cuda_hooks.cpp).
  HostProfileScope copy_profile("lm_head.logits_to_host");
  return logits.device().is_cpu() ? logits : logits.to(Device::cpu());
}

void DeepseekV3ForCausalLM::check_ready(const char* fn) const {
  const LifecycleState st = state();
  LOCUS_CHECK(st == LifecycleState::kTransformed || st == LifecycleState::kLocalized, "DeepseekV3ForCausalLM::", fn,
              ": the model is ", modules::lifecycle_state_name(st), "; load every tensor and transform() first");
}

void DeepseekV3ForCausalLM::check_step(const std::vector<SequenceStep>& batch) const {
  LOCUS_CHECK(!batch.empty(), "DeepseekV3ForCausalLM::forward: empty batch");
  check_ready("forward");
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceStep& s = batch[b];
    LOCUS_CHECK(s.cache != nullptr, "forward: sequence ", b, " has no KV cache");
    LOCUS_CHECK(!s.ids.empty(), "forward: sequence ", b, " has no tokens");
    LOCUS_CHECK(static_cast<int64_t>(s.cache->layers.size()) == cfg_.num_hidden_layers, "forward: sequence ", b,
                "'s KV cache has ", s.cache->layers.size(), " layers, the model ", cfg_.num_hidden_layers);
    const int64_t n = static_cast<int64_t>(s.ids.size()), end = s.cache->length() + n;
    LOCUS_CHECK(end <= s.cache->capacity(), "forward: sequence ", b, " needs ", end,
                " tokens of KV cache but its cache holds ", s.cache->capacity());
    LOCUS_CHECK(end <= opts_.max_positions, "forward: sequence ", b, " reaches position ", end - 1,
                " but the model was built for ", opts_.max_positions, " positions (max_seq_len)");
    for (int32_t id : s.ids)
      LOCUS_CHECK(id >= 0 && id < cfg_.vocab_size, "forward: token id ", id, " of sequence ", b,
                  " is outside the vocabulary [0, ", cfg_.vocab_size, ")");
    for (size_t o = 0; o < b; ++o)
      LOCUS_CHECK(batch[o].cache != s.cache, "forward: sequences ", o, " and ", b, " share one KV cache");
  }
}

Tensor DeepseekV3ForCausalLM::forward_on_device(const std::vector<SequenceStep>& batch, bool all_logits,
                                                modules::MlaPath path, const Stream& stream) {
  check_step(batch);
  int64_t total = 0;
  for (const SequenceStep& s : batch) total += static_cast<int64_t>(s.ids.size());

  // Token ids, positions and the rows whose logits are wanted, in one i32 buffer so that a device
  // model gets its inputs in one copy: [ids (total) | positions (total) | last row of each sequence].
  const int64_t B = static_cast<int64_t>(batch.size());
  Tensor inputs = Tensor::empty({2 * total + B}, DType::kI32);
  std::vector<int64_t> start_len(batch.size());
  {
    int32_t* ids_h = inputs.data<int32_t>();
    int32_t* pos_h = ids_h + total;
    int32_t* last_h = pos_h + total;
    int64_t r = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      start_len[b] = batch[b].cache->length();
      for (size_t i = 0; i < batch[b].ids.size(); ++i, ++r) {
        ids_h[r] = batch[b].ids[i];
        pos_h[r] = static_cast<int32_t>(start_len[b] + static_cast<int64_t>(i));
      }
      last_h[b] = static_cast<int32_t>(r - 1);
    }
  }
  const Device dev = opts_.device;
  if (!dev.is_cpu()) inputs = inputs.to(dev);
  const Tensor ids = inputs.slice(0, 0, total), pos = inputs.slice(0, total, 2 * total);
  const Tensor last_rows = inputs.slice(0, 2 * total, 2 * total + B);

  const int64_t D = cfg_.hidden_size;
  Tensor x = Tensor::empty({total, D}, DType::kBF16, dev);
  Tensor h = Tensor::empty({total, D}, DType::kBF16, dev);
  Tensor a = Tensor::empty({total, D}, DType::kBF16, dev);
  try {
    {
      HostProfileScope profile("embed");
      embed_->forward(ids, x, stream);
    }
    std::vector<modules::MlaSequence> seqs(batch.size());
    for (size_t l = 0; l < layers_.size(); ++l) {
      for (size_t b = 0; b < batch.size(); ++b)
        seqs[b] = {&batch[b].cache->layers[l], static_cast<int64_t>(batch[b].ids.size())};
      layers_[l]->forward(x, pos, seqs, h, a, /*pending_a=*/l > 0, path, stream);
    }
    if (!layers_.empty()) {
      HostProfileScope profile("norms and residuals");
      ops::add(x, a, x, stream);  // the last layer's output
    }
  } catch (...) {
    for (size_t b = 0; b < batch.size(); ++b)
      for (auto& lc : batch[b].cache->layers) lc.length = std::min(lc.length, start_len[b]);
    throw;
  }

  // Rows whose logits are wanted: every row, or each sequence's last (gathered on the device, an
  // embedding lookup into the hidden states).
  HostProfileScope head_profile("lm_head");
  Tensor rows = x;
  if (!all_logits) {
    rows = Tensor::empty({B, D}, DType::kBF16, dev);
    ops::embedding(x, last_rows, rows, stream);
  }
  return logits_of(rows, stream);
}

Tensor DeepseekV3ForCausalLM::logits_of(const Tensor& rows, const Stream& stream, const Tensor* residual) {
  Tensor normed = Tensor::empty(rows.shape(), DType::kBF16, opts_.device);
  if (residual) norm_->add_forward(rows, *residual, normed, stream);
  else norm_->forward(rows, normed, stream);
  Tensor logits = Tensor::empty({rows.size(0), cfg_.vocab_size}, DType::kFP32, opts_.device);
  lm_head_->forward(normed, logits, stream);
  return logits;
}

Tensor DeepseekV3ForCausalLM::forward_decode_table(const DecodeTables& in, const Stream& stream) {
  check_ready("forward_decode_table");
  LOCUS_CHECK(in.ids.defined() && in.ids.dim() == 1 && in.ids.size(0) >= 1, "forward_decode_table: ids must be [B], B >= 1");
  const int64_t B = in.ids.size(0), L = cfg_.num_hidden_layers;
  LOCUS_CHECK(in.kv_rows.defined() && in.kv_rows.dim() == 2 && in.kv_rows.size(0) == L && in.kv_rows.size(1) == B,
              "forward_decode_table: kv_rows must be [", L, " layers, ", B, " sequences], got ",
              in.kv_rows.defined() ? in.kv_rows.describe() : std::string("nothing"));
  const Device dev = opts_.device;
  const int64_t D = cfg_.hidden_size;
  Tensor x = Tensor::empty({B, D}, DType::kBF16, dev);
  Tensor h = Tensor::empty({B, D}, DType::kBF16, dev);
  Tensor a = Tensor::empty({B, D}, DType::kBF16, dev);
  {
    HostProfileScope profile("embed");
    embed_->forward(in.ids, x, stream);
  }
  const int64_t width = cfg_.kv_lora_rank + cfg_.qk_rope_head_dim;
  for (int64_t l = 0; l < L; ++l) {
    const ops::KvTable table{in.kv_rows.select(0, l), in.lengths, width, in.max_keys};
    layers_[static_cast<size_t>(l)]->forward_table(x, table, h, a, /*pending_a=*/l > 0, stream);
  }
  HostProfileScope head_profile("lm_head");
  return logits_of(x, stream, L > 0 ? &a : nullptr);
}

}  // namespace locus::models
