#include "models/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/float_convert.h"
#include "ops/nvfp4.h"
#include "runtime/quant_config.h"
#include "runtime/safetensors.h"
#include "runtime/tokenizer.h"

namespace locus::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

// Merges of the tiny tokenizer, in rank order (common English pairs; every input exists before it
// is used). 256 byte tokens + these + 2 special tokens = 320 ids.
const std::vector<std::pair<std::string, std::string>>& tiny_merges() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {" ", "t"},  {"h", "e"},   {" ", "a"},   {"i", "n"},  {" t", "he"}, {"e", "r"},  {"o", "n"},  {" ", "s"},
      {"r", "e"},  {"a", "t"},   {"e", "n"},   {" ", "w"},  {"o", "r"},   {"i", "s"},  {" ", "o"},  {"a", "n"},
      {"e", "s"},  {" ", "c"},   {"in", "g"},  {" ", "b"},  {" ", "f"},   {"e", "d"},  {" ", "p"},  {"a", "r"},
      {"o", "u"},  {" ", "m"},   {"l", "l"},   {"i", "t"},  {" o", "f"},  {" ", "d"},  {"a", "l"},  {" a", "n"},
      {" an", "d"}, {"i", "c"},  {" ", "h"},   {" ", "i"},  {"l", "e"},   {"s", "t"},  {" t", "o"}, {" ", "l"},
      {"r", "o"},  {"o", "m"},   {" ", "n"},   {" i", "n"}, {" ", "r"},   {"v", "e"},  {"c", "e"},  {" ", "e"},
      {"l", "y"},  {"o", "w"},   {" ", "g"},   {" ", "re"}, {"i", "on"},  {"e", "t"},  {" ", "u"},  {"u", "t"},
      {"a", "s"},  {" w", "h"},  {" ", "y"},   {"o", "t"},  {"\n", "\n"}, {" ", " "},
  };
  return m;
}

const char* kBos = "<｜begin▁of▁sentence｜>";
const char* kEos = "<｜end▁of▁sentence｜>";

// splitmix64: a well-mixed 64-bit sequence; the basis of the deterministic init.
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// Calls fn(i0, i1) over [0, n) in contiguous chunks, on up to the hardware's threads, with at
// least about `min_chunk` items each (tiny tensors: one call on this thread).
void in_chunks(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t threads = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), n / min_chunk + 1);
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < threads; ++t) workers.emplace_back(fn, n * t / threads, n * (t + 1) / threads);
  fn(0, n / threads);
  for (std::thread& w : workers) w.join();
}

}  // namespace

// Box-Muller over splitmix, seeded by (seed, tensor name), so a tensor's values do not depend on
// which other tensors exist or on the C++ library. Splitmix's state only counts up, so value pair
// j (the sequence's calls 2j + 1 and 2j + 2) can start anywhere: large tensors (DeepSeek-V3's
// widths) are filled by several threads, with the same values.
std::vector<float> tiny_model_normal_values(uint64_t seed, const std::string& name, int64_t n, double std) {
  const uint64_t s0 = seed ^ fnv1a(name);
  std::vector<float> v(static_cast<size_t>(n));
  in_chunks((n + 1) / 2, 1 << 20, [&](int64_t j0, int64_t j1) {
    uint64_t s = s0 + static_cast<uint64_t>(2 * j0) * 0x9E3779B97F4A7C15ull;
    for (int64_t j = j0; j < j1; ++j) {
      const double u1 = (static_cast<double>(splitmix(s) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
      const double u2 = static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      v[2 * j] = static_cast<float>(std * r * std::cos(2 * M_PI * u2));
      if (2 * j + 1 < n) v[2 * j + 1] = static_cast<float>(std * r * std::sin(2 * M_PI * u2));
    }
  });
  return v;
}

namespace {

Tensor bf16_tensor(const Shape& shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(shape, DType::kBF16);
  auto* p = t.data<uint16_t>();
  in_chunks(static_cast<int64_t>(v.size()), 1 << 22, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) p[i] = f32_to_bf16_bits(v[i]);
  });
  return t;
}

Tensor f32_scalar(float v) {
  Tensor t = Tensor::empty({}, DType::kFP32);
  t.data<float>()[0] = v;
  return t;
}

// One weight of the model before quantization.
struct Weight {
  enum Kind { kMatrix, kNorm, kBias };
  Weight(std::string n, Shape s, Kind k = kMatrix, bool q = false, std::string partner = "")
      : name(std::move(n)), shape(std::move(s)), kind(k), quantize(q), scale_partner(std::move(partner)) {}
  std::string name;           // full tensor name, ".weight" included
  Shape shape;
  Kind kind;
  bool quantize;              // NVFP4 when the options ask for it
  std::string scale_partner;  // gate <-> up: share one global scale (fused gate_up stays exact)
};

std::vector<Weight> weights(const TinyModelOptions& o, const DeepseekV3Config& c) {
  std::vector<Weight> w;
  const int64_t H = c.hidden_size;
  w.push_back({"model.embed_tokens.weight", {c.vocab_size, H}});
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const std::string p = "model.layers." + std::to_string(L) + ".";
    w.push_back({p + "input_layernorm.weight", {H}, Weight::kNorm});
    w.push_back({p + "self_attn.q_a_proj.weight", {*c.q_lora_rank, H}});
    w.push_back({p + "self_attn.q_a_layernorm.weight", {*c.q_lora_rank}, Weight::kNorm});
    w.push_back({p + "self_attn.q_b_proj.weight", {c.q_out_features(), *c.q_lora_rank}});
    w.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_a_out_features(), H}});
    w.push_back({p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, Weight::kNorm});
    w.push_back({p + "self_attn.kv_b_proj.weight", {c.kv_b_out_features(), c.kv_lora_rank}});
    w.push_back({p + "self_attn.o_proj.weight", {H, c.o_in_features()}});
    w.push_back({p + "post_attention_layernorm.weight", {H}, Weight::kNorm});
    auto mlp = [&](const std::string& q, int64_t inter) {
      w.push_back({q + "gate_proj.weight", {inter, H}, Weight::kMatrix, true, q + "up_proj.weight"});
      w.push_back({q + "up_proj.weight", {inter, H}, Weight::kMatrix, true, q + "gate_proj.weight"});
      w.push_back({q + "down_proj.weight", {H, inter}, Weight::kMatrix, true});
    };
    if (!c.is_moe_layer(L)) {
      mlp(p + "mlp.", c.intermediate_size);
    } else {
      w.push_back({p + "mlp.gate.weight", {c.n_routed_experts, H}});
      w.push_back({p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}, Weight::kBias});
      for (int64_t e = 0; e < c.n_routed_experts; ++e) mlp(p + "mlp.experts." + std::to_string(e) + ".", c.moe_intermediate_size);
      if (c.n_shared_experts > 0) mlp(p + "mlp.shared_experts.", c.shared_intermediate_size());
    }
  }
  w.push_back({"model.norm.weight", {H}, Weight::kNorm});
  w.push_back({"lm_head.weight", {c.vocab_size, H}});
  if (!o.nvfp4) {
    for (Weight& x : w) x.quantize = false;
  }
  return w;
}

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  return weight_name.substr(0, weight_name.size() - suffix.size());
}

std::vector<std::string> nvfp4_excludes(const DeepseekV3Config& c) {
  std::vector<std::string> ex = {"lm_head"};
  for (int64_t L = 0; L < c.num_hidden_layers; ++L) {
    const std::string p = "model.layers." + std::to_string(L) + ".";
    ex.push_back(p + "self_attn*");
    if (c.is_moe_layer(L)) ex.push_back(p + "mlp.gate");
  }
  return ex;
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  LOCUS_CHECK(out.good(), "cannot write '", p.string(), "'");
  out << text;
  out.close();
  LOCUS_CHECK(!out.fail(), "error while writing '", p.string(), "'");
}

void check_options(const TinyModelOptions& o) {
  auto pos = [](const char* n, int64_t v) { LOCUS_CHECK(v > 0, "tiny model: ", n, " must be positive, got ", v); };
  pos("num_layers", o.num_layers);
  pos("hidden_size", o.hidden_size);
  pos("num_heads", o.num_heads);
  pos("q_lora_rank", o.q_lora_rank);
  pos("kv_lora_rank", o.kv_lora_rank);
  pos("qk_nope_head_dim", o.qk_nope_head_dim);
  pos("qk_rope_head_dim", o.qk_rope_head_dim);
  pos("v_head_dim", o.v_head_dim);
  LOCUS_CHECK(o.n_shared_experts >= 0, "tiny model: n_shared_experts must not be negative, got ", o.n_shared_experts);
  pos("intermediate_size", o.intermediate_size);
  pos("moe_intermediate_size", o.moe_intermediate_size);
  pos("n_routed_experts", o.n_routed_experts);
  LOCUS_CHECK(o.num_shards >= 0, "tiny model: num_shards must be 0 (automatic) or positive, got ", o.num_shards);
  LOCUS_CHECK(o.init_std > 0 && std::isfinite(o.init_std), "tiny model: init_std must be positive, got ", o.init_std);
  if (o.nvfp4) {
    for (auto [n, v] : {std::pair{"hidden_size", o.hidden_size}, std::pair{"intermediate_size", o.intermediate_size},
                        std::pair{"moe_intermediate_size", o.moe_intermediate_size}}) {
      LOCUS_CHECK(v % 16 == 0, "tiny model: ", n, "=", v, " is not a multiple of 16, which NVFP4 (--nvfp4) needs");
    }
  }
}

}  // namespace

TinyModelOptions deepseek_v3_widths() {
  const DeepseekV3Config v3;  // its defaults are DeepSeek-V3's (transformers' DeepseekV3Config)
  TinyModelOptions o;
  o.hidden_size = v3.hidden_size;
  o.num_heads = v3.num_attention_heads;
  o.q_lora_rank = *v3.q_lora_rank;
  o.kv_lora_rank = v3.kv_lora_rank;
  o.qk_nope_head_dim = v3.qk_nope_head_dim;
  o.qk_rope_head_dim = v3.qk_rope_head_dim;
  o.v_head_dim = v3.v_head_dim;
  o.intermediate_size = v3.intermediate_size;
  o.moe_intermediate_size = v3.moe_intermediate_size;
  o.n_routed_experts = v3.n_routed_experts;
  o.num_experts_per_tok = v3.num_experts_per_tok;
  o.n_group = v3.n_group;
  o.topk_group = v3.topk_group;
  o.n_shared_experts = v3.n_shared_experts;
  return o;
}

int64_t tiny_tokenizer_vocab_size() { return 256 + static_cast<int64_t>(tiny_merges().size()) + 2; }

DeepseekV3Config tiny_model_config(const TinyModelOptions& o) {
  check_options(o);
  DeepseekV3Config c;
  c.architectures = {"DeepseekV3ForCausalLM"};
  c.vocab_size = tiny_tokenizer_vocab_size();
  c.hidden_size = o.hidden_size;
  c.intermediate_size = o.intermediate_size;
  c.moe_intermediate_size = o.moe_intermediate_size;
  c.num_hidden_layers = o.num_layers;
  c.num_nextn_predict_layers = 0;
  c.num_attention_heads = c.num_key_value_heads = o.num_heads;
  c.n_shared_experts = o.n_shared_experts;
  c.n_routed_experts = o.n_routed_experts;
  c.routed_scaling_factor = 2.5;
  c.kv_lora_rank = o.kv_lora_rank;
  c.q_lora_rank = o.q_lora_rank;
  c.qk_rope_head_dim = o.qk_rope_head_dim;
  c.v_head_dim = o.v_head_dim;
  c.qk_nope_head_dim = o.qk_nope_head_dim;
  c.topk_method = "noaux_tc";
  c.n_group = o.n_group;
  c.topk_group = o.topk_group;
  c.num_experts_per_tok = o.num_experts_per_tok;
  c.moe_layer_freq = 1;
  c.first_k_dense_replace = 1;
  c.norm_topk_prob = true;
  c.scoring_func = "sigmoid";
  c.max_position_embeddings = o.max_position_embeddings;
  c.initializer_range = o.init_std;
  c.rope_theta = 10000.0;
  RopeScaling r;  // YaRN as in V3 (factor 40 over 4096), scaled down: factor 4 over 512
  r.factor = 4.0;
  r.original_max_position_embeddings = 512;
  r.mscale = 1.0;
  r.mscale_all_dim = 1.0;
  c.rope_scaling = r;
  c.bos_token_id = c.vocab_size - 2;
  c.eos_token_ids = {c.vocab_size - 1};
  if (o.nvfp4) {
    c.quantization_config = {{"quant_method", "modelopt"},
                             {"quant_algo", "NVFP4"},
                             {"group_size", 16},
                             {"ignore", nvfp4_excludes(c)}};
  }
  c.validate();
  return c;
}

std::vector<TinyTensorSpec> tiny_model_tensor_specs(const TinyModelOptions& o) {
  const DeepseekV3Config c = tiny_model_config(o);
  std::vector<TinyTensorSpec> out;
  for (const Weight& w : weights(o, c)) {
    if (w.kind == Weight::kBias) {
      out.push_back({w.name, DType::kFP32, w.shape});
    } else if (w.quantize) {
      const std::string m = module_of(w.name);
      out.push_back({w.name, DType::kU8, {w.shape[0], w.shape[1] / 2}});
      out.push_back({m + ".weight_scale", DType::kFP8E4M3, {w.shape[0], w.shape[1] / 16}});
      out.push_back({m + ".weight_scale_2", DType::kFP32, {}});
      out.push_back({m + ".input_scale", DType::kFP32, {}});
    } else {
      out.push_back({w.name, DType::kBF16, w.shape});
    }
  }
  return out;
}

std::string tiny_tokenizer_json() {
  using runtime::byte_level_encode;
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  ordered_json merges = ordered_json::array();
  int id = 256;
  for (const auto& [a, b] : tiny_merges()) {
    const std::string ea = byte_level_encode(a), eb = byte_level_encode(b);
    LOCUS_CHECK(vocab.contains(ea) && vocab.contains(eb) && !vocab.contains(ea + eb), "tiny tokenizer: bad merge '", a,
                "' + '", b, "'");
    vocab[ea + eb] = id++;
    merges.push_back(ordered_json::array({ea, eb}));
  }
  auto added = [](int i, const char* content) {
    return ordered_json{{"id", i},          {"content", content}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false},  {"normalized", false}, {"special", true}};
  };
  ordered_json split = [] {
    auto s = [](const char* regex) {
      return ordered_json{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
    };
    return ordered_json{
        {"type", "Sequence"},
        {"pretokenizers",
         {s("\\p{N}{1,3}"), s("[一-龥぀-ゟ゠-ヿ]+"),
          s(R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
          ordered_json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  }();
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {added(id, kBos), added(id + 1, kEos)};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = split;
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},          {"dropout", nullptr},      {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},              {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},      {"byte_fallback", false},  {"ignore_merges", false},
                {"vocab", vocab},         {"merges", merges}};
  return j.dump(1);
}

std::string tiny_tokenizer_config_json() {
  auto tok = [](const char* content) {
    return ordered_json{{"__type", "AddedToken"}, {"content", content}, {"lstrip", false},
                        {"normalized", true},     {"rstrip", false},    {"single_word", false}};
  };
  ordered_json j;
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  j["bos_token"] = tok(kBos);
  j["eos_token"] = tok(kEos);
  j["pad_token"] = tok(kEos);
  j["clean_up_tokenization_spaces"] = false;
  j["legacy"] = true;
  j["model_max_length"] = 2048;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["unk_token"] = nullptr;
  return j.dump(2);
}

namespace {

// Every output tensor of weight `w`, in file order: its BF16 matrix, norm or fp32 bias; with
// NVFP4, the four ModelOpt tensors.
std::vector<std::pair<std::string, Tensor>> materialize(const Weight& w, const TinyModelOptions& o) {
  auto values = [&](const Weight& x) {
    return tiny_model_normal_values(o.seed, x.name, shape_numel(x.shape), o.init_std);
  };
  if (w.kind == Weight::kNorm)
    return {{w.name, bf16_tensor(w.shape, std::vector<float>(static_cast<size_t>(shape_numel(w.shape)), 1.f))}};
  if (w.kind == Weight::kBias) {
    // e_score_correction_bias: small, so it shifts expert choice without dominating the scores.
    std::vector<float> v = tiny_model_normal_values(o.seed, w.name, shape_numel(w.shape), 0.05);
    Tensor t = Tensor::empty(w.shape, DType::kFP32);
    std::memcpy(t.data_ptr(), v.data(), v.size() * sizeof(float));
    return {{w.name, t}};
  }
  Tensor bf = bf16_tensor(w.shape, values(w));
  if (!w.quantize) return {{w.name, bf}};
  // gate and up share one weight_scale_2 (the larger one), as ModelOpt's DeepSeek export does.
  float global = ops::nvfp4_global_scale_for(bf);
  if (!w.scale_partner.empty()) {
    const Weight partner{w.scale_partner, w.shape};
    global = std::max(global, ops::nvfp4_global_scale_for(bf16_tensor(w.shape, values(partner))));
  }
  ops::Nvfp4Weight q = ops::nvfp4_quantize(bf, global);
  const std::string m = module_of(w.name);
  // A nominal static activation scale (amax 4 / (6 * 448)); weight-only execution ignores it.
  return {{w.name, q.packed},
          {m + ".weight_scale", q.scales},
          {m + ".weight_scale_2", f32_scalar(q.global_scale)},
          {m + ".input_scale", f32_scalar(4.0f / 2688.0f)}};
}

uint64_t spec_bytes(const TinyTensorSpec& t) {
  return static_cast<uint64_t>(shape_numel(t.shape)) * static_cast<uint64_t>(dtype_size(t.dtype));
}

uint64_t total_bytes(const std::vector<TinyTensorSpec>& specs) {
  uint64_t total = 0;
  for (const TinyTensorSpec& t : specs) total += spec_bytes(t);
  return total;
}

// tiny_model_shards for a checkpoint of `total` bytes.
int shards_for(const TinyModelOptions& o, uint64_t total) {
  if (o.num_shards > 0) return o.num_shards;
  return static_cast<int>(std::max<uint64_t>(2, (total + kTinyModelShardBytes - 1) / kTinyModelShardBytes));
}

std::string gb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", static_cast<double>(bytes) * 1e-9);
  return buf;
}

// The free bytes where `dir` is or would be created (its nearest existing ancestor); none known:
// the largest value, so that the check passes and the write itself reports a full disk.
uint64_t free_bytes_at(fs::path dir) {
  std::error_code ec;
  dir = fs::absolute(dir, ec);
  while (!dir.empty() && !fs::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir)
    dir = dir.parent_path();
  const fs::space_info room = fs::space(dir, ec);
  return ec ? UINT64_MAX : room.available;
}

}  // namespace

int tiny_model_shards(const TinyModelOptions& o) {
  return o.num_shards > 0 ? o.num_shards : shards_for(o, total_bytes(tiny_model_tensor_specs(o)));
}

void write_tiny_model(const std::string& dir, const TinyModelOptions& o) {
  const DeepseekV3Config c = tiny_model_config(o);
  // The file's tensors, their sizes and shards (of about equal bytes, in order) come from the
  // specs, so that each shard's tensors are drawn, written and let go before the next one's:
  // memory holds one shard, not the checkpoint.
  const std::vector<TinyTensorSpec> specs = tiny_model_tensor_specs(o);
  const uint64_t total = total_bytes(specs);
  const uint64_t free = free_bytes_at(dir);
  LOCUS_CHECK(free >= total + (64 << 20), "the checkpoint needs ", gb(total), " but '", dir, "' has ", gb(free),
              " free (fewer layers or experts make it smaller)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOCUS_CHECK(fs::is_directory(dir), "cannot create model directory '", dir, "'", ec ? ": " + ec.message() : "");
  const int shards = shards_for(o, total);
  auto shard_name = [&](int s) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "model-%05d-of-%05d.safetensors", s + 1, shards);
    return std::string(buf);
  };
  std::vector<int> shard_of;
  uint64_t acc = 0;
  for (const TinyTensorSpec& t : specs) {
    shard_of.push_back(static_cast<int>(
        std::min<uint64_t>(static_cast<uint64_t>(shards - 1), acc * shards / std::max<uint64_t>(total, 1))));
    acc += spec_bytes(t);
  }

  ordered_json weight_map = ordered_json::object();
  runtime::SafetensorsWriter writer;
  int shard = 0;
  auto write_shard = [&] {
    writer.set_metadata("format", "pt");
    writer.write((fs::path(dir) / shard_name(shard)).string());
    writer = runtime::SafetensorsWriter();
    ++shard;
  };
  size_t i = 0;
  for (const Weight& w : weights(o, c)) {
    for (const auto& [name, t] : materialize(w, o)) {
      LOCUS_CHECK(i < specs.size() && specs[i].name == name && spec_bytes(specs[i]) == t.nbytes(),
                  "tiny model: tensor ", name, " does not match its spec");  // a bug, not an input error
      while (shard < shard_of[i]) write_shard();
      writer.add(name, t, t.dtype() == DType::kFP4E2M1x2 ? "U8" : "");
      weight_map[name] = shard_name(shard_of[i]);
      ++i;
    }
  }
  while (shard < shards) write_shard();
  ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  write_text(fs::path(dir) / "model.safetensors.index.json", index.dump(2) + "\n");
  write_text(fs::path(dir) / "config.json", c.to_json().dump(2) + "\n");
  if (o.nvfp4) {
    runtime::QuantConfig q;
    q.algo = runtime::QuantAlgo::kNvfp4;
    q.group_size = 16;
    q.exclude_modules = nvfp4_excludes(c);
    write_text(fs::path(dir) / "hf_quant_config.json", runtime::to_hf_quant_config_json(q).dump(2) + "\n");
  } else if (fs::exists(fs::path(dir) / "hf_quant_config.json")) {
    fs::remove(fs::path(dir) / "hf_quant_config.json");  // a BF16 model written over an NVFP4 one
  }
  write_text(fs::path(dir) / "tokenizer.json", tiny_tokenizer_json() + "\n");
  write_text(fs::path(dir) / "tokenizer_config.json", tiny_tokenizer_config_json() + "\n");
  ordered_json gen;
  gen["_from_model_config"] = true;
  gen["bos_token_id"] = *c.bos_token_id;
  gen["eos_token_id"] = c.eos_token_ids[0];
  gen["do_sample"] = false;
  write_text(fs::path(dir) / "generation_config.json", gen.dump(2) + "\n");
}

}  // namespace locus::models
