#include "runtime/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "runtime/pretokenizer.h"
#include "runtime/unicode_data.h"

namespace locus::runtime {
namespace {

using nlohmann::json;

// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to U+0100 + n.
struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::unordered_map<char32_t, uint8_t> from_unicode;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      unicode::append_utf8(to_unicode[b], cp);
      from_unicode[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// One pre-tokenization step.
struct PreStep {
  enum Kind { kSplit, kByteLevel } kind = kSplit;
  SplitPattern pattern = SplitPattern::kGpt2;
};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  LOCUS_CHECK(in.good(), "cannot read '", p.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::unordered_map<std::string, int32_t> vocab;  // token (as in the file) -> id
  std::vector<std::string> id_to_token;            // "" for unused ids
  std::vector<std::string> id_bytes;               // raw bytes per id
  std::unordered_map<std::string, int32_t> merge_rank;  // a + '\xff' + b -> rank
  bool ignore_merges = false;
  struct Added {
    std::string content;
    int32_t id;
    bool special;
    bool lstrip, rstrip;
  };
  std::vector<Added> added;  // longest content first
  std::vector<bool> special;
  std::vector<PreStep> steps;
  bool add_prefix_space = false;
  std::string description;
  std::optional<int32_t> bos, eos;

  [[noreturn]] void fail(const std::string& what) const { LOCUS_THROW("tokenizer '", source, "': ", what); }

  void set_token(int32_t id, const std::string& token, const std::string& bytes) {
    if (id < 0) fail(str("negative token id ", id, " for '", token, "'"));
    if (static_cast<size_t>(id) >= id_to_token.size()) {
      id_to_token.resize(id + 1);
      id_bytes.resize(id + 1);
      special.resize(id + 1, false);
    }
    id_to_token[id] = token;
    id_bytes[id] = bytes;
  }

  // BPE over one pre-tokenized piece (raw bytes), appending ids.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const {
    const ByteMap& bm = byte_map();
    std::vector<std::string> sym;
    sym.reserve(piece.size());
    for (unsigned char b : piece) sym.push_back(bm.to_unicode[b]);
    if (ignore_merges) {
      std::string whole;
      for (const std::string& s : sym) whole += s;
      if (auto it = vocab.find(whole); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    // Repeatedly merge the adjacent pair of lowest rank (pieces are short: quadratic is fine).
    std::string key;
    while (sym.size() > 1) {
      int best = std::numeric_limits<int>::max();
      size_t at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        key.assign(sym[i]).push_back('\xff');
        key += sym[i + 1];
        auto it = merge_rank.find(key);
        if (it != merge_rank.end() && it->second < best) best = it->second, at = i;
      }
      if (best == std::numeric_limits<int>::max()) break;
      sym[at] += sym[at + 1];
      sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (const std::string& s : sym) {
      auto it = vocab.find(s);
      if (it == vocab.end()) fail(str("symbol '", s, "' produced by BPE is not in the vocabulary"));
      out.push_back(it->second);
    }
  }

  void encode_segment(std::string_view seg, std::vector<int32_t>& out) const {
    if (seg.empty()) return;
    std::string prefixed;
    if (add_prefix_space && seg.front() != ' ') {
      prefixed = " " + std::string(seg);
      seg = prefixed;
    }
    std::vector<std::string_view> pieces = {seg};
    for (const PreStep& s : steps) {
      if (s.kind == PreStep::kByteLevel) continue;
      std::vector<std::string_view> next;
      for (std::string_view p : pieces) {
        for (std::string_view q : split_isolated(p, s.pattern)) next.push_back(q);
      }
      pieces.swap(next);
    }
    for (std::string_view p : pieces) bpe(p, out);
  }
};

namespace {

void parse_pre_tokenizer(const json& j, Tokenizer::Impl& t, bool& has_byte_level, std::vector<std::string>& desc) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) t.fail("pre_tokenizer has no \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array()) t.fail("Sequence pre_tokenizer has no list");
    for (const json& s : j["pretokenizers"]) parse_pre_tokenizer(s, t, has_byte_level, desc);
  } else if (type == "ByteLevel") {
    has_byte_level = true;
    if (j.value("add_prefix_space", false)) t.add_prefix_space = true;
    if (j.value("use_regex", true)) {
      t.steps.push_back({PreStep::kSplit, SplitPattern::kGpt2});
      desc.push_back("ByteLevel(gpt2 split)");
    } else {
      desc.push_back("ByteLevel");
    }
    t.steps.push_back({PreStep::kByteLevel, SplitPattern::kGpt2});
  } else if (type == "Split") {
    const json& pat = j.value("pattern", json());
    std::string regex;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      regex = pat["Regex"].get<std::string>();
    } else {
      t.fail(str("Split pre_tokenizer pattern ", pat.dump(), " is not supported (expected {\"Regex\": ...})"));
    }
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior != "Isolated") t.fail(str("Split behavior '", behavior, "' is not supported (expected Isolated)"));
    if (j.value("invert", false)) t.fail("Split with invert=true is not supported");
    auto p = split_pattern_from_regex(regex);
    if (!p) {
      t.fail(str("Split regex '", regex,
                 "' is not one Locus implements (GPT-2 ByteLevel, DeepSeek-V3 digits / CJK / main; see runtime/pretokenizer.h)"));
    }
    t.steps.push_back({PreStep::kSplit, *p});
    desc.push_back(str("Split(", split_pattern_name(*p), ")"));
  } else {
    t.fail(str("pre_tokenizer type '", type, "' is not supported (expected ByteLevel, Split or Sequence)"));
  }
}

// "content" of a tokenizer_config.json token entry: a string or {"content": ...}.
std::optional<std::string> token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Tokenizer Tokenizer::from_json_string(const std::string& text, const std::string& config_text, const std::string& source) {
  auto impl = std::make_shared<Impl>();
  Impl& t = *impl;
  t.source = source;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    t.fail(str("not valid JSON: ", e.what()));
  }
  if (!j.is_object()) t.fail("not a JSON object");

  // Normalizer: none, or an empty Sequence (DeepSeek-V3 writes one).
  if (auto n = j.find("normalizer"); n != j.end() && !n->is_null()) {
    const bool empty_seq = n->is_object() && n->value("type", "") == "Sequence" && n->contains("normalizers") &&
                           (*n)["normalizers"].is_array() && (*n)["normalizers"].empty();
    if (!empty_seq) t.fail(str("normalizer ", n->dump(), " is not supported (expected null)"));
  }

  const json& model = j.value("model", json());
  if (!model.is_object()) t.fail("missing \"model\" object");
  const std::string mtype = model.value("type", std::string("BPE"));
  if (mtype != "BPE") t.fail(str("model type '", mtype, "' is not supported (expected BPE)"));
  if (model.value("byte_fallback", false)) t.fail("BPE byte_fallback is not supported (byte-level BPE needs none)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(k) && !model[k].is_null() && !(model[k].is_string() && model[k].get<std::string>().empty())) {
      t.fail(str("BPE ", k, " is not supported"));
    }
  }
  t.ignore_merges = model.value("ignore_merges", false);
  if (!model.contains("vocab") || !model["vocab"].is_object()) t.fail("model.vocab must be an object {token: id}");
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) t.fail(str("vocab id of '", it.key(), "' is not an integer"));
    const int32_t id = it.value().get<int32_t>();
    auto bytes = byte_level_decode(it.key());
    t.vocab[it.key()] = id;
    t.set_token(id, it.key(), bytes ? *bytes : it.key());
  }
  if (model.contains("merges")) {
    if (!model["merges"].is_array()) t.fail("model.merges must be a list");
    int rank = 0;
    for (const json& m : model["merges"]) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          t.fail(str("merge '", s, "' is not of the form \"a b\""));
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        t.fail(str("merge ", m.dump(), " is neither \"a b\" nor [a, b]"));
      }
      if (!t.vocab.count(a) || !t.vocab.count(b) || !t.vocab.count(a + b)) {
        t.fail(str("merge '", a, " ", b, "' (rank ", rank, ") uses or makes a token missing from the vocabulary"));
      }
      t.merge_rank.emplace(a + '\xff' + b, rank++);  // the first occurrence keeps its rank
    }
  }
  if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    if (!at->is_array()) t.fail("added_tokens must be a list");
    for (const json& a : *at) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        t.fail(str("added token ", a.dump(), " needs an integer \"id\" and a string \"content\""));
      }
      Impl::Added add{a["content"].get<std::string>(), a["id"].get<int32_t>(), a.value("special", false),
                      a.value("lstrip", false), a.value("rstrip", false)};
      if (add.content.empty()) t.fail("added token with empty content");
      t.set_token(add.id, add.content, add.content);
      t.special[add.id] = add.special;
      t.added.push_back(add);
    }
    std::stable_sort(t.added.begin(), t.added.end(),
                     [](const Impl::Added& x, const Impl::Added& y) { return x.content.size() > y.content.size(); });
  }

  bool has_byte_level = false;
  std::vector<std::string> desc;
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), t, has_byte_level, desc);
  if (!has_byte_level) t.fail("pre_tokenizer has no ByteLevel step: only byte-level BPE is supported");
  for (size_t i = 0; i < desc.size(); ++i) t.description += (i ? ", " : "") + desc[i];
  t.description = "Sequence[" + t.description + "]";
  if (auto d = j.find("decoder"); d != j.end() && !d->is_null()) {
    if (!d->is_object() || d->value("type", "") != "ByteLevel") t.fail(str("decoder ", d->dump(), " is not supported (expected ByteLevel)"));
  }

  if (!config_text.empty()) {
    json c;
    try {
      c = json::parse(config_text);
    } catch (const json::parse_error& e) {
      t.fail(str("tokenizer_config.json is not valid JSON: ", e.what()));
    }
    auto lookup = [&](const char* key) -> std::optional<int32_t> {
      auto it = c.find(key);
      if (it == c.end() || it->is_null()) return std::nullopt;
      auto content = token_content(*it);
      if (!content) t.fail(str("tokenizer_config.json ", key, " should be a string or {\"content\": ...}"));
      for (const Impl::Added& a : t.added) {
        if (a.content == *content) return a.id;
      }
      if (auto v = t.vocab.find(*content); v != t.vocab.end()) return v->second;
      t.fail(str("tokenizer_config.json ", key, " '", *content, "' is not a token of the vocabulary"));
    };
    t.bos = lookup("bos_token");
    t.eos = lookup("eos_token");
  }
  Tokenizer tok;
  tok.impl_ = std::move(impl);
  return tok;
}

Tokenizer Tokenizer::from_path(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path file = path, config;
  if (fs::is_directory(file)) {
    config = file / "tokenizer_config.json";
    file /= "tokenizer.json";
  } else {
    config = file.parent_path() / "tokenizer_config.json";
  }
  LOCUS_CHECK(fs::exists(file), "tokenizer file '", file.string(), "' does not exist");
  const std::string cfg = fs::exists(config) ? read_text(config) : "";
  return from_json_string(read_text(file), cfg, file.string());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  const Impl& t = *impl_;
  std::vector<int32_t> out;
  if (add_bos) {
    LOCUS_CHECK(t.bos.has_value(), "tokenizer '", t.source, "' has no bos_token (tokenizer_config.json)");
    out.push_back(*t.bos);
  }
  // Added tokens are found first (longest at each position); the text between them goes through
  // pre-tokenization and BPE.
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const Impl::Added* hit = nullptr;
    for (const Impl::Added& a : t.added) {
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t seg_end = i;
    if (hit->lstrip) {
      while (seg_end > seg && unicode::is_whitespace(static_cast<unsigned char>(text[seg_end - 1]))) --seg_end;
    }
    t.encode_segment(text.substr(seg, seg_end - seg), out);
    out.push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) {
      while (i < text.size() && unicode::is_whitespace(static_cast<unsigned char>(text[i]))) ++i;
    }
    seg = i;
  }
  t.encode_segment(text.substr(seg), out);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const Impl& t = *impl_;
  LOCUS_CHECK(id >= 0 && static_cast<size_t>(id) < t.id_to_token.size() && !t.id_to_token[id].empty(), "token id ", id,
              " is outside the vocabulary of tokenizer '", t.source, "' (size ", t.id_to_token.size(), ")");
  return t.id_bytes[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return sanitize_utf8(bytes);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const Impl& t = *impl_;
  for (const Impl::Added& a : t.added) {
    if (a.content == token) return a.id;
  }
  if (auto it = t.vocab.find(std::string(token)); it != t.vocab.end()) return it->second;
  return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  token_bytes(id);  // range check
  return impl_->id_to_token[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
const std::string& Tokenizer::pretokenizer_description() const { return impl_->description; }

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) out += byte_map().to_unicode[b];
  return out;
}

std::optional<std::string> byte_level_decode(std::string_view mapped) {
  std::string out;
  for (size_t p = 0; p < mapped.size();) {
    char32_t cp;
    p += static_cast<size_t>(unicode::decode_utf8(mapped, p, &cp));
    auto it = byte_map().from_unicode.find(cp);
    if (it == byte_map().from_unicode.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t p = 0; p < bytes.size();) {
    char32_t cp;
    const int len = unicode::decode_utf8(bytes, p, &cp);
    if (cp == 0xFFFFFFFFu) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(bytes.substr(p, static_cast<size_t>(len)));
    }
    p += static_cast<size_t>(len);
  }
  return out;
}

namespace {
// Length of a UTF-8 sequence announced by its lead byte (0 when b cannot start one).
int utf8_len(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}
}  // namespace

std::string StreamingDecoder::push(int32_t id) {
  if (skip_special_ && tok_->is_special(id)) return "";
  pending_ += tok_->token_bytes(id);
  // Emit everything up to an incomplete (but so far valid) sequence at the end of the buffer.
  size_t keep = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
    const auto b = static_cast<unsigned char>(pending_[pending_.size() - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: look further back for the lead
    const int need = utf8_len(b);
    if (need > static_cast<int>(back)) keep = pending_.size() - back;
    break;
  }
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, keep));
  pending_.erase(0, keep);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace locus::runtime
