#include "runtime/quant_config.h"

#include <gtest/gtest.h>

#include "runtime_test_util.h"

namespace locus::runtime {
namespace {
using locus::testing::expect_error;
using locus::testing::TempDir;
using locus::testing::write_file;

TEST(QuantConfig, HfQuantConfigExcludesMatchModulePrefixes) {
  QuantConfig q = parse_hf_quant_config(nlohmann::json::parse(R"({
    "producer": {"name": "modelopt", "version": "0.29"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                     "exclude_modules": ["lm_head", "model.layers.0.self_attn*", "*.mlp.gate", "model.layers.3"]}})"),
                                        "hf_quant_config.json");
  EXPECT_EQ(q.algo, QuantAlgo::kNvfp4);
  EXPECT_EQ(q.kv_cache_quant_algo, "FP8");
  EXPECT_TRUE(q.quantized());
  EXPECT_FALSE(q.is_quantized("lm_head"));
  EXPECT_FALSE(q.is_quantized("model.layers.0.self_attn.q_a_proj"));  // subtree via name*
  EXPECT_TRUE(q.is_quantized("model.layers.1.self_attn.q_a_proj"));
  EXPECT_FALSE(q.is_quantized("model.layers.1.mlp.gate"));             // router
  EXPECT_TRUE(q.is_quantized("model.layers.1.mlp.gate_proj"));         // not the router
  EXPECT_TRUE(q.is_quantized("model.layers.1.mlp.experts.0.gate_proj"));
  EXPECT_FALSE(q.is_quantized("model.layers.3.mlp.experts.0.down_proj"));  // prefix without '*'
  EXPECT_TRUE(q.is_quantized("model.layers.30.mlp.experts.0.down_proj"));  // dotted prefixes only
  EXPECT_EQ(q.excluding_pattern("model.layers.0.self_attn.o_proj"), "model.layers.0.self_attn*");
  EXPECT_EQ(q.excluding_pattern("model.layers.1.mlp.down_proj"), "");
}

TEST(QuantConfig, ConfigJsonQuantizationConfigUsesIgnore) {
  QuantConfig q = parse_quantization_config(nlohmann::json::parse(R"({
    "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
    "kv_cache_scheme": {"type": "float", "num_bits": 8}, "ignore": ["lm_head", "*self_attn*"]})"),
                                            "config.json");
  EXPECT_EQ(q.algo, QuantAlgo::kNvfp4);
  EXPECT_FALSE(q.is_quantized("model.layers.5.self_attn.kv_b_proj"));
  EXPECT_TRUE(q.is_quantized("model.layers.5.mlp.shared_experts.up_proj"));
  EXPECT_EQ(parse_quantization_config(nlohmann::json::parse(R"({"quant_method":"modelopt","quant_algo":"W4A16_NVFP4"})"), "c")
                .algo,
            QuantAlgo::kNvfp4W4A16);
}

TEST(QuantConfig, Errors) {
  expect_error([] { parse_hf_quant_config(nlohmann::json::parse(R"({"quantization": {"quant_algo": "INT3"}})"), "hq.json"); },
               {"hq.json", "unsupported quant_algo 'INT3'"});
  expect_error([] { parse_hf_quant_config(nlohmann::json::parse(R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})"), "hq.json"); },
               {"hq.json", "group_size 32"});
  expect_error([] { parse_hf_quant_config(nlohmann::json::parse(R"({"quantization": {"quant_algo": "NVFP4", "exclude_modules": "lm_head"}})"), "hq.json"); },
               {"exclude_modules", "list of strings"});
  expect_error([] { parse_hf_quant_config(nlohmann::json::parse(R"({"producer": {}})"), "hq.json"); },
               {"hq.json", "quantization"});
  expect_error([] { parse_quantization_config(nlohmann::json::parse(R"({"quant_method": "fp8", "fmt": "e4m3"})"), "config.json"); },
               {"config.json", "quant_method 'fp8'"});
}

TEST(QuantConfig, LoadFromDirectoryPrefersHfQuantConfig) {
  TempDir d;
  EXPECT_FALSE(load_quant_config(d.path()).quantized());
  write_file(d.file("config.json"), R"({"model_type": "deepseek_v3",
    "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head"]}})");
  QuantConfig from_cfg = load_quant_config(d.path());
  EXPECT_TRUE(from_cfg.quantized());
  EXPECT_NE(from_cfg.source.find("config.json"), std::string::npos);
  QuantConfig q;
  q.algo = QuantAlgo::kNvfp4;
  q.exclude_modules = {"lm_head", "*self_attn*", "*.mlp.gate"};
  write_file(d.file("hf_quant_config.json"), to_hf_quant_config_json(q).dump(2));
  QuantConfig back = load_quant_config(d.path());
  EXPECT_NE(back.source.find("hf_quant_config.json"), std::string::npos);
  EXPECT_EQ(back.exclude_modules, q.exclude_modules);
  write_file(d.file("hf_quant_config.json"), "{");
  expect_error([&] { load_quant_config(d.path()); }, {"hf_quant_config.json", "not valid JSON"});
}

}  // namespace
}  // namespace locus::runtime
