// `locus generate` and `locus logits` end to end through the executable on the tiny model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <regex>
#include <string>

#include "models/model_test_util.h"
#include "runtime/generator_logits_file.h"
#include "runtime/runtime_test_util.h"

namespace locus::testing {
namespace {

struct CmdResult {
  int status = -1;
  std::string out;  // stdout and stderr together
};

// `env` takes extra assignments ("NAME=value ") for the command.
CmdResult run(const std::string& args, const std::string& env = "") {
  const std::string cmd = "env -u LOCUS_FAKE_LOCALITY_DOMAINS " + env + locus_binary() + " " + args + " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

TEST(GenerateCli, GeneratesAndReportsTokensPerSecond) {
  const std::string& dir = tiny_model_dir(false);
  auto r = run("generate --model " + dir + " --prompt 'Locality domains' --max-new-tokens 5 --quiet");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("Locality domains"), std::string::npos) << r.out;
  // 5 new tokens: the first from the prefill, 4 decode steps, unless the (random) tiny model
  // picks eos first, which greedy decoding of a fresh random model does now and then.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(decode (\d+) tokens.*finished: (\w+))"))) << r.out;
  if (m[2] == "length") EXPECT_EQ(m[1], "4") << r.out;
  else EXPECT_EQ(m[2], "eos") << r.out;
  EXPECT_NE(r.out.find("tok/s"), std::string::npos) << r.out;
  // --ignore-eos: every sequence runs to its token limit (the fixed count a timing run needs).
  r = run("generate --model " + dir + " --prompt a --prompt 'b c' --max-new-tokens 40 --ignore-eos --quiet");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("decode 78 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("finished: length,length"), std::string::npos) << r.out;
  // LOCUS_HOST_PROFILE=1: where the decode steps' host time went, after the stats line.
  r = run("generate --model " + dir + " --prompt a --max-new-tokens 6 --ignore-eos --quiet", "LOCUS_HOST_PROFILE=1 ");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("host time by region"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step (decode)                   5 calls"), std::string::npos) << r.out;  // not the prefill
  EXPECT_NE(r.out.find("\n  mla "), std::string::npos) << r.out;
  // --warmup runs the batch once untimed first: the same text, and the figures and the profile
  // cover the timed run only.
  const std::string text = r.out.substr(0, r.out.find('\n'));
  r = run("generate --model " + dir + " --prompt a --max-new-tokens 6 --ignore-eos --quiet --warmup",
          "LOCUS_HOST_PROFILE=1 ");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.substr(0, r.out.find('\n')), text) << r.out;
  EXPECT_NE(r.out.find("decode 5 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step (decode)                   5 calls"), std::string::npos) << r.out;
  // A batch of prompts with sampling and locality domains on.
  r = run("generate --model " + dir +
          " --prompt a --prompt 'b c' --max-new-tokens 3 --temperature 0.7 --top-k 5 --top-p 0.9 --seed 4"
          " --enable-locality-domains --locality-domains-emulate 2 --quiet");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("[0] a"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[1] b c"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 sequences"), std::string::npos) << r.out;
}

TEST(GenerateCli, BadOptionsAreClearErrors) {
  const std::string& dir = tiny_model_dir(false);
  auto r = run("generate --model " + dir + " --prompt x --top-p 1.5 --quiet");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("top_p"), std::string::npos) << r.out;
  r = run("generate --model " + dir + " --prompt x --max-new-tokens 100 --max-seq-len 16 --quiet");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("max_seq_len=16"), std::string::npos) << r.out;
  r = run("generate --model /nonexistent/dir --prompt x --quiet");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("/nonexistent/dir"), std::string::npos) << r.out;
}

TEST(LogitsCli, WritesEveryPositionsLogitsLdOnEqualsOff) {
  const std::string& dir = tiny_model_dir(false);
  TempDir t;
  auto off = run("logits --model " + dir + " --ids 1,2,3 --ids 7 --out " + t.file("off.bin") + " --quiet");
  ASSERT_EQ(off.status, 0) << off.out;
  auto on = run("logits --model " + dir + " --ids 1,2,3 --ids 7 --out " + t.file("on.bin") +
                " --enable-locality-domains --locality-domains-emulate 2 --quiet");
  ASSERT_EQ(on.status, 0) << on.out;
  auto a = runtime::read_logits_file(t.file("off.bin")), b = runtime::read_logits_file(t.file("on.bin"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(a[0].size(0), 3);
  EXPECT_EQ(a[1].size(0), 1);
  EXPECT_TRUE(bitwise_equal(a[0], b[0]));
  EXPECT_TRUE(bitwise_equal(a[1], b[1]));
  // The same numbers as the library's forward.
  auto lm = load_model(dir, 0);
  EXPECT_TRUE(bitwise_equal(a[0], prefill_logits(*lm.model, {1, 2, 3})));
  auto bad = run("logits --model " + dir + " --ids 1,x --out " + t.file("x.bin") + " --quiet");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("\"x\" is not a token id"), std::string::npos) << bad.out;
}

// LOCUS_ROUTING_REPLAY (modules/moe_routing_dump.h): replaying a run's own routing dump changes no
// bit of its logits; a dump with one expert id changed changes them (the replay is followed);
// a dump of other prompts is an error naming the mismatch.
TEST(LogitsCli, RoutingReplayFollowsTheDumpedExperts) {
  const std::string& dir = tiny_model_dir(false);
  TempDir t;
  const std::string dump = t.file("routing.bin"), ids = " --ids 1,2,3 --ids 7";
  auto r = run("logits --model " + dir + ids + " --out " + t.file("a.bin") + " --quiet", "LOCUS_ROUTING_DUMP=" + dump + " ");
  ASSERT_EQ(r.status, 0) << r.out;
  r = run("logits --model " + dir + ids + " --out " + t.file("b.bin") + " --quiet", "LOCUS_ROUTING_REPLAY=" + dump + " ");
  ASSERT_EQ(r.status, 0) << r.out;
  auto a = runtime::read_logits_file(t.file("a.bin")), b = runtime::read_logits_file(t.file("b.bin"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_TRUE(bitwise_equal(a[0], b[0]));
  EXPECT_TRUE(bitwise_equal(a[1], b[1]));

  // The first record's first token: its first choice replaced by an expert it did not choose.
  std::string bytes = read_file(dump);
  auto u32_at = [&](size_t pos) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + pos, 4);
    return v;
  };
  ASSERT_EQ(bytes.substr(0, 4), "LRD1");
  const size_t head = 8 + u32_at(4);  // the 7 header words follow the name
  const uint32_t T = u32_at(head), E = u32_at(head + 4), K = u32_at(head + 8), has_bias = u32_at(head + 24);
  const size_t ids_at = head + 28 + 4 * static_cast<size_t>(T) * E + (has_bias ? 4 * static_cast<size_t>(E) : 0);
  std::vector<int32_t> first(K);
  std::memcpy(first.data(), bytes.data() + ids_at, 4 * K);
  int32_t other = 0;
  while (std::find(first.begin(), first.end(), other) != first.end()) ++other;
  std::memcpy(bytes.data() + ids_at, &other, 4);
  const std::string changed = t.file("changed.bin");
  write_file(changed, bytes);
  r = run("logits --model " + dir + ids + " --out " + t.file("c.bin") + " --quiet", "LOCUS_ROUTING_REPLAY=" + changed + " ");
  ASSERT_EQ(r.status, 0) << r.out;
  auto c = runtime::read_logits_file(t.file("c.bin"));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_FALSE(bitwise_equal(a[0], c[0]));
  EXPECT_TRUE(bitwise_equal(a[1], c[1]));  // the second prompt's routing is as dumped

  // Other prompts than the dump's.
  r = run("logits --model " + dir + " --ids 1,2 --out " + t.file("d.bin") + " --quiet", "LOCUS_ROUTING_REPLAY=" + dump + " ");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("LOCUS_ROUTING_REPLAY"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("has 3 tokens"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace locus::testing
