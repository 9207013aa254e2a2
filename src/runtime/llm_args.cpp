#include "runtime/llm_args.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <variant>

#include "core/error.h"

namespace locus::runtime {
namespace {

// A field is reached through a typed pointer into an LlmArgs; the variant's alternative is its type.
using Ref = std::variant<std::string*, int*, int64_t*, uint64_t*, double*, bool*, std::optional<int>*,
                         std::vector<std::string>*>;

struct Def {
  std::string key;
  std::string help;
  std::function<Ref(LlmArgs&)> ref;
};

#define LOCUS_FIELD(key, member, help) Def{key, help, [](LlmArgs& a) -> Ref { return &a.member; }}

// The one table: file keys, CLI flags, dump order and docs all come from it.
const std::vector<Def>& defs() {
  static const std::vector<Def> d = {
      LOCUS_FIELD("model", model, "Hugging Face model directory (config.json, safetensors, tokenizer.json)"),
      LOCUS_FIELD("tokenizer", tokenizer, "tokenizer directory or tokenizer.json; empty = the model directory"),
      LOCUS_FIELD("backend", backend, "compute backend: cpu or cuda"),
      LOCUS_FIELD("device", device, "CUDA device index (cuda backend)"),
      LOCUS_FIELD("dtype", dtype, "activation and unquantized-weight dtype: bf16"),
      LOCUS_FIELD("max_batch_size", max_batch_size, "most sequences decoded together"),
      LOCUS_FIELD("max_seq_len", max_seq_len, "most tokens (prompt + generated) per sequence"),
      LOCUS_FIELD("kv_cache_budget_bytes", kv_cache_budget_bytes,
                  "bytes for the KV cache; 0 = kv_cache_memory_fraction of the memory left after the weights"),
      LOCUS_FIELD("kv_cache_memory_fraction", kv_cache_memory_fraction,
                  "fraction (0, 1] of the free memory after loading given to the KV cache when the budget is 0"),
      LOCUS_FIELD("enable_locality_domains", enable_locality_domains,
                  "run supported ops partitioned across locality domains (off by default)"),
      LOCUS_FIELD("locality_domains.emulate", locality_domains.emulate,
                  "emulate N locality domains on one device; null = the driver's topology"),
      LOCUS_FIELD("locality_domains.num_partitions", locality_domains.num_partitions,
                  "partitions per op; 0 = one per domain of the topology"),
      LOCUS_FIELD("locality_domains.allowed_ops", locality_domains.allowed_ops,
                  "op kinds that may be partitioned: bf16_linear, nvfp4_linear, bf16_bmm, bf16_moe, nvfp4_moe"),
      LOCUS_FIELD("locality_domains.exclude_modules", locality_domains.exclude_modules,
                  "module-name patterns (fnmatch on the name and its dotted prefixes) that stay unpartitioned"),
      LOCUS_FIELD("cuda_graphs", cuda_graphs, "replay decode steps from CUDA graphs, one per batch size and key bound (cuda backend)"),
      LOCUS_FIELD("decode_lookahead", decode_lookahead,
                  "with cuda_graphs: launch each greedy decode step from the device's tokens before reading them back"),
      LOCUS_FIELD("seed", seed, "random seed for sampling"),
      LOCUS_FIELD("num_threads", num_threads, "CPU worker threads; 0 = the hardware concurrency"),
      LOCUS_FIELD("tensor_parallel_size", tensor_parallel_size, "devices per model replica (this build: 1)"),
      LOCUS_FIELD("weight_sharing", weight_sharing, "share weights across processes through IPC handles"),
      LOCUS_FIELD("fused_allreduce", fused_allreduce, "fused all-reduce + norm kernels across tensor-parallel ranks"),
      LOCUS_FIELD("gms_weight_loading", gms_weight_loading,
                  "load weights through a GPU memory service (weights in an externally owned pool)"),
      LOCUS_FIELD("log_level", log_level, "error, warn, info or debug"),
  };
  return d;
}
#undef LOCUS_FIELD

const char* type_name(const Ref& r) {
  switch (r.index()) {
    case 0: return "string";
    case 1: return "int";
    case 2: return "int64";
    case 3: return "uint64";
    case 4: return "float";
    case 5: return "bool";
    case 6: return "optional int";
    case 7: return "list of string";
  }
  return "?";
}

// Edit distance, for "did you mean" hints on unknown keys.
size_t distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const Def* find_def(const std::string& key) {
  for (const Def& d : defs()) {
    if (d.key == key) return &d;
  }
  return nullptr;
}

[[noreturn]] void unknown_key(const std::string& source, const std::string& key) {
  std::string best;
  size_t best_d = 4;
  for (const Def& d : defs()) {
    size_t dist = distance(key, d.key);
    if (dist < best_d) best_d = dist, best = d.key;
  }
  LOCUS_THROW(source, ": unknown key '", key, "'", best.empty() ? "" : str(" (did you mean '", best, "'?)"),
              "; docs/llm_args.md lists the known keys");
}

std::string trim(std::string s) {
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && ws(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && ws(s[i])) ++i;
  return s.substr(i);
}

template <typename T>
bool parse_integer(const std::string& s, T& out) {
  const std::string t = trim(s);
  if (t.empty()) return false;
  const char* b = t.data();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, t.data() + t.size(), out);
  return ec == std::errc() && p == t.data() + t.size();
}

bool parse_bool(const std::string& s, bool& out) {
  std::string t = trim(s);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "1" || t == "yes" || t == "on") return out = true, true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return out = false, true;
  return false;
}

bool is_null_word(const std::string& s) {
  const std::string t = trim(s);
  return t.empty() || t == "null" || t == "~" || t == "none" || t == "None" || t == "NULL" || t == "Null";
}

[[noreturn]] void bad_value(const std::string& source, const std::string& key, const Ref& r, const std::string& v) {
  LOCUS_THROW(source, ": key '", key, "' expects ", type_name(r), ", got '", v, "'");
}

// Sets a scalar field from its text (flags and YAML scalars go through here).
void set_from_string(LlmArgs& a, const Def& d, const std::string& v, const std::string& source) {
  Ref r = d.ref(a);
  bool ok = std::visit(
      [&](auto* p) -> bool {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = v;
          return true;
        } else if constexpr (std::is_same_v<T, bool>) {
          return parse_bool(v, *p);
        } else if constexpr (std::is_same_v<T, double>) {
          const std::string t = trim(v);
          if (t.empty()) return false;
          char* end = nullptr;
          double x = std::strtod(t.c_str(), &end);
          if (end != t.c_str() + t.size() || !std::isfinite(x)) return false;
          *p = x;
          return true;
        } else if constexpr (std::is_same_v<T, std::optional<int>>) {
          if (is_null_word(v)) {
            p->reset();
            return true;
          }
          int x = 0;
          if (!parse_integer(v, x)) return false;
          *p = x;
          return true;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          p->clear();
          std::string item;
          std::stringstream ss(v);
          while (std::getline(ss, item, ',')) {
            item = trim(item);
            if (!item.empty()) p->push_back(item);
          }
          return true;
        } else {
          if (trim(v).rfind('-', 0) == 0 && std::is_unsigned_v<T>) return false;
          return parse_integer(v, *p);
        }
      },
      r);
  if (!ok) bad_value(source, d.key, r, v);
}

void set_from_yaml(LlmArgs& a, const Def& d, const YAML::Node& n, const std::string& source) {
  Ref r = d.ref(a);
  if (auto* list = std::get_if<std::vector<std::string>*>(&r)) {
    if (n.IsNull()) {
      (*list)->clear();
      return;
    }
    if (!n.IsSequence()) bad_value(source, d.key, r, YAML::Dump(n));
    std::vector<std::string> out;
    for (const YAML::Node& e : n) {
      if (!e.IsScalar()) bad_value(source, d.key, r, YAML::Dump(n));
      out.push_back(e.Scalar());
    }
    **list = std::move(out);
    return;
  }
  if (n.IsNull()) {
    if (auto* opt = std::get_if<std::optional<int>*>(&r)) {
      (*opt)->reset();
      return;
    }
    bad_value(source, d.key, r, "null");
  }
  if (!n.IsScalar()) bad_value(source, d.key, r, YAML::Dump(n));
  if (std::holds_alternative<std::optional<int>*>(r) && is_null_word(n.Scalar())) bad_value(source, d.key, r, n.Scalar());
  set_from_string(a, d, n.Scalar(), source);
}

void apply_map(LlmArgs& a, const YAML::Node& map, const std::string& prefix, const std::string& source) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) LOCUS_THROW(source, ": keys must be strings");
    const std::string key = prefix + it->first.Scalar();
    if (key == "locality_domains") {
      if (it->second.IsNull()) continue;
      LOCUS_CHECK(it->second.IsMap(), source, ": key 'locality_domains' expects a map of its fields, got '",
                  YAML::Dump(it->second), "'");
      apply_map(a, it->second, "locality_domains.", source);
      continue;
    }
    const Def* d = find_def(key);
    if (d == nullptr) unknown_key(source, key);
    set_from_yaml(a, *d, it->second, source);
  }
}

// JSON -> YAML node, for .json files (yaml-cpp reads most JSON, but not every valid one, e.g. tabs).
YAML::Node json_to_yaml(const nlohmann::json& j) {
  if (j.is_object()) {
    YAML::Node n(YAML::NodeType::Map);
    for (auto it = j.begin(); it != j.end(); ++it) n[it.key()] = json_to_yaml(it.value());
    return n;
  }
  if (j.is_array()) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (const auto& e : j) n.push_back(json_to_yaml(e));
    return n;
  }
  if (j.is_null()) return YAML::Node(YAML::NodeType::Null);
  if (j.is_string()) return YAML::Node(j.get<std::string>());
  return YAML::Node(j.dump());  // numbers and booleans in their JSON spelling
}

LlmArgs apply_document(const YAML::Node& root, const std::string& source, const LlmArgs& base) {
  LlmArgs a = base;
  if (!root.IsDefined() || root.IsNull()) return a;
  LOCUS_CHECK(root.IsMap(), source, ": the top level must be a map of LlmArgs keys");
  apply_map(a, root, "", source);
  return a;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string value_text(const Ref& r) {
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return quote(*p);
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          char buf[64];
          auto [e, ec] = std::to_chars(buf, buf + sizeof(buf), *p);
          std::string s(buf, e);
          if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
          return s;
        } else if constexpr (std::is_same_v<T, std::optional<int>>) {
          return p->has_value() ? std::to_string(**p) : "null";
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::string s = "[";
          for (size_t i = 0; i < p->size(); ++i) s += (i ? ", " : "") + quote((*p)[i]);
          return s + "]";
        } else {
          return std::to_string(*p);
        }
      },
      r);
}

}  // namespace

LlmArgs llm_args_from_yaml_string(const std::string& text, const std::string& source, const LlmArgs& base) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    LOCUS_THROW(source, ": not valid YAML/JSON: ", e.what());
  }
  return apply_document(root, source, base);
}

LlmArgs load_llm_args_file(const std::string& path, const LlmArgs& base) {
  std::ifstream in(path);
  LOCUS_CHECK(in.good(), "cannot read LlmArgs config file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (is_json) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      LOCUS_THROW(path, ": not valid JSON: ", e.what());
    }
    return apply_document(json_to_yaml(j), path, base);
  }
  return llm_args_from_yaml_string(text, path, base);
}

void set_llm_arg(LlmArgs& args, const std::string& key, const std::string& value) {
  const Def* d = find_def(key);
  if (d == nullptr) unknown_key("LlmArgs", key);
  set_from_string(args, *d, value, "LlmArgs");
}

std::string get_llm_arg(const LlmArgs& args, const std::string& key) {
  const Def* d = find_def(key);
  if (d == nullptr) unknown_key("LlmArgs", key);
  return value_text(d->ref(const_cast<LlmArgs&>(args)));
}

std::string dump_llm_args(const LlmArgs& args) {
  std::string out;
  bool in_ld = false;
  for (const Def& d : defs()) {
    const std::string text = value_text(d.ref(const_cast<LlmArgs&>(args)));
    const std::string prefix = "locality_domains.";
    if (d.key.rfind(prefix, 0) == 0) {
      if (!in_ld) out += "locality_domains:\n";
      in_ld = true;
      out += "  " + d.key.substr(prefix.size()) + ": " + text + "\n";
    } else {
      in_ld = false;
      out += d.key + ": " + text + "\n";
    }
  }
  return out;
}

std::string dump_defaults() { return dump_llm_args(LlmArgs{}); }

const std::vector<LlmArgField>& llm_arg_fields() {
  static const std::vector<LlmArgField> fields = [] {
    std::vector<LlmArgField> out;
    LlmArgs a;
    for (const Def& d : defs()) {
      std::string flag = "--" + d.key;
      std::replace(flag.begin() + 2, flag.end(), '_', '-');
      std::replace(flag.begin() + 2, flag.end(), '.', '-');
      out.push_back({d.key, flag, type_name(d.ref(a)), d.help});
    }
    return out;
  }();
  return fields;
}

const std::vector<BackendCapabilities>& known_backends() {
  static const std::vector<BackendCapabilities> b = {
      {"cpu", true, /*has_ld_ops=*/true, /*supports_cuda_graphs=*/false},
#if defined(LOCUS_WITH_CUDA)
      {"cuda", true, true, true},
#else
      {"cuda", false, true, true},
#endif
  };
  return b;
}

const BackendCapabilities& backend_capabilities(const std::string& name) {
  std::string names;
  for (const BackendCapabilities& b : known_backends()) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  LOCUS_THROW("backend '", name, "' is unknown (expected one of: ", names, ")");
}

void validate(const LlmArgs& a, const BackendCapabilities& backend) {
  // Locality domains against the features that assume one whole-device weight copy.
  if (a.enable_locality_domains) {
    LOCUS_CHECK(!a.weight_sharing, "enable_locality_domains=true is incompatible with weight_sharing=true: "
                "localized weights live in per-domain shards that other processes cannot map; disable one of them");
    LOCUS_CHECK(!a.fused_allreduce, "enable_locality_domains=true is incompatible with fused_allreduce=true: "
                "the fused all-reduce kernels expect unpartitioned outputs; disable one of them");
    LOCUS_CHECK(!a.gms_weight_loading, "enable_locality_domains=true is incompatible with gms_weight_loading=true: "
                "weights in an externally owned memory-service pool cannot be re-placed per domain; disable one of them");
    LOCUS_CHECK(backend.has_ld_ops, "enable_locality_domains=true is not supported by backend=", backend.name,
                ": that backend has no locality-domain (partitioned) ops");
  }
  LOCUS_CHECK(backend.name == a.backend, "validate: capabilities of backend '", backend.name, "' given for backend=", a.backend);
  LOCUS_CHECK(backend.built, "backend=", a.backend, " is not built into this binary (rebuild with -DLOCUS_CUDA=ON on a machine with nvcc)");
  LOCUS_CHECK(!a.cuda_graphs || backend.supports_cuda_graphs, "cuda_graphs=true needs a backend with CUDA graphs, but backend=",
              a.backend, " has none (set backend=cuda or cuda_graphs=false)");
  LOCUS_CHECK(!a.decode_lookahead || a.cuda_graphs, "decode_lookahead=true needs cuda_graphs=true (its chained steps "
              "replay decode graphs); set cuda_graphs=true or decode_lookahead=false");
  LOCUS_CHECK(a.dtype == "bf16", "dtype='", a.dtype, "' is not supported (expected bf16)");
  LOCUS_CHECK(a.device >= 0, "device must be >= 0, got ", a.device);
  LOCUS_CHECK(a.max_batch_size >= 1, "max_batch_size must be >= 1, got ", a.max_batch_size);
  LOCUS_CHECK(a.max_seq_len >= 1, "max_seq_len must be >= 1, got ", a.max_seq_len);
  LOCUS_CHECK(a.kv_cache_budget_bytes >= 0, "kv_cache_budget_bytes must be >= 0 (0 = use kv_cache_memory_fraction), got ",
              a.kv_cache_budget_bytes);
  LOCUS_CHECK(a.kv_cache_memory_fraction > 0 && a.kv_cache_memory_fraction <= 1,
              "kv_cache_memory_fraction must be in (0, 1], got ", a.kv_cache_memory_fraction);
  LOCUS_CHECK(a.num_threads >= 0, "num_threads must be >= 0 (0 = hardware concurrency), got ", a.num_threads);
  LOCUS_CHECK(a.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1, got ", a.tensor_parallel_size);
  LOCUS_CHECK(a.tensor_parallel_size == 1, "tensor_parallel_size=", a.tensor_parallel_size,
              " is not supported by this build (one device per model)");
  const auto& ld = a.locality_domains;
  if (ld.emulate) {
    LOCUS_CHECK(*ld.emulate >= 1, "locality_domains.emulate must be >= 1, got ", *ld.emulate);
  }
  LOCUS_CHECK(ld.num_partitions >= 0, "locality_domains.num_partitions must be >= 0 (0 = one per domain), got ",
              ld.num_partitions);
  if (ld.emulate && ld.num_partitions > 0) {
    LOCUS_CHECK(ld.num_partitions <= *ld.emulate, "locality_domains.num_partitions=", ld.num_partitions,
                " exceeds locality_domains.emulate=", *ld.emulate, " (at most one partition per domain)");
  }
  for (const std::string& op : ld.allowed_ops) {
    try {
      locality::op_kind_from_name(op);
    } catch (const Error& e) {
      LOCUS_THROW("locality_domains.allowed_ops: ", e.what());
    }
  }
  for (const std::string& p : ld.exclude_modules) {
    LOCUS_CHECK(!p.empty(), "locality_domains.exclude_modules holds an empty pattern");
  }
  const std::vector<std::string> levels = {"error", "warn", "info", "debug"};
  LOCUS_CHECK(std::find(levels.begin(), levels.end(), a.log_level) != levels.end(), "log_level='", a.log_level,
              "' is unknown (expected error, warn, info or debug)");
}

void validate(const LlmArgs& args) { validate(args, backend_capabilities(args.backend)); }

locality::LocalityDomainPolicy to_locality_policy(const LlmArgs& args) {
  locality::LocalityDomainPolicy p;
  p.enabled = args.enable_locality_domains;
  p.num_partitions = args.locality_domains.num_partitions;
  p.allowed_ops.clear();
  for (const std::string& op : args.locality_domains.allowed_ops) p.allowed_ops.insert(locality::op_kind_from_name(op));
  p.exclude_modules = args.locality_domains.exclude_modules;
  return p;
}

}  // namespace locus::runtime
