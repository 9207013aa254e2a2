#include "runtime/llm_args.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "runtime/llm_args_cli.h"
#include "runtime_test_util.h"

namespace locus::runtime {
namespace {
using locus::testing::expect_error;
using locus::testing::TempDir;
using locus::testing::write_file;

// Parses argv into a fresh app that has the LlmArgs options.
LlmArgs parse_flags(std::vector<std::string> argv, bool validate_args = true) {
  CLI::App app("test");
  LlmArgsCli cli(app);
  std::vector<const char*> ptrs = {"locus"};
  for (const std::string& s : argv) ptrs.push_back(s.c_str());
  app.parse(static_cast<int>(ptrs.size()), const_cast<char**>(ptrs.data()));
  return cli.resolve(validate_args);
}

TEST(LlmArgs, DefaultsMatchGoldenFile) {
  const std::string golden_path = std::string(LOCUS_SOURCE_DIR) + "/tests/data/llm_args_golden.yaml";
  if (std::getenv("LOCUS_UPDATE_GOLDEN") != nullptr) write_file(golden_path, dump_defaults());
  const std::string golden = locus::testing::read_file(golden_path);
  EXPECT_EQ(dump_defaults(), golden)
      << "LlmArgs defaults changed. If deliberate, regenerate with LOCUS_UPDATE_GOLDEN=1 and update docs/llm_args.md";
  // The golden file parses back to the defaults.
  EXPECT_EQ(dump_llm_args(llm_args_from_yaml_string(golden, "golden")), dump_defaults());
  validate(LlmArgs{});
}

TEST(LlmArgs, EveryFieldIsDocumented) {
  const std::string doc = locus::testing::read_file(std::string(LOCUS_SOURCE_DIR) + "/docs/llm_args.md");
  for (const LlmArgField& f : llm_arg_fields()) {
    EXPECT_NE(doc.find("`" + f.key + "`"), std::string::npos) << f.key << " missing from docs/llm_args.md";
    EXPECT_NE(doc.find("`" + f.flag + "`"), std::string::npos) << f.flag << " missing from docs/llm_args.md";
  }
}

TEST(LlmArgs, YamlAndJsonFilesWithNestedLocalityDomains) {
  TempDir d;
  write_file(d.file("a.yaml"), R"(
model: /models/tiny
max_seq_len: 512
kv_cache_memory_fraction: 0.5
enable_locality_domains: true
locality_domains:
  emulate: 2
  allowed_ops: [bf16_linear, nvfp4_moe]
  exclude_modules: []
seed: 18446744073709551615
)");
  LlmArgs a = load_llm_args_file(d.file("a.yaml"));
  EXPECT_EQ(a.model, "/models/tiny");
  EXPECT_EQ(a.max_seq_len, 512);
  EXPECT_DOUBLE_EQ(a.kv_cache_memory_fraction, 0.5);
  EXPECT_TRUE(a.enable_locality_domains);
  EXPECT_EQ(a.locality_domains.emulate, 2);
  EXPECT_EQ(a.locality_domains.allowed_ops, (std::vector<std::string>{"bf16_linear", "nvfp4_moe"}));
  EXPECT_TRUE(a.locality_domains.exclude_modules.empty());
  EXPECT_EQ(a.seed, 18446744073709551615ull);
  EXPECT_EQ(a.max_batch_size, LlmArgs{}.max_batch_size);  // untouched keys keep defaults
  validate(a);

  write_file(d.file("b.json"), "{\"backend\":\t\"cpu\", \"cuda_graphs\": false, \"locality_domains\": {\"emulate\": null, \"num_partitions\": 2}}");
  LlmArgs b = load_llm_args_file(d.file("b.json"));
  EXPECT_FALSE(b.locality_domains.emulate.has_value());
  EXPECT_EQ(b.locality_domains.num_partitions, 2);

  locality::LocalityDomainPolicy p = to_locality_policy(a);
  EXPECT_TRUE(p.enabled);
  EXPECT_EQ(p.allowed_ops, (std::set<locality::OpKind>{locality::OpKind::kBf16Linear, locality::OpKind::kNvfp4Moe}));
  EXPECT_TRUE(p.exclude_modules.empty());
  EXPECT_FALSE(to_locality_policy(LlmArgs{}).enabled);

  // Round trip of a non-default value set through the dump.
  EXPECT_EQ(dump_llm_args(llm_args_from_yaml_string(dump_llm_args(a), "dump")), dump_llm_args(a));
}

TEST(LlmArgs, UnknownKeysAndBadValuesNameTheKeyAndType) {
  expect_error([] { llm_args_from_yaml_string("max_seq_lne: 4", "cfg.yaml"); },
               {"cfg.yaml", "unknown key 'max_seq_lne'", "did you mean 'max_seq_len'"});
  expect_error([] { llm_args_from_yaml_string("locality_domains:\n  emulat: 2", "cfg.yaml"); },
               {"unknown key 'locality_domains.emulat'"});
  expect_error([] { llm_args_from_yaml_string("max_seq_len: abc", "cfg.yaml"); },
               {"cfg.yaml", "'max_seq_len'", "expects int", "'abc'"});
  expect_error([] { llm_args_from_yaml_string("max_seq_len: 4.5", "c"); }, {"'max_seq_len'", "int"});
  expect_error([] { llm_args_from_yaml_string("max_seq_len: 99999999999", "c"); }, {"'max_seq_len'", "int"});
  expect_error([] { llm_args_from_yaml_string("seed: -1", "c"); }, {"'seed'", "uint64"});
  expect_error([] { llm_args_from_yaml_string("cuda_graphs: maybe", "c"); }, {"'cuda_graphs'", "expects bool"});
  expect_error([] { llm_args_from_yaml_string("kv_cache_memory_fraction: lots", "c"); }, {"'kv_cache_memory_fraction'", "float"});
  expect_error([] { llm_args_from_yaml_string("locality_domains:\n  allowed_ops: bf16_linear", "c"); },
               {"'locality_domains.allowed_ops'", "list of string"});
  expect_error([] { llm_args_from_yaml_string("locality_domains: 3", "c"); }, {"'locality_domains'", "map"});
  expect_error([] { llm_args_from_yaml_string("max_batch_size: [1, 2]", "c"); }, {"'max_batch_size'", "int"});
  expect_error([] { llm_args_from_yaml_string("model: null", "c"); }, {"'model'", "string", "null"});
  expect_error([] { llm_args_from_yaml_string("- a\n- b", "c"); }, {"top level must be a map"});
  expect_error([] { llm_args_from_yaml_string("model: [unclosed", "c"); }, {"c", "not valid YAML"});
  TempDir d;
  write_file(d.file("x.json"), "{\"model\": ");
  expect_error([&] { load_llm_args_file(d.file("x.json")); }, {"x.json", "not valid JSON"});
  expect_error([&] { load_llm_args_file(d.file("absent.yaml")); }, {"absent.yaml", "cannot read"});
}

TEST(LlmArgs, FlagsOverrideTheConfigFile) {
  TempDir d;
  write_file(d.file("c.yaml"), "max_seq_len: 1024\nmax_batch_size: 3\nlocality_domains:\n  emulate: 4\n  num_partitions: 4\n");
  LlmArgs a = parse_flags({"--config", d.file("c.yaml"), "--max-seq-len", "64", "--enable-locality-domains",
                           "--locality-domains-allowed-ops", "bf16_linear,bf16_bmm", "--no-cuda-graphs"});
  EXPECT_EQ(a.max_seq_len, 64);        // flag beats file
  EXPECT_EQ(a.max_batch_size, 3);      // file beats default
  EXPECT_EQ(a.locality_domains.emulate, 4);
  EXPECT_TRUE(a.enable_locality_domains);
  EXPECT_FALSE(a.cuda_graphs);
  EXPECT_EQ(a.locality_domains.allowed_ops, (std::vector<std::string>{"bf16_linear", "bf16_bmm"}));

  LlmArgs b = parse_flags({"--enable-locality-domains=false", "--locality-domains-emulate", "2", "--seed", "7"});
  EXPECT_FALSE(b.enable_locality_domains);
  EXPECT_EQ(b.locality_domains.emulate, 2);
  EXPECT_EQ(b.seed, 7u);
  EXPECT_EQ(dump_llm_args(parse_flags({})), dump_defaults());

  expect_error([] { parse_flags({"--max-seq-len", "lots"}); }, {"--max-seq-len", "'max_seq_len'", "expects int", "'lots'"});
  expect_error([] { parse_flags({"--max-seq-len", "0"}); }, {"max_seq_len must be >= 1"});
  EXPECT_THROW(parse_flags({"--no-such-flag"}), CLI::ParseError);
}

TEST(LlmArgs, IncompatibleLocalityDomainCombinationsNameBothOptions) {
  LlmArgs a;
  a.enable_locality_domains = true;
  validate(a);
  for (auto [field, name] : {std::pair{&LlmArgs::weight_sharing, "weight_sharing=true"},
                             std::pair{&LlmArgs::fused_allreduce, "fused_allreduce=true"},
                             std::pair{&LlmArgs::gms_weight_loading, "gms_weight_loading=true"}}) {
    LlmArgs b = a;
    b.*field = true;
    expect_error([&] { validate(b); }, {"enable_locality_domains=true", name});
    b.enable_locality_domains = false;
    validate(b);  // fine without LD
  }
  LlmArgs c = a;
  c.backend = "npu";
  expect_error([&] { validate(c, BackendCapabilities{"npu", true, /*has_ld_ops=*/false, false}); },
               {"enable_locality_domains=true", "backend=npu", "no locality-domain"});
  c.enable_locality_domains = false;
  validate(c, BackendCapabilities{"npu", true, false, false});
}

TEST(LlmArgs, BadValuesAreRejectedByValidate) {
  auto bad = [](const std::string& yaml, std::initializer_list<std::string> pieces) {
    expect_error([&] { validate(llm_args_from_yaml_string(yaml, "c")); }, pieces);
  };
  bad("max_seq_len: 0", {"max_seq_len must be >= 1", "0"});
  bad("max_seq_len: -5", {"max_seq_len must be >= 1"});
  bad("max_batch_size: 0", {"max_batch_size"});
  bad("kv_cache_budget_bytes: -1", {"kv_cache_budget_bytes"});
  bad("kv_cache_memory_fraction: 1.5", {"kv_cache_memory_fraction", "(0, 1]"});
  bad("kv_cache_memory_fraction: 0", {"kv_cache_memory_fraction"});
  bad("num_threads: -2", {"num_threads"});
  bad("tensor_parallel_size: 0", {"tensor_parallel_size"});
  bad("tensor_parallel_size: 2", {"tensor_parallel_size=2", "not supported"});
  bad("dtype: fp8", {"dtype='fp8'"});
  bad("log_level: loud", {"log_level='loud'"});
  bad("backend: tpu", {"backend 'tpu' is unknown", "cpu"});
  bad("cuda_graphs: true", {"cuda_graphs=true", "backend=cpu"});
  bad("decode_lookahead: true", {"decode_lookahead=true", "cuda_graphs=true"});
  bad("locality_domains:\n  emulate: 0", {"locality_domains.emulate must be >= 1"});
  bad("locality_domains:\n  num_partitions: -1", {"locality_domains.num_partitions"});
  bad("locality_domains:\n  emulate: 2\n  num_partitions: 4", {"locality_domains.num_partitions=4", "locality_domains.emulate=2"});
  bad("locality_domains:\n  allowed_ops: [bf16_linear, fp8_linear]", {"locality_domains.allowed_ops", "fp8_linear"});
#if !defined(LOCUS_WITH_CUDA)
  bad("backend: cuda", {"backend=cuda is not built"});
#endif
}

}  // namespace
}  // namespace locus::runtime
