// Hugging Face tokenizer.json reader for byte-level BPE (GPT-2 / DeepSeek-V3 style).
//
// Supported: model.type "BPE" with "vocab" {token: id} and "merges" as "a b" strings or [a, b]
// arrays (rank = position); "added_tokens" (special or not) matched in the raw text before any
// pre-tokenization, longest first; normalizer null; pre_tokenizer ByteLevel (use_regex: the GPT-2
// split), Split with the regexes of pretokenizer.h, or a Sequence of those; decoder ByteLevel.
// Anything else (another model type, an unknown Split regex, byte_fallback, ...) is an Error naming
// it. bos/eos come from tokenizer_config.json (bos_token / eos_token, string or {"content": ...})
// when present.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace locus::runtime {

class Tokenizer {
 public:
  // tokenizer.json text; `source` names it in errors. config_json: tokenizer_config.json text or "".
  static Tokenizer from_json_string(const std::string& tokenizer_json, const std::string& config_json = "",
                                    const std::string& source = "<string>");
  // A tokenizer.json file, or a directory holding tokenizer.json (and tokenizer_config.json).
  static Tokenizer from_path(const std::string& path);

  // Token ids of `text` (raw UTF-8 bytes; invalid UTF-8 is still encoded byte by byte).
  // add_bos prepends bos_id() (Error when the tokenizer has none).
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const;
  // Concatenated bytes of the tokens, invalid UTF-8 replaced by U+FFFD. skip_special drops
  // special added tokens. Error naming an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The raw bytes one token stands for (byte-level decoded; added tokens verbatim).
  std::string token_bytes(int32_t id) const;

  int32_t vocab_size() const;  // 1 + the largest id (vocab and added tokens)
  std::optional<int32_t> token_to_id(std::string_view token) const;  // token as written in the file
  std::string id_to_token(int32_t id) const;                         // as written in the file
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  const std::string& pretokenizer_description() const;  // e.g. "Sequence[Split(digits), ..., ByteLevel]"

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// Streaming detokenization: push ids one at a time, get back the text that is complete so far.
// A multi-byte UTF-8 character split over tokens is held back until its last byte arrives, so
// every returned piece is valid UTF-8; bytes that can never complete become U+FFFD.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tok, bool skip_special = true) : tok_(&tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string flush();  // whatever is pending (incomplete sequences as U+FFFD)

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

// GPT-2's byte <-> unicode map used by ByteLevel: printable bytes map to themselves, the rest to
// U+0100 + n. byte_to_unicode(0x20) == "Ġ".
std::string byte_level_encode(std::string_view bytes);          // bytes -> mapped UTF-8
std::optional<std::string> byte_level_decode(std::string_view mapped);  // inverse; nullopt when not a map image

// Replaces invalid UTF-8 with U+FFFD (the valid parts unchanged).
std::string sanitize_utf8(std::string_view bytes);

}  // namespace locus::runtime
