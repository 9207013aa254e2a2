// DeepSeek-V3 for causal LM (HF DeepseekV3ForCausalLM): embedding, decoder layers (MLA + dense MLP
// for the first_k_dense_replace layers, MoE + shared experts after), final RMSNorm, lm_head.
// Every module is named by its HF tensor prefix ("model.layers.3.mlp.experts", "lm_head") and
// gets the planner and locality runtime through its ModuleContext; lm_head is never partitioned.
//
// Lifecycle as every module (modules/module.h): load() takes full checkpoint names
// ("model.layers.0.self_attn.q_a_proj.weight"), then transform(), then localize() when locality
// domains are on. forward() runs a batch of sequences, each appending its new tokens to its own
// KV cache (DeepseekV3Cache), and returns fp32 logits on the CPU.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "models/deepseek_v3_cache.h"
#include "models/deepseek_v3_config.h"
#include "models/deepseek_v3_layer.h"
#include "modules/linear.h"
#include "modules/rmsnorm.h"

namespace locus::models {

struct DeepseekV3BuildOptions {
  Device device = Device::cpu();
  std::shared_ptr<const locality::Planner> planner;           // null: locality domains off
  std::shared_ptr<const locality::LocalityRuntime> runtime;   // null: locality domains off
  bool require_locality = false;  // see ModuleContext::require_locality
  int64_t max_positions = 4096;   // RoPE table rows: the longest sequence the model will see
  QuantPredicate is_nvfp4;        // null: every Linear BF16
};

// One sequence of a forward batch: the tokens to append and the cache they are appended to.
struct SequenceStep {
  std::vector<int32_t> ids;  // at least one token; positions continue after cache->length()
  DeepseekV3Cache* cache = nullptr;
};

// A decode step's inputs on the model's device (one new token per sequence), for steps captured
// in CUDA graphs (runtime/decode_graphs.h): a replay reads them where they are.
struct DecodeTables {
  Tensor ids;            // i32 [B]: each sequence's new token
  Tensor lengths;        // i32 [B]: tokens each cache holds before the step (the new token's position)
  Tensor kv_rows;        // i64 [layers, B]: address of row 0 of sequence b's layer-l latent cache
  int64_t max_keys = 0;  // every lengths[b] + 1 is at most this
};

class DeepseekV3ForCausalLM : public modules::Module {
 public:
  DeepseekV3ForCausalLM(DeepseekV3Config cfg, DeepseekV3BuildOptions opts);

  const DeepseekV3Config& config() const { return cfg_; }
  const DeepseekV3BuildOptions& options() const { return opts_; }
  LifecycleState state() const override;

  // True when `name` is a tensor this model takes (by its module prefix, not checking the piece).
  bool owns(const std::string& name) const;
  void load(const std::string& name, const Tensor& t) override;  // full checkpoint names
  std::vector<std::string> missing_pieces() const override;      // full names
  void transform() override;
  void localize() override;
  void reload(const modules::WeightMap& weights) override;       // full names; all-or-nothing
  void check_reload(const modules::WeightMap& weights) const override;
  void rebuild() override;
  modules::MemoryUsage memory() const override;
  void collect_plans(std::vector<modules::PlanRecord>* out) const override;

  // A KV cache for one sequence of up to `capacity` tokens, on the model's device.
  DeepseekV3Cache new_cache(int64_t capacity) const;

  // Runs every sequence's new tokens (one batch: dense ops over all rows, attention per sequence).
  // Returns fp32 CPU logits [num_sequences, vocab] of each sequence's last new token, or, with
  // all_logits, [total new tokens, vocab] in batch order. Errors (checked before any cache is
  // touched): empty batch or sequence, token id outside the vocabulary, a cache too small, a
  // position beyond max_positions, the model not transformed. If a kernel fails midway, every
  // cache is rolled back to its length before the call.
  // On a device the inputs go up in one copy, every op is queued on `stream` (Stream{}: the
  // device's default stream) and the logits come back in one copy, which waits for the device.
  Tensor forward(const std::vector<SequenceStep>& batch, bool all_logits = false,
                 modules::MlaPath path = modules::MlaPath::kAuto, const Stream& stream = {});
  // forward() with the logits left on the model's device, for a caller that reduces them there
  // first (greedy decoding brings back one index per sequence). On the CPU it is forward().
  // forward()'s checks of a batch (those named above), without running anything.
  void check_step(const std::vector<SequenceStep>& batch) const;
  Tensor forward_on_device(const std::vector<SequenceStep>& batch, bool all_logits = false,
                           modules::MlaPath path = modules::MlaPath::kAuto, const Stream& stream = {});

  // Decode from device tables: fp32 logits [B, vocab] on the device, the same as
  // forward_on_device() over those caches (bitwise on the CPU). Checks only shapes: the caller
  // builds the tables from caches it checked (ids in the vocabulary, room for one more token,
  // positions within max_positions) and advances their host-side lengths after the step.
  Tensor forward_decode_table(const DecodeTables& in, const Stream& stream = {});

  DecoderLayer& layer(int64_t i) { return *layers_.at(static_cast<size_t>(i)); }
  modules::Embedding& embed_tokens() { return *embed_; }
  modules::RMSNorm& norm() { return *norm_; }
  modules::Linear& lm_head() { return *lm_head_; }

 private:
  std::vector<modules::Module*> children() const;
  // The child owning `name` and the name relative to it; null when none does.
  modules::Module* route(const std::string& name, std::string* rest) const;
  modules::ChildWeights split_by_child(const modules::WeightMap& weights) const;  // unknown name: Error
  // Error unless the model is transformed (or localized); `fn` names the caller.
  void check_ready(const char* fn) const;
  // Final norm and lm_head over hidden rows [R, hidden] (residual: added into rows first, one
  // kernel with the norm): fp32 logits [R, vocab].
  Tensor logits_of(const Tensor& rows, const Stream& stream, const Tensor* residual = nullptr);

  DeepseekV3Config cfg_;
  DeepseekV3BuildOptions opts_;
  std::unique_ptr<modules::Embedding> embed_;
  std::vector<std::unique_ptr<DecoderLayer>> layers_;
  std::unique_ptr<modules::RMSNorm> norm_;
  std::unique_ptr<modules::Linear> lm_head_;
};

}  // namespace locus::models
