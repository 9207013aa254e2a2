#include "runtime/quant_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/module_pattern.h"

namespace locus::runtime {
namespace {

using nlohmann::json;

QuantAlgo algo_from_name(const std::string& name, const std::string& source) {
  if (name == "NVFP4") return QuantAlgo::kNvfp4;
  if (name == "W4A16_NVFP4" || name == "NVFP4_W4A16") return QuantAlgo::kNvfp4W4A16;
  LOCUS_THROW(source, ": unsupported quant_algo '", name, "' (Locus reads NVFP4 and W4A16_NVFP4 checkpoints)");
}

std::vector<std::string> string_list(const json& v, const std::string& source, const char* key) {
  LOCUS_CHECK(v.is_array(), source, ": '", key, "' should be a list of strings, found ", v.dump());
  std::vector<std::string> out;
  for (const json& s : v) {
    LOCUS_CHECK(s.is_string(), source, ": '", key, "' should be a list of strings, found element ", s.dump());
    out.push_back(s.get<std::string>());
  }
  return out;
}

void read_group_size(const json& q, const std::string& source, QuantConfig& c) {
  if (auto it = q.find("group_size"); it != q.end() && !it->is_null()) {
    LOCUS_CHECK(it->is_number_integer(), source, ": 'group_size' should be an integer, found ", it->dump());
    c.group_size = it->get<int>();
  }
  LOCUS_CHECK(c.group_size == 16, source, ": group_size ", c.group_size, " is not supported for ",
              quant_algo_name(c.algo), " (NVFP4 uses 16-element blocks)");
}

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  LOCUS_CHECK(in.good(), "cannot read '", p.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    LOCUS_THROW("'", p.string(), "' is not valid JSON: ", e.what());
  }
}

}  // namespace

const char* quant_algo_name(QuantAlgo a) {
  switch (a) {
    case QuantAlgo::kNone: return "none";
    case QuantAlgo::kNvfp4: return "NVFP4";
    case QuantAlgo::kNvfp4W4A16: return "W4A16_NVFP4";
  }
  return "invalid";
}

std::string QuantConfig::excluding_pattern(const std::string& module) const {
  for (const std::string& p : exclude_modules) {
    if (module_pattern_matches(p, module)) return p;
  }
  return "";
}

bool QuantConfig::is_quantized(const std::string& module) const {
  return quantized() && excluding_pattern(module).empty();
}

std::vector<std::string> deepseek_nvfp4_bf16_modules() {
  return {"lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"};
}

QuantConfig parse_hf_quant_config(const json& j, const std::string& source) {
  LOCUS_CHECK(j.is_object(), source, ": not a JSON object");
  auto qit = j.find("quantization");
  LOCUS_CHECK(qit != j.end() && qit->is_object(), source, ": missing \"quantization\" object");
  const json& q = *qit;
  QuantConfig c;
  c.source = source;
  auto ait = q.find("quant_algo");
  LOCUS_CHECK(ait != q.end(), source, ": missing quantization.quant_algo");
  if (ait->is_null()) return QuantConfig{};  // ModelOpt writes null for "not quantized"
  LOCUS_CHECK(ait->is_string(), source, ": quantization.quant_algo should be a string, found ", ait->dump());
  c.algo = algo_from_name(ait->get<std::string>(), source);
  read_group_size(q, source, c);
  if (auto it = q.find("kv_cache_quant_algo"); it != q.end() && !it->is_null()) {
    LOCUS_CHECK(it->is_string(), source, ": kv_cache_quant_algo should be a string or null, found ", it->dump());
    c.kv_cache_quant_algo = it->get<std::string>();
  }
  if (auto it = q.find("exclude_modules"); it != q.end() && !it->is_null()) {
    c.exclude_modules = string_list(*it, source, "exclude_modules");
  }
  return c;
}

QuantConfig parse_quantization_config(const json& q, const std::string& source) {
  LOCUS_CHECK(q.is_object(), source, ": quantization_config should be an object, found ", q.dump());
  QuantConfig c;
  c.source = source;
  auto mit = q.find("quant_method");
  LOCUS_CHECK(mit != q.end() && mit->is_string(), source, ": quantization_config.quant_method missing or not a string");
  const std::string method = mit->get<std::string>();
  LOCUS_CHECK(method == "modelopt", source, ": unsupported quantization_config.quant_method '", method,
              "' (Locus reads ModelOpt NVFP4 checkpoints: quant_method \"modelopt\")");
  auto ait = q.find("quant_algo");
  LOCUS_CHECK(ait != q.end() && ait->is_string(), source, ": quantization_config.quant_algo missing or not a string");
  c.algo = algo_from_name(ait->get<std::string>(), source);
  read_group_size(q, source, c);
  if (auto it = q.find("kv_cache_quant_algo"); it != q.end() && it->is_string()) c.kv_cache_quant_algo = it->get<std::string>();
  if (auto it = q.find("kv_cache_scheme"); it != q.end() && it->is_object() && c.kv_cache_quant_algo.empty()) {
    if (auto t = it->find("type"); t != it->end() && t->is_string()) c.kv_cache_quant_algo = t->get<std::string>();
  }
  for (const char* key : {"ignore", "exclude_modules"}) {
    if (auto it = q.find(key); it != q.end() && !it->is_null()) {
      for (std::string& s : string_list(*it, source, key)) c.exclude_modules.push_back(std::move(s));
    }
  }
  return c;
}

QuantConfig load_quant_config(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path hf = fs::path(model_dir) / "hf_quant_config.json";
  if (fs::exists(hf)) return parse_hf_quant_config(read_json(hf), hf.string());
  const fs::path cfg = fs::path(model_dir) / "config.json";
  if (fs::exists(cfg)) {
    json j = read_json(cfg);
    if (j.is_object()) {
      if (auto it = j.find("quantization_config"); it != j.end() && !it->is_null()) {
        return parse_quantization_config(*it, cfg.string());
      }
    }
  }
  return QuantConfig{};
}

nlohmann::json to_hf_quant_config_json(const QuantConfig& q) {
  json j;
  j["producer"] = {{"name", "modelopt"}, {"version", "locus-tiny"}};
  json quant;
  quant["quant_algo"] = q.quantized() ? json(quant_algo_name(q.algo)) : json(nullptr);
  quant["kv_cache_quant_algo"] = q.kv_cache_quant_algo.empty() ? json(nullptr) : json(q.kv_cache_quant_algo);
  quant["group_size"] = q.group_size;
  quant["exclude_modules"] = q.exclude_modules;
  j["quantization"] = quant;
  return j;
}

}  // namespace locus::runtime
