// Unicode general-category lookups for the pre-tokenizer (tables generated from Python's
// unicodedata, Unicode 14.0; White_Space from PropList.txt).
#pragma once
#include <cstdint>
#include <string_view>

namespace locus::runtime::unicode {

enum Category : uint8_t { kOther = 0, kLetter, kMark, kNumber, kPunct, kSymbol, kSeparator };
Category category(char32_t cp);  // the major class (L, M, N, P, S, Z, everything else)
bool is_letter(char32_t cp);
bool is_mark(char32_t cp);
bool is_number(char32_t cp);
bool is_punct(char32_t cp);
bool is_symbol(char32_t cp);
bool is_whitespace(char32_t cp);  // Unicode White_Space (regex \s)

// Decodes one UTF-8 character at text[pos]; returns its length (1 for an invalid byte, whose
// value is returned as 0xFFFFFFFF, matching no class).
int decode_utf8(std::string_view text, size_t pos, char32_t* cp);
void append_utf8(std::string& out, char32_t cp);

}  // namespace locus::runtime::unicode
