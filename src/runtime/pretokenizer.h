// Pre-tokenizer splits for byte-level BPE, hand-coded (no regex library) for the patterns real
// tokenizer.json files use, over Unicode general categories (unicode_data.h):
//   kGpt2:          's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//                   (ByteLevel use_regex = true)
//   kDigits1to3:    \p{N}{1,3}                                  (DeepSeek-V3 Split 1)
//   kCjk:           [一-龥\u3040-ゟ゠-ヿ]+                        (DeepSeek-V3 Split 2)
//   kDeepseekMain:  [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//                   ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (DeepSeek-V3 Split 3)
// Split behavior "Isolated" (matches and the gaps between them both become pieces) is the one
// supported, as all of these tokenizers use it.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace locus::runtime {

enum class SplitPattern { kGpt2, kDigits1to3, kCjk, kDeepseekMain };

// The pattern a tokenizer.json Split regex string denotes; nullopt when it is not one of them.
std::optional<SplitPattern> split_pattern_from_regex(const std::string& regex);
const char* split_pattern_name(SplitPattern p);

// Splits `text` (UTF-8; invalid bytes are treated as single "other" characters) into pieces,
// "Isolated": each match and each non-empty gap between matches is a piece, in order.
std::vector<std::string_view> split_isolated(std::string_view text, SplitPattern p);

}  // namespace locus::runtime
