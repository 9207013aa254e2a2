#include "models/deepseek_v3_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace locus::models {
namespace {

using nlohmann::json;

// Typed readers: absent or null keep the default; a wrong type names the field and the type.
struct Reader {
  const json& j;
  const std::string& source;

  const json* find(const char* key) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
  }
  [[noreturn]] void bad(const char* key, const char* type, const json& v) const {
    LOCUS_THROW(source, ": field '", key, "' should be ", type, ", found ", v.dump());
  }
  void get(const char* key, int64_t& out) const {
    if (const json* v = find(key)) {
      if (v->is_number_integer()) {
        out = v->get<int64_t>();
      } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                 std::fabs(v->get<double>()) < 9e15) {
        out = static_cast<int64_t>(v->get<double>());  // 4096.0 written by some tools
      } else {
        bad(key, "an integer", *v);
      }
    }
  }
  void get(const char* key, double& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number()) bad(key, "a number", *v);
      out = v->get<double>();
    }
  }
  void get(const char* key, bool& out) const {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) bad(key, "true or false", *v);
      out = v->get<bool>();
    }
  }
  void get(const char* key, std::string& out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) bad(key, "a string", *v);
      out = v->get<std::string>();
    }
  }
  // Optional int: an explicit null sets nullopt; absent keeps the default.
  void get_optional(const char* key, std::optional<int64_t>& out) const {
    auto it = j.find(key);
    if (it == j.end()) return;
    if (it->is_null()) {
      out.reset();
      return;
    }
    int64_t v = 0;
    get(key, v);
    out = v;
  }
};

void parse_rope(const json& r, const std::string& src, const char* field, RopeScaling& out, bool* is_default) {
  LOCUS_CHECK(r.is_object(), src, ": field '", field, "' should be an object, found ", r.dump());
  const std::string where = str(src, " ", field);
  Reader rd{r, where};
  std::string type;
  rd.get("rope_type", type);
  if (type.empty()) rd.get("type", type);
  if (type.empty()) type = "default";
  *is_default = type == "default";
  out.type = type;
  rd.get("factor", out.factor);
  rd.get("original_max_position_embeddings", out.original_max_position_embeddings);
  rd.get("beta_fast", out.beta_fast);
  rd.get("beta_slow", out.beta_slow);
  rd.get("mscale", out.mscale);
  rd.get("mscale_all_dim", out.mscale_all_dim);
}

void check_positive(const std::string& src, const char* name, int64_t v) {
  LOCUS_CHECK(v > 0, src, ": ", name, " must be positive, found ", v);
}

}  // namespace

bool DeepseekV3Config::is_moe_layer(int64_t layer) const {
  return n_routed_experts > 0 && layer >= first_k_dense_replace && moe_layer_freq > 0 && layer % moe_layer_freq == 0;
}

double DeepseekV3Config::yarn_get_mscale(double factor, double m) {
  if (factor <= 1.0) return 1.0;
  return 0.1 * m * std::log(factor) + 1.0;
}

double DeepseekV3Config::softmax_scale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_scaling && rope_scaling->mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(rope_scaling->factor, rope_scaling->mscale_all_dim);
    s *= m * m;
  }
  return s;
}

void DeepseekV3Config::validate() const {
  const std::string src = "DeepSeek-V3 config";
  check_positive(src, "vocab_size", vocab_size);
  check_positive(src, "hidden_size", hidden_size);
  check_positive(src, "intermediate_size", intermediate_size);
  check_positive(src, "num_hidden_layers", num_hidden_layers);
  check_positive(src, "num_attention_heads", num_attention_heads);
  check_positive(src, "kv_lora_rank", kv_lora_rank);
  check_positive(src, "qk_nope_head_dim", qk_nope_head_dim);
  check_positive(src, "qk_rope_head_dim", qk_rope_head_dim);
  check_positive(src, "v_head_dim", v_head_dim);
  check_positive(src, "max_position_embeddings", max_position_embeddings);
  if (q_lora_rank) check_positive(src, "q_lora_rank", *q_lora_rank);
  LOCUS_CHECK(num_nextn_predict_layers >= 0, src, ": num_nextn_predict_layers must be >= 0, found ", num_nextn_predict_layers);
  LOCUS_CHECK(qk_rope_head_dim % 2 == 0, src, ": qk_rope_head_dim must be even (RoPE rotates pairs), found ", qk_rope_head_dim);
  LOCUS_CHECK(num_key_value_heads == num_attention_heads, src, ": num_key_value_heads (", num_key_value_heads,
              ") must equal num_attention_heads (", num_attention_heads, ") for MLA");
  LOCUS_CHECK(first_k_dense_replace >= 0 && first_k_dense_replace <= num_hidden_layers, src, ": first_k_dense_replace (",
              first_k_dense_replace, ") must be in [0, num_hidden_layers = ", num_hidden_layers, "]");
  LOCUS_CHECK(rms_norm_eps > 0, src, ": rms_norm_eps must be positive, found ", rms_norm_eps);
  LOCUS_CHECK(rope_theta > 0, src, ": rope_theta must be positive, found ", rope_theta);
  LOCUS_CHECK(hidden_act == "silu", src, ": hidden_act '", hidden_act, "' is not supported (expected silu)");
  LOCUS_CHECK(n_routed_experts >= 0, src, ": n_routed_experts must be >= 0, found ", n_routed_experts);
  if (n_routed_experts > 0 && first_k_dense_replace < num_hidden_layers) {
    check_positive(src, "moe_intermediate_size", moe_intermediate_size);
    check_positive(src, "num_experts_per_tok", num_experts_per_tok);
    check_positive(src, "n_group", n_group);
    check_positive(src, "topk_group", topk_group);
    check_positive(src, "moe_layer_freq", moe_layer_freq);
    LOCUS_CHECK(n_shared_experts >= 0, src, ": n_shared_experts must be >= 0, found ", n_shared_experts);
    LOCUS_CHECK(n_routed_experts % n_group == 0, src, ": n_routed_experts (", n_routed_experts,
                ") is not divisible by n_group (", n_group, ")");
    LOCUS_CHECK(topk_group <= n_group, src, ": topk_group (", topk_group, ") exceeds n_group (", n_group, ")");
    LOCUS_CHECK(num_experts_per_tok <= n_routed_experts, src, ": num_experts_per_tok (", num_experts_per_tok,
                ") exceeds n_routed_experts (", n_routed_experts, ")");
    LOCUS_CHECK(scoring_func == "sigmoid" || scoring_func == "softmax", src, ": scoring_func '", scoring_func,
                "' is not supported (expected sigmoid or softmax)");
    LOCUS_CHECK(topk_method == "noaux_tc" || topk_method == "greedy" || topk_method == "group_limited_greedy", src,
                ": topk_method '", topk_method, "' is not supported (expected noaux_tc, greedy or group_limited_greedy)");
    if (topk_method != "greedy") {
      const int64_t per_group = n_routed_experts / n_group;
      LOCUS_CHECK(num_experts_per_tok <= topk_group * per_group, src, ": num_experts_per_tok (", num_experts_per_tok,
                  ") exceeds topk_group (", topk_group, ") x experts per group (", per_group, ")");
    }
    LOCUS_CHECK(routed_scaling_factor > 0, src, ": routed_scaling_factor must be positive, found ", routed_scaling_factor);
  }
  if (rope_scaling) {
    LOCUS_CHECK(rope_scaling->type == "yarn", src, ": rope_scaling type '", rope_scaling->type,
                "' is not supported (expected yarn)");
    LOCUS_CHECK(rope_scaling->factor >= 1.0, src, ": rope_scaling factor must be >= 1, found ", rope_scaling->factor);
    check_positive(src, "rope_scaling original_max_position_embeddings", rope_scaling->original_max_position_embeddings);
    LOCUS_CHECK(rope_scaling->beta_fast > rope_scaling->beta_slow && rope_scaling->beta_slow > 0, src,
                ": rope_scaling needs beta_fast > beta_slow > 0, found beta_fast ", rope_scaling->beta_fast,
                ", beta_slow ", rope_scaling->beta_slow);
  }
  for (int64_t e : eos_token_ids) {
    LOCUS_CHECK(e >= 0 && e < vocab_size, src, ": eos_token_id ", e, " is outside the vocabulary (", vocab_size, ")");
  }
  if (bos_token_id) {
    LOCUS_CHECK(*bos_token_id >= 0 && *bos_token_id < vocab_size, src, ": bos_token_id ", *bos_token_id,
                " is outside the vocabulary (", vocab_size, ")");
  }
}

DeepseekV3Config parse_deepseek_v3_config(const json& j, const std::string& source) {
  LOCUS_CHECK(j.is_object(), source, ": config is not a JSON object");
  DeepseekV3Config c;
  Reader r{j, source};
  r.get("model_type", c.model_type);
  LOCUS_CHECK(c.model_type == "deepseek_v3" || c.model_type == "deepseek_v2", source, ": model_type '", c.model_type,
              "' is not supported (expected deepseek_v3 or deepseek_v2)");
  if (const json* a = r.find("architectures")) {
    if (!a->is_array()) r.bad("architectures", "a list of strings", *a);
    for (const json& s : *a) {
      if (!s.is_string()) r.bad("architectures", "a list of strings", *a);
      c.architectures.push_back(s.get<std::string>());
    }
  }
  r.get("vocab_size", c.vocab_size);
  r.get("hidden_size", c.hidden_size);
  r.get("intermediate_size", c.intermediate_size);
  r.get("moe_intermediate_size", c.moe_intermediate_size);
  r.get("num_hidden_layers", c.num_hidden_layers);
  r.get("num_nextn_predict_layers", c.num_nextn_predict_layers);
  r.get("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;  // transformers: defaults to num_attention_heads
  r.get("num_key_value_heads", c.num_key_value_heads);
  r.get("n_shared_experts", c.n_shared_experts);
  r.get("n_routed_experts", c.n_routed_experts);
  r.get("routed_scaling_factor", c.routed_scaling_factor);
  r.get("kv_lora_rank", c.kv_lora_rank);
  r.get_optional("q_lora_rank", c.q_lora_rank);
  r.get("qk_rope_head_dim", c.qk_rope_head_dim);
  r.get("v_head_dim", c.v_head_dim);
  r.get("qk_nope_head_dim", c.qk_nope_head_dim);
  r.get("topk_method", c.topk_method);
  r.get("n_group", c.n_group);
  r.get("topk_group", c.topk_group);
  r.get("num_experts_per_tok", c.num_experts_per_tok);
  r.get("moe_layer_freq", c.moe_layer_freq);
  r.get("first_k_dense_replace", c.first_k_dense_replace);
  r.get("norm_topk_prob", c.norm_topk_prob);
  r.get("scoring_func", c.scoring_func);
  r.get("hidden_act", c.hidden_act);
  r.get("max_position_embeddings", c.max_position_embeddings);
  r.get("initializer_range", c.initializer_range);
  r.get("rms_norm_eps", c.rms_norm_eps);
  r.get("rope_theta", c.rope_theta);
  r.get("rope_interleave", c.rope_interleave);
  r.get("attention_bias", c.attention_bias);
  r.get("tie_word_embeddings", c.tie_word_embeddings);
  r.get_optional("bos_token_id", c.bos_token_id);
  r.get_optional("pad_token_id", c.pad_token_id);
  if (auto it = j.find("eos_token_id"); it != j.end()) {
    c.eos_token_ids.clear();
    if (it->is_array()) {
      for (const json& e : *it) {
        if (!e.is_number_integer()) r.bad("eos_token_id", "an integer or a list of integers", *it);
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int64_t>());
    } else if (!it->is_null()) {
      r.bad("eos_token_id", "an integer or a list of integers", *it);
    }
  }
  r.get("torch_dtype", c.torch_dtype);
  r.get("dtype", c.torch_dtype);  // transformers 5 name
  // transformers 4: rope_scaling {type|rope_type: yarn, ...}; transformers 5: rope_parameters
  // {rope_type, rope_theta, ...}. "default" means plain RoPE.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (const json* rs = r.find(key)) {
      RopeScaling rope;
      bool is_default = false;
      parse_rope(*rs, source, key, rope, &is_default);
      if (rs->contains("rope_theta")) Reader{*rs, source + " " + key}.get("rope_theta", c.rope_theta);
      if (is_default) {
        c.rope_scaling.reset();
      } else {
        c.rope_scaling = rope;
      }
    }
  }
  if (auto it = j.find("quantization_config"); it != j.end()) c.quantization_config = *it;
  try {
    c.validate();
  } catch (const Error& e) {
    std::string msg = e.what();
    const std::string prefix = "DeepSeek-V3 config";
    if (msg.rfind(prefix, 0) == 0) msg = source + msg.substr(prefix.size());
    throw Error(msg);
  }
  return c;
}

DeepseekV3Config load_deepseek_v3_config(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = path;
  if (fs::is_directory(p)) p /= "config.json";
  LOCUS_CHECK(fs::exists(p), "DeepSeek-V3 config '", p.string(), "' does not exist");
  std::ifstream in(p);
  LOCUS_CHECK(in.good(), "cannot read '", p.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    LOCUS_THROW("'", p.string(), "' is not valid JSON: ", e.what());
  }
  return parse_deepseek_v3_config(j, p.string());
}

nlohmann::ordered_json DeepseekV3Config::to_json() const {
  nlohmann::ordered_json j;
  j["architectures"] = architectures;
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_nextn_predict_layers"] = num_nextn_predict_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["n_shared_experts"] = n_shared_experts;
  j["n_routed_experts"] = n_routed_experts;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["kv_lora_rank"] = kv_lora_rank;
  j["q_lora_rank"] = q_lora_rank ? json(*q_lora_rank) : json(nullptr);
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["topk_method"] = topk_method;
  j["n_group"] = n_group;
  j["topk_group"] = topk_group;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["moe_layer_freq"] = moe_layer_freq;
  j["first_k_dense_replace"] = first_k_dense_replace;
  j["norm_topk_prob"] = norm_topk_prob;
  j["scoring_func"] = scoring_func;
  j["hidden_act"] = hidden_act;
  j["max_position_embeddings"] = max_position_embeddings;
  j["initializer_range"] = initializer_range;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling) {
    nlohmann::ordered_json r;
    r["type"] = rope_scaling->type;
    r["rope_type"] = rope_scaling->type;
    r["factor"] = rope_scaling->factor;
    r["original_max_position_embeddings"] = rope_scaling->original_max_position_embeddings;
    r["beta_fast"] = rope_scaling->beta_fast;
    r["beta_slow"] = rope_scaling->beta_slow;
    r["mscale"] = rope_scaling->mscale;
    r["mscale_all_dim"] = rope_scaling->mscale_all_dim;
    j["rope_scaling"] = r;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_interleave"] = rope_interleave;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id ? json(*bos_token_id) : json(nullptr);
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else {
    j["eos_token_id"] = eos_token_ids;
  }
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  if (!quantization_config.is_null()) j["quantization_config"] = nlohmann::ordered_json::parse(quantization_config.dump());
  return j;
}

}  // namespace locus::models
