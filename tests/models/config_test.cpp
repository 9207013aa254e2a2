#include <gtest/gtest.h>

#include <cmath>

#include "models/deepseek_v3_config.h"
#include "runtime/runtime_test_util.h"

namespace locus::models {
namespace {
using locus::testing::expect_error;
using nlohmann::json;

TEST(DeepseekV3Config, EmptyConfigTakesTransformersDefaults) {
  DeepseekV3Config c = parse_deepseek_v3_config(json::object());
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.num_key_value_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.scoring_func, "sigmoid");
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_EQ(c.kv_b_out_features(), 128 * 256);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
}

// The published DeepSeek-V3 config.json fields that matter (abridged).
const char* kV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
  "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
  "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
  "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
  "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
  "first_k_dense_replace": 3, "norm_topk_prob": true, "scoring_func": "sigmoid", "hidden_act": "silu",
  "max_position_embeddings": 163840, "rms_norm_eps": 1e-06, "rope_theta": 10000, "vocab_size": 129280,
  "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
})";

TEST(DeepseekV3Config, ParsesTheReleasedConfigAndRoundTrips) {
  DeepseekV3Config c = parse_deepseek_v3_config(json::parse(kV3));
  EXPECT_EQ(c.architectures, std::vector<std::string>{"DeepseekV3ForCausalLM"});
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 40);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  // ecosystem.md 3.3: 192^-0.5 * (0.1 ln 40 + 1)^2 = 0.1353
  EXPECT_NEAR(c.softmax_scale(), std::pow(192.0, -0.5) * std::pow(0.1 * std::log(40.0) + 1, 2), 1e-12);
  EXPECT_NEAR(c.softmax_scale(), 0.1353, 1e-4);
  EXPECT_EQ(c.quantization_config["quant_method"], "fp8");

  DeepseekV3Config back = parse_deepseek_v3_config(json::parse(c.to_json().dump()));
  EXPECT_EQ(back.to_json().dump(), c.to_json().dump());
  EXPECT_EQ(back.rope_scaling->beta_fast, 32);
}

TEST(DeepseekV3Config, V2LiteStyleAndTransformers5Fields) {
  DeepseekV3Config c = parse_deepseek_v3_config(json::parse(R"({"model_type": "deepseek_v2", "q_lora_rank": null,
    "n_group": 1, "topk_group": 1, "n_routed_experts": 64, "num_experts_per_tok": 6, "scoring_func": "softmax",
    "topk_method": "greedy", "eos_token_id": [1, 2], "max_position_embeddings": 163840.0,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 40, "mscale": 0.707,
                        "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096}})"));
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->mscale_all_dim, 0.707);
  EXPECT_TRUE(parse_deepseek_v3_config(json::parse(c.to_json().dump())).to_json() == c.to_json());
  DeepseekV3Config plain = parse_deepseek_v3_config(json::parse(R"({"rope_parameters": {"rope_type": "default", "rope_theta": 20000}})"));
  EXPECT_FALSE(plain.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(plain.rope_theta, 20000);
}

TEST(DeepseekV3Config, WrongTypesAndInconsistentValuesNameTheField) {
  auto parse = [](const char* text) { return parse_deepseek_v3_config(json::parse(text), "my/config.json"); };
  expect_error([&] { parse(R"({"hidden_size": "7168"})"); }, {"my/config.json", "'hidden_size'", "integer", "\"7168\""});
  expect_error([&] { parse(R"({"hidden_size": 71.5})"); }, {"'hidden_size'", "integer"});
  expect_error([&] { parse(R"({"norm_topk_prob": 1})"); }, {"'norm_topk_prob'", "true or false"});
  expect_error([&] { parse(R"({"rms_norm_eps": "small"})"); }, {"'rms_norm_eps'", "a number"});
  expect_error([&] { parse(R"({"scoring_func": 3})"); }, {"'scoring_func'", "a string"});
  expect_error([&] { parse(R"({"eos_token_id": "x"})"); }, {"'eos_token_id'", "integer or a list"});
  expect_error([&] { parse(R"({"model_type": "llama"})"); }, {"model_type 'llama'", "deepseek_v3"});
  expect_error([&] { parse(R"({"n_routed_experts": 250, "n_group": 8})"); }, {"my/config.json", "n_routed_experts (250)", "n_group (8)"});
  expect_error([&] { parse(R"({"topk_group": 9})"); }, {"topk_group (9)", "n_group (8)"});
  expect_error([&] { parse(R"({"num_experts_per_tok": 300})"); }, {"num_experts_per_tok (300)", "n_routed_experts (256)"});
  expect_error([&] { parse(R"({"topk_group": 1, "num_experts_per_tok": 40})"); }, {"num_experts_per_tok (40)", "topk_group (1)"});
  expect_error([&] { parse(R"({"hidden_size": 0})"); }, {"hidden_size must be positive"});
  expect_error([&] { parse(R"({"qk_rope_head_dim": 63})"); }, {"qk_rope_head_dim must be even"});
  expect_error([&] { parse(R"({"num_key_value_heads": 8})"); }, {"num_key_value_heads (8)", "num_attention_heads (128)"});
  expect_error([&] { parse(R"({"first_k_dense_replace": 62})"); }, {"first_k_dense_replace (62)"});
  expect_error([&] { parse(R"({"scoring_func": "relu"})"); }, {"scoring_func 'relu'"});
  expect_error([&] { parse(R"({"rope_scaling": {"type": "linear", "factor": 2}})"); }, {"rope_scaling type 'linear'"});
  expect_error([&] { parse(R"({"rope_scaling": [1]})"); }, {"'rope_scaling'", "object"});
  expect_error([&] { parse(R"({"eos_token_id": 200000})"); }, {"eos_token_id 200000", "outside the vocabulary"});
  expect_error([] { load_deepseek_v3_config("/nonexistent/model"); }, {"/nonexistent/model", "does not exist"});
}

}  // namespace
}  // namespace locus::models
