#include "runtime/pretokenizer.h"

#include <functional>

#include "runtime/unicode_data.h"

namespace locus::runtime {
namespace {

namespace uc = unicode;

// The text decoded into code points with their byte offsets (off[n] = text size).
struct Cps {
  std::vector<char32_t> cp;
  std::vector<size_t> off;
  explicit Cps(std::string_view t) {
    for (size_t p = 0; p < t.size();) {
      char32_t c;
      int len = uc::decode_utf8(t, p, &c);
      cp.push_back(c);
      off.push_back(p);
      p += static_cast<size_t>(len);
    }
    off.push_back(t.size());
  }
  size_t n() const { return cp.size(); }
};

bool is_s(char32_t c) { return uc::is_whitespace(c); }
bool is_l(char32_t c) { return uc::is_letter(c); }
bool is_n(char32_t c) { return uc::is_number(c); }
bool is_p_or_s(char32_t c) { return uc::is_punct(c) || uc::is_symbol(c); }
bool is_crlf(char32_t c) { return c == '\r' || c == '\n'; }
bool is_ascii_letter(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// End of the longest run of pred starting at i (i when none).
size_t run(const Cps& t, size_t i, const std::function<bool(char32_t)>& pred) {
  while (i < t.n() && pred(t.cp[i])) ++i;
  return i;
}

// `\s+(?!\S)|\s+` at i: 0 when cp[i] is not whitespace, else the match end.
size_t whitespace_tail(const Cps& t, size_t i) {
  size_t k = run(t, i, is_s);
  if (k == i) return 0;
  if (k == t.n() || k - i == 1) return k;  // at the end, or one char (\s+(?!\S) fails, \s+ takes it)
  return k - 1;                             // leave the last space to prefix the next word
}

// ` ?X+` at i.
size_t optional_space_then_run(const Cps& t, size_t i, const std::function<bool(char32_t)>& pred) {
  size_t j = i;
  if (j < t.n() && t.cp[j] == ' ') ++j;
  size_t k = run(t, j, pred);
  return k > j ? k : 0;
}

// Each returns the match end (in code points) for a match starting at i, or 0 for none.
size_t match_gpt2(const Cps& t, size_t i) {
  if (t.cp[i] == '\'' && i + 1 < t.n()) {
    const char32_t a = t.cp[i + 1];
    const char32_t b = i + 2 < t.n() ? t.cp[i + 2] : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  if (size_t e = optional_space_then_run(t, i, is_l)) return e;
  if (size_t e = optional_space_then_run(t, i, is_n)) return e;
  if (size_t e = optional_space_then_run(t, i, [](char32_t c) { return !is_s(c) && !is_l(c) && !is_n(c); })) return e;
  return whitespace_tail(t, i);
}

size_t match_digits(const Cps& t, size_t i) {
  size_t k = i;
  while (k < t.n() && k - i < 3 && is_n(t.cp[k])) ++k;
  return k > i ? k : 0;
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x309F) || (c >= 0x30A0 && c <= 0x30FF);
}

size_t match_cjk(const Cps& t, size_t i) {
  size_t k = run(t, i, is_cjk);
  return k > i ? k : 0;
}

bool is_ascii_punct(char32_t c) {
  return c < 0x80 && std::string_view("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~").find(static_cast<char>(c)) != std::string_view::npos;
}

size_t match_deepseek_main(const Cps& t, size_t i) {
  const size_t n = t.n();
  // [!"#...~][A-Za-z]+
  if (is_ascii_punct(t.cp[i])) {
    size_t k = run(t, i + 1, is_ascii_letter);
    if (k > i + 1) return k;
  }
  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+  (try with the optional char first, then without)
  auto lm = [](char32_t c) { return uc::is_letter(c) || uc::is_mark(c); };
  const char32_t c0 = t.cp[i];
  if (!is_crlf(c0) && !is_l(c0) && !is_p_or_s(c0)) {
    size_t k = run(t, i + 1, lm);
    if (k > i + 1) return k;
  }
  if (size_t k = run(t, i, lm); k > i) return k;
  // ` ?[\p{P}\p{S}]+[\r\n]*`
  {
    size_t j = i;
    if (j < n && t.cp[j] == ' ') ++j;
    size_t k = run(t, j, is_p_or_s);
    if (k > j) return run(t, k, is_crlf);
  }
  // `\s*[\r\n]+`: ends just after the last \r or \n of the whitespace run.
  {
    size_t k = run(t, i, is_s);
    for (size_t m = k; m > i; --m) {
      if (is_crlf(t.cp[m - 1])) return m;
    }
  }
  return whitespace_tail(t, i);
}

}  // namespace

std::optional<SplitPattern> split_pattern_from_regex(const std::string& regex) {
  // Real tokenizer.json files write some escapes as the characters themselves (DeepSeek-V3's
  // main pattern holds literal CR and LF inside its classes): compare in the escaped spelling.
  std::string r;
  for (char c : regex) {
    if (c == '\r') {
      r += "\\r";
    } else if (c == '\n') {
      r += "\\n";
    } else {
      r += c;
    }
  }
  if (r == R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)") return SplitPattern::kGpt2;
  if (r == R"(\p{N}{1,3})") return SplitPattern::kDigits1to3;
  if (r == "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+" || r == R"([\x{4e00}-\x{9fa5}\x{3040}-\x{309f}\x{30a0}-\x{30ff}]+)" ||
      r == R"([\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+)") {
    return SplitPattern::kCjk;
  }
  if (r == R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)") {
    return SplitPattern::kDeepseekMain;
  }
  return std::nullopt;
}

const char* split_pattern_name(SplitPattern p) {
  switch (p) {
    case SplitPattern::kGpt2: return "gpt2";
    case SplitPattern::kDigits1to3: return "digits1to3";
    case SplitPattern::kCjk: return "cjk";
    case SplitPattern::kDeepseekMain: return "deepseek_v3";
  }
  return "?";
}

std::vector<std::string_view> split_isolated(std::string_view text, SplitPattern p) {
  std::vector<std::string_view> out;
  if (text.empty()) return out;
  const Cps t(text);
  size_t (*match)(const Cps&, size_t) = nullptr;
  switch (p) {
    case SplitPattern::kGpt2: match = match_gpt2; break;
    case SplitPattern::kDigits1to3: match = match_digits; break;
    case SplitPattern::kCjk: match = match_cjk; break;
    case SplitPattern::kDeepseekMain: match = match_deepseek_main; break;
  }
  size_t gap_start = 0, i = 0;
  auto piece = [&](size_t a, size_t b) { out.push_back(text.substr(t.off[a], t.off[b] - t.off[a])); };
  while (i < t.n()) {
    size_t e = match(t, i);
    if (e > i) {
      if (gap_start < i) piece(gap_start, i);
      piece(i, e);
      i = gap_start = e;
    } else {
      ++i;
    }
  }
  if (gap_start < t.n()) piece(gap_start, t.n());
  return out;
}

}  // namespace locus::runtime
