// ModelOpt quantization config of a checkpoint (ecosystem.md 1.4). Read from, in order:
//   hf_quant_config.json  {"producer": {...}, "quantization": {"quant_algo": "NVFP4",
//                          "kv_cache_quant_algo": ..., "group_size": 16, "exclude_modules": [...]}}
//   config.json           "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
//                          "group_size": 16, "ignore": [...]} (also "exclude_modules")
// and none when neither is present (an unquantized BF16 checkpoint).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace locus::runtime {

enum class QuantAlgo {
  kNone,        // not quantized
  kNvfp4,       // "NVFP4": W4A4 export (input_scale present; Locus runs it weight-only on Hopper)
  kNvfp4W4A16,  // "W4A16_NVFP4" / "NVFP4_W4A16": weight-only export (no input_scale)
};
const char* quant_algo_name(QuantAlgo a);  // "none", "NVFP4", "W4A16_NVFP4"

struct QuantConfig {
  QuantAlgo algo = QuantAlgo::kNone;
  int group_size = 16;                       // elements per weight_scale block (NVFP4: 16)
  std::string kv_cache_quant_algo;           // "" when absent ("FP8" in ModelOpt exports)
  std::vector<std::string> exclude_modules;  // fnmatch patterns over module names
  std::string source;                        // file the config came from ("" for kNone)

  bool quantized() const { return algo != QuantAlgo::kNone; }
  // True when the checkpoint is quantized and no exclude pattern matches `module` or one of its
  // dotted prefixes (so "model.layers.0.self_attn*" and "model.layers.0.self_attn" both cover
  // "model.layers.0.self_attn.q_a_proj"). `module` is the Linear's name without ".weight".
  bool is_quantized(const std::string& module) const;
  // The first pattern that excludes `module` (or one of its prefixes), "" when none does.
  std::string excluding_pattern(const std::string& module) const;
};


// The modules that ModelOpt's NVFP4 exports of DeepSeek-V3/R1 keep in BF16 (nvidia/DeepSeek-R1-FP4):
// lm_head, and every layer's attention and router gate; as patterns over module names. A real
// export lists them layer by layer (make-tiny-model --nvfp4 writes them so); these cover any depth.
std::vector<std::string> deepseek_nvfp4_bf16_modules();

// Parses the two JSON forms; `source` names the file in errors. Errors: unsupported quant_algo or
// quant_method (named), group_size other than 16 for NVFP4, wrong JSON types (key named).
QuantConfig parse_hf_quant_config(const nlohmann::json& j, const std::string& source);
QuantConfig parse_quantization_config(const nlohmann::json& quantization_config, const std::string& source);
// Looks in model_dir as described at the top of this file.
QuantConfig load_quant_config(const std::string& model_dir);
// The JSON the tiny-model writer emits as hf_quant_config.json.
nlohmann::json to_hf_quant_config_json(const QuantConfig& q);

}  // namespace locus::runtime
