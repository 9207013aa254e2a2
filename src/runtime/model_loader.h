// ModelLoader: LlmArgs + a Hugging Face DeepSeek-V3 directory -> a ready model.
//
// Order: validate the LlmArgs; open the checkpoint (config.json, safetensors shards, quant
// config); check every expected tensor is present with the right dtype and shape (Errors name
// the tensor, the shard and what was expected) and that no tensor is unexpected (tensors of
// layers >= num_hidden_layers, i.e. the MTP layer, and rotary_emb.inv_freq buffers are ignored
// with a note); stream every tensor into its module with a progress bar; transform(); with
// locality domains on, localize() (one shard per domain, full weights released).
#pragma once
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "locality/domain_place.h"
#include "locality/planner.h"
#include "models/deepseek_v3.h"
#include "runtime/llm_args.h"
#include "runtime/quant_config.h"

namespace locus::runtime {

struct LoadedModel {
  std::unique_ptr<models::DeepseekV3ForCausalLM> model;
  models::DeepseekV3Config config;
  QuantConfig quant;
  Device device;
  locality::Topology topology;                       // resolved only with locality domains on
  std::shared_ptr<const locality::Planner> planner;  // null with locality domains off
  std::shared_ptr<const locality::LocalityRuntime> runtime;
  std::vector<std::string> notes;                    // what was ignored or decided, for the log
  uint64_t weight_bytes = 0;                         // bytes read from the checkpoint
  double load_seconds = 0;
};

struct ModelLoaderOptions {
  bool progress = true;      // progress bar on stderr
  std::FILE* log = stderr;   // notes; null = silent
};

// The device an LlmArgs names (backend cpu -> cpu, cuda -> cuda:<device>).
Device device_for(const LlmArgs& args);

class ModelLoader {
 public:
  explicit ModelLoader(LlmArgs args, ModelLoaderOptions opts = {});
  // Loads args.model (Error when empty).
  LoadedModel load() const;
  // Loads `dir` with these args.
  LoadedModel load(const std::string& dir) const;

 private:
  LlmArgs args_;
  ModelLoaderOptions opts_;
};

}  // namespace locus::runtime
