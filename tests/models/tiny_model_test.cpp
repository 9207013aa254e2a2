#include "models/tiny_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "core/float_convert.h"
#include "runtime/checkpoint.h"
#include "runtime/quant_config.h"
#include "runtime/runtime_test_util.h"
#include "runtime/tokenizer.h"
#include "test_util.h"

namespace locus::models {
namespace {
using locus::testing::expect_error;
using locus::testing::read_file;
using locus::testing::TempDir;

// Every tensor the options promise is in the checkpoint with its dtype and shape, and nothing else.
void expect_layout(const runtime::Checkpoint& ck, const TinyModelOptions& o) {
  std::set<std::string> expected;
  for (const TinyTensorSpec& s : tiny_model_tensor_specs(o)) {
    expected.insert(s.name);
    ASSERT_TRUE(ck.has(s.name)) << s.name;
    EXPECT_EQ(ck.dtype(s.name), s.dtype) << s.name;
    EXPECT_EQ(ck.shape(s.name), s.shape) << s.name;
  }
  const std::vector<std::string> names = ck.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected);
}

TEST(TinyModel, Bf16CheckpointHasTheHuggingFaceLayout) {
  TempDir d;
  TinyModelOptions o;
  o.seed = locus::testing::fresh_seed();
  write_tiny_model(d.path(), o);
  runtime::Checkpoint ck = runtime::Checkpoint::open(d.path());
  EXPECT_EQ(ck.num_shards(), 2u);
  expect_layout(ck, o);

  const DeepseekV3Config c = load_deepseek_v3_config(d.path());
  EXPECT_EQ(c.architectures, std::vector<std::string>{"DeepseekV3ForCausalLM"});
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.q_lora_rank, 128);
  EXPECT_GT(c.n_group, 1);
  EXPECT_EQ(c.vocab_size, tiny_tokenizer_vocab_size());
  EXPECT_EQ(c.to_json().dump(), tiny_model_config(o).to_json().dump());
  EXPECT_TRUE(c.rope_scaling.has_value());
  EXPECT_FALSE(runtime::load_quant_config(d.path()).quantized());

  // Spot checks of the tensors and names a DeepSeek-V3 loader asks for.
  EXPECT_EQ(ck.shape("model.layers.0.self_attn.q_b_proj.weight"), (Shape{4 * (32 + 16), 128}));
  EXPECT_EQ(ck.shape("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), (Shape{64 + 16, 256}));
  EXPECT_EQ(ck.shape("model.layers.0.self_attn.kv_b_proj.weight"), (Shape{4 * (32 + 32), 64}));
  EXPECT_EQ(ck.shape("model.layers.0.mlp.gate_proj.weight"), (Shape{512, 256}));
  EXPECT_EQ(ck.shape("model.layers.1.mlp.experts.7.down_proj.weight"), (Shape{256, 256}));
  EXPECT_EQ(ck.shape("model.layers.1.mlp.shared_experts.up_proj.weight"), (Shape{256, 256}));
  EXPECT_EQ(ck.dtype("model.layers.1.mlp.gate.e_score_correction_bias"), DType::kFP32);
  EXPECT_FALSE(ck.has("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(ck.has("model.layers.1.mlp.gate_proj.weight"));

  // Init scale: matrices ~ N(0, 0.02), norms exactly 1.
  std::vector<double> w = locus::testing::to_doubles(ck.get("model.layers.1.mlp.experts.3.gate_proj.weight"));
  double ss = 0, mean = 0;
  for (double v : w) ss += v * v, mean += v;
  EXPECT_NEAR(std::sqrt(ss / w.size()), 0.02, 0.002);
  EXPECT_NEAR(mean / w.size(), 0.0, 0.002);
  for (double v : locus::testing::to_doubles(ck.get("model.norm.weight"))) ASSERT_EQ(v, 1.0);

  // The tokenizer files load and agree with the config.
  runtime::Tokenizer tok = runtime::Tokenizer::from_path(d.path());
  EXPECT_EQ(tok.vocab_size(), c.vocab_size);
  EXPECT_EQ(tok.bos_id(), c.bos_token_id);
  EXPECT_EQ(tok.eos_id(), c.eos_token_ids[0]);
  EXPECT_EQ(tok.token_to_id("<｜begin▁of▁sentence｜>"), c.bos_token_id);
  const std::string text = "the cat sat on the mat, 12345 times!\n中文";
  std::vector<int32_t> ids = tok.encode(text);
  EXPECT_LT(ids.size(), text.size());  // the merges do something
  EXPECT_EQ(tok.decode(ids), text);
  const int32_t the = *tok.token_to_id(runtime::byte_level_encode(" the"));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), the), 1);  // "the" at the start has no space
}

TEST(TinyModel, Nvfp4CheckpointFollowsModelOpt) {
  TempDir bf_dir, nv_dir;
  TinyModelOptions o;
  o.seed = locus::testing::fresh_seed();
  SCOPED_TRACE(o.seed);
  write_tiny_model(bf_dir.path(), o);
  o.nvfp4 = true;
  write_tiny_model(nv_dir.path(), o);
  runtime::Checkpoint ck = runtime::Checkpoint::open(nv_dir.path());
  runtime::Checkpoint bf = runtime::Checkpoint::open(bf_dir.path());
  expect_layout(ck, o);

  const std::string m = "model.layers.1.mlp.experts.2.up_proj";
  EXPECT_EQ(ck.info(m + ".weight").dtype_name, "U8");
  EXPECT_EQ(ck.shape(m + ".weight"), (Shape{256, 128}));
  EXPECT_EQ(ck.info(m + ".weight_scale").dtype_name, "F8_E4M3");
  EXPECT_EQ(ck.shape(m + ".weight_scale"), (Shape{256, 16}));
  EXPECT_EQ(ck.shape(m + ".weight_scale_2"), Shape{});
  // Attention, router, embeddings and lm_head stay BF16 and are excluded in both quant configs.
  EXPECT_EQ(ck.dtype("model.layers.0.self_attn.q_a_proj.weight"), DType::kBF16);
  EXPECT_EQ(ck.dtype("model.layers.1.mlp.gate.weight"), DType::kBF16);
  EXPECT_EQ(ck.dtype("lm_head.weight"), DType::kBF16);
  runtime::QuantConfig q = runtime::load_quant_config(nv_dir.path());
  EXPECT_NE(q.source.find("hf_quant_config.json"), std::string::npos);
  EXPECT_EQ(q.algo, runtime::QuantAlgo::kNvfp4);
  // The depth-free patterns `locus plan --quant nvfp4` uses split the modules the same way.
  runtime::QuantConfig patterns = q;
  patterns.exclude_modules = runtime::deepseek_nvfp4_bf16_modules();
  for (const TinyTensorSpec& s : tiny_model_tensor_specs(o)) {
    const std::string suffix = ".weight";
    if (s.name.size() < suffix.size() || s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string module = s.name.substr(0, s.name.size() - suffix.size());
    if (module.find("norm") != std::string::npos || module == "model.embed_tokens") continue;
    EXPECT_EQ(q.is_quantized(module), s.dtype == DType::kU8) << module;
    EXPECT_EQ(patterns.is_quantized(module), s.dtype == DType::kU8) << module;
  }
  const DeepseekV3Config c = load_deepseek_v3_config(nv_dir.path());
  runtime::QuantConfig q2 = runtime::parse_quantization_config(c.quantization_config, "config.json");
  EXPECT_EQ(q2.exclude_modules, q.exclude_modules);

  // Dequantized (e2m1 x e4m3 block scale x weight_scale_2, decoded here) it is the BF16 weight of
  // the same seed, within NVFP4's error; gate and up share weight_scale_2.
  for (const std::string& name : {std::string("model.layers.0.mlp.down_proj"), m}) {
    Tensor packed = ck.get(name + ".weight");
    Tensor scales = ck.get(name + ".weight_scale");
    const float g = ck.get_scalar(name + ".weight_scale_2");
    std::vector<double> ref = locus::testing::to_doubles(bf.get(name + ".weight"));
    const int64_t n = packed.size(0), k = packed.size(1) * 2;
    std::vector<double> deq(static_cast<size_t>(n * k));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const uint8_t byte = packed.data<uint8_t>()[r * (k / 2) + j / 2];
        const uint8_t code = j % 2 == 0 ? (byte & 0xF) : (byte >> 4);  // low nibble = even k
        deq[r * k + j] = e2m1_to_f32(code) * e4m3_to_f32(scales.data<uint8_t>()[r * (k / 16) + j / 16]) * g;
      }
    }
    const double err = locus::testing::rel_error(deq, ref);
    EXPECT_LT(err, 0.12) << name;
    EXPECT_GT(err, 0.0) << name;  // it really is quantized
  }
  EXPECT_EQ(ck.get_scalar("model.layers.0.mlp.gate_proj.weight_scale_2"), ck.get_scalar("model.layers.0.mlp.up_proj.weight_scale_2"));
  EXPECT_GT(ck.get_scalar(m + ".input_scale"), 0.f);
}

TEST(TinyModel, DeterministicForASeed) {
  TempDir a, b, c;
  TinyModelOptions o;
  o.seed = 42;
  o.nvfp4 = true;
  write_tiny_model(a.path(), o);
  write_tiny_model(b.path(), o);
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json",
                        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "hf_quant_config.json",
                        "generation_config.json"}) {
    EXPECT_EQ(read_file(a.file(f)), read_file(b.file(f))) << f;
  }
  // Another seed, other values (the attention weights are BF16 in both formats).
  o.seed = 43;
  o.nvfp4 = false;
  write_tiny_model(c.path(), o);
  const std::string name = "model.layers.0.self_attn.q_a_proj.weight";
  EXPECT_FALSE(locus::testing::bitwise_equal(runtime::Checkpoint::open(a.path()).get(name),
                                             runtime::Checkpoint::open(c.path()).get(name)));
}

TEST(TinyModel, MoreLayersAndBadOptions) {
  TempDir d;
  TinyModelOptions o;
  o.num_layers = 3;
  o.num_shards = 3;
  write_tiny_model(d.path(), o);
  runtime::Checkpoint ck = runtime::Checkpoint::open(d.path());
  EXPECT_EQ(ck.num_shards(), 3u);
  expect_layout(ck, o);
  TinyModelOptions bad;
  bad.n_group = 3;
  expect_error([&] { write_tiny_model(d.path(), bad); }, {"n_routed_experts (8)", "n_group (3)"});
  bad = TinyModelOptions{};
  bad.nvfp4 = true;
  bad.moe_intermediate_size = 40;
  expect_error([&] { write_tiny_model(d.path(), bad); }, {"moe_intermediate_size=40", "multiple of 16"});
  bad = TinyModelOptions{};
  bad.num_layers = 0;
  expect_error([&] { tiny_model_config(bad); }, {"num_layers must be positive"});
}

// The init values come from several threads for large tensors: each draw is a prefix of any
// longer one, whichever thread computed each value (the chunk bounds differ between the sizes).
TEST(TinyModel, InitValuesDoNotDependOnTheThreads) {
  const std::string name = "model.layers.0.mlp.experts.3.up_proj.weight";
  const std::vector<float> longer = tiny_model_normal_values(7, name, 6000001, 0.02);
  for (const int64_t n : {int64_t{11}, int64_t{2200003}, int64_t{4100000}}) {
    const std::vector<float> v = tiny_model_normal_values(7, name, n, 0.02);
    ASSERT_EQ(static_cast<int64_t>(v.size()), n);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), longer.begin())) << n;
  }
  double sum = 0, sum_sq = 0;
  for (float x : longer) sum += x, sum_sq += static_cast<double>(x) * x;
  EXPECT_NEAR(sum / longer.size(), 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(sum_sq / longer.size()), 0.02, 1e-4);
  EXPECT_NE(tiny_model_normal_values(8, name, 4, 0.02), std::vector<float>(longer.begin(), longer.begin() + 4));
}

// A checkpoint larger than the disk's free space is refused before anything is written (here
// about 13.5 PB: no disk has it), and the shard count follows the size when left open.
TEST(TinyModel, TooLargeForTheDiskIsAClearErrorAndShardsFollowTheSize) {
  TempDir d;
  TinyModelOptions huge;
  huge.hidden_size = int64_t{1} << 20;
  huge.intermediate_size = int64_t{1} << 31;
  const std::string dir = d.file("never/made");
  expect_error([&] { write_tiny_model(dir, huge); }, {"the checkpoint needs 13510816.2 GB", "never/made", "free"});
  EXPECT_FALSE(std::filesystem::exists(d.file("never")));
  EXPECT_EQ(tiny_model_shards(TinyModelOptions{}), 2);
  // Its dense MLP's 3 x 2^51 bf16 elements fill 3 x 2^20 files of 4 GiB; the rest (about 16 GiB:
  // 12 of experts, 1.5 shared, 2.5 of attention, embedding and lm_head) 5 more.
  EXPECT_EQ(tiny_model_shards(huge), 3 * (1 << 20) + 5);
  TinyModelOptions three;
  three.num_shards = 3;
  EXPECT_EQ(tiny_model_shards(three), 3);
  TinyModelOptions v3 = deepseek_v3_widths();
  v3.n_routed_experts = 32;  // 2 layers: 1.2 GB dense + 1.1 GB attention + 2.9 GB of experts
  EXPECT_EQ(tiny_model_shards(v3), 2);
  v3.num_layers = 3;
  EXPECT_EQ(tiny_model_shards(v3), 2);
  v3.n_routed_experts = 256;  // 2 x 22.5 GB of experts: 47.2 GB, 44.0 GiB
  EXPECT_EQ(tiny_model_shards(v3), 11);
}

// DeepSeek-V3's own widths: the tensors of a layer have the real model's shapes.
TEST(TinyModel, DeepSeekV3Widths) {
  const TinyModelOptions o = deepseek_v3_widths();
  const DeepseekV3Config c = tiny_model_config(o);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  std::map<std::string, Shape> shape;
  for (const TinyTensorSpec& s : tiny_model_tensor_specs(o)) shape[s.name] = s.shape;
  const std::string p = "model.layers.1.";
  EXPECT_EQ(shape[p + "self_attn.q_a_proj.weight"], (Shape{1536, 7168}));
  EXPECT_EQ(shape[p + "self_attn.q_b_proj.weight"], (Shape{24576, 1536}));
  EXPECT_EQ(shape[p + "self_attn.kv_a_proj_with_mqa.weight"], (Shape{576, 7168}));
  EXPECT_EQ(shape[p + "self_attn.kv_b_proj.weight"], (Shape{32768, 512}));
  EXPECT_EQ(shape[p + "self_attn.o_proj.weight"], (Shape{7168, 16384}));
  EXPECT_EQ(shape["model.layers.0.mlp.gate_proj.weight"], (Shape{18432, 7168}));
  EXPECT_EQ(shape[p + "mlp.gate.weight"], (Shape{256, 7168}));
  EXPECT_EQ(shape[p + "mlp.experts.255.down_proj.weight"], (Shape{7168, 2048}));
  EXPECT_EQ(shape[p + "mlp.shared_experts.up_proj.weight"], (Shape{2048, 7168}));
}

}  // namespace
}  // namespace locus::models

namespace locus::models {
namespace {

// The `locus make-tiny-model` command writes the same checkpoint as the library call.
TEST(TinyModel, MakeTinyModelCommand) {
  locus::testing::TempDir d;
  const std::string out = d.file("log.txt");
  const std::string cmd = locus::testing::locus_binary() + " make-tiny-model " + d.file("m") +
                          " --seed 5 --layers 3 > " + out + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << locus::testing::read_file(out);
  EXPECT_NE(locus::testing::read_file(out).find("wrote BF16 tiny DeepSeek-V3 model"), std::string::npos);
  TinyModelOptions o;
  o.seed = 5;
  o.num_layers = 3;
  write_tiny_model(d.file("lib"), o);
  EXPECT_EQ(locus::testing::read_file(d.file("m/model-00002-of-00002.safetensors")),
            locus::testing::read_file(d.file("lib/model-00002-of-00002.safetensors")));
  EXPECT_EQ(load_deepseek_v3_config(d.file("m")).num_hidden_layers, 3);

  const std::string bad = locus::testing::locus_binary() + " make-tiny-model " + d.file("b") +
                          " --nvfp4 --hidden-size 40 > " + out + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  EXPECT_NE(locus::testing::read_file(out).find("hidden_size=40 is not a multiple of 16"), std::string::npos)
      << locus::testing::read_file(out);

  // Every width has a flag; each overrides its field of the --shape it starts from.
  const std::string widths = locus::testing::locus_binary() + " make-tiny-model " + d.file("w") +
                             " --shape tiny --q-lora-rank 64 --kv-lora-rank 32 --qk-nope-head-dim 16"
                             " --qk-rope-head-dim 8 --v-head-dim 24 --shared-experts 2 --experts-per-token 3"
                             " --n-group 4 --topk-group 2 > " + out + " 2>&1";
  ASSERT_EQ(std::system(widths.c_str()), 0) << locus::testing::read_file(out);
  const DeepseekV3Config c = load_deepseek_v3_config(d.file("w"));
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.kv_lora_rank, 32);
  EXPECT_EQ(c.qk_nope_head_dim, 16);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 24);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_experts_per_tok, 3);
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.hidden_size, 256);  // the tiny shape's
  const std::string shape = locus::testing::locus_binary() + " make-tiny-model " + d.file("s") + " --shape huge > " +
                            out + " 2>&1";
  EXPECT_NE(std::system(shape.c_str()), 0);
  EXPECT_NE(locus::testing::read_file(out).find("--shape"), std::string::npos) << locus::testing::read_file(out);
}

}  // namespace
}  // namespace locus::models
