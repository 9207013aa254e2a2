// DeepSeek-V3 config.json (Hugging Face model_type "deepseek_v3"; "deepseek_v2" configs use the
// same fields). Absent fields take transformers' DeepseekV3Config defaults. Both the
// transformers 4 `rope_scaling` map and the transformers 5 `rope_parameters` map are read.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace locus::models {

struct RopeScaling {
  std::string type = "yarn";              // "yarn" is the one Locus implements
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct DeepseekV3Config {
  std::string model_type = "deepseek_v3";
  std::vector<std::string> architectures;  // ["DeepseekV3ForCausalLM"] in real checkpoints
  int64_t vocab_size = 129280;
  int64_t hidden_size = 7168;
  int64_t intermediate_size = 18432;       // dense MLP
  int64_t moe_intermediate_size = 2048;    // each routed / shared expert
  int64_t num_hidden_layers = 61;
  int64_t num_nextn_predict_layers = 0;    // MTP layers (stored after the main layers; ignored)
  int64_t num_attention_heads = 128;
  int64_t num_key_value_heads = 128;
  int64_t n_shared_experts = 1;
  int64_t n_routed_experts = 256;
  double routed_scaling_factor = 2.5;
  int64_t kv_lora_rank = 512;
  std::optional<int64_t> q_lora_rank = 1536;  // null: plain q_proj (V2-Lite)
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  int64_t qk_nope_head_dim = 128;
  std::string topk_method = "noaux_tc";    // "noaux_tc" | "greedy" | "group_limited_greedy"
  int64_t n_group = 8;
  int64_t topk_group = 4;
  int64_t num_experts_per_tok = 8;
  int64_t moe_layer_freq = 1;
  int64_t first_k_dense_replace = 3;
  bool norm_topk_prob = true;
  std::string scoring_func = "sigmoid";    // "sigmoid" | "softmax"
  std::string hidden_act = "silu";
  int64_t max_position_embeddings = 4096;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // null: plain RoPE
  bool rope_interleave = true;
  bool attention_bias = false;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id = 0;
  std::vector<int64_t> eos_token_ids = {1};  // eos_token_id may be an int or a list in the file
  std::optional<int64_t> pad_token_id;
  std::string torch_dtype = "bfloat16";
  nlohmann::json quantization_config;        // verbatim (null when absent); see runtime/quant_config.h

  // Derived.
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t q_out_features() const { return num_attention_heads * qk_head_dim(); }
  int64_t kv_a_out_features() const { return kv_lora_rank + qk_rope_head_dim; }
  int64_t kv_b_out_features() const { return num_attention_heads * (qk_nope_head_dim + v_head_dim); }
  int64_t o_in_features() const { return num_attention_heads * v_head_dim; }
  int64_t shared_intermediate_size() const { return moe_intermediate_size * n_shared_experts; }
  // HF's rule: layer i is MoE when n_routed_experts > 0, i >= first_k_dense_replace and
  // i % moe_layer_freq == 0.
  bool is_moe_layer(int64_t layer) const;
  // YaRN: 0.1 * m * ln(factor) + 1 (1 when factor <= 1).
  static double yarn_get_mscale(double factor, double m);
  // Attention softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 with YaRN.
  double softmax_scale() const;

  // Checks consistency; Error naming the field(s): positive sizes, qk_rope_head_dim even,
  // n_routed_experts % n_group == 0, topk_group <= n_group, num_experts_per_tok <= n_routed_experts
  // (and <= topk_group * experts per group for grouped routing), first_k_dense_replace <=
  // num_hidden_layers, num_key_value_heads == num_attention_heads (MLA), known scoring_func /
  // topk_method / hidden_act / rope type.
  void validate() const;

  // config.json form (HF field names, rope_scaling map, eos_token_id int when one id).
  nlohmann::ordered_json to_json() const;
};

// Parses a config.json object; `source` names the file in errors. Wrong types are Errors naming the
// field and the expected type; the result is validate()d.
DeepseekV3Config parse_deepseek_v3_config(const nlohmann::json& j, const std::string& source = "config.json");
// `path` is a model directory (reads path/config.json) or a config.json file.
DeepseekV3Config load_deepseek_v3_config(const std::string& path);

}  // namespace locus::models
