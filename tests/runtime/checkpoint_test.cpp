#include "runtime/checkpoint.h"

#include <gtest/gtest.h>

#include "core/float_convert.h"
#include "runtime_test_util.h"
#include "test_util.h"

namespace locus::runtime {
namespace {
using locus::testing::expect_error;
using locus::testing::TempDir;
using locus::testing::write_file;

Tensor scalar_f32(float v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kFP32);
  t.data<float>()[0] = v;
  return t;
}

// Two shards + index: "a", "s0" in shard 1; "b", "s1" in shard 2.
void write_sharded(const TempDir& d, const Tensor& a, const Tensor& b) {
  SafetensorsWriter w1, w2;
  w1.add("model.a", a);
  w1.add("model.s0", scalar_f32(0.5f, {}));
  w2.add("model.b", b);
  w2.add("model.s1", scalar_f32(-2.f, {1}));
  Tensor h = Tensor::empty({1}, DType::kBF16);
  h.data<uint16_t>()[0] = f32_to_bf16_bits(3.f);
  w2.add("model.sbf", h);
  w2.add("model.vec", scalar_f32(1.f, {2}));
  w1.write(d.file("model-00001-of-00002.safetensors"));
  w2.write(d.file("model-00002-of-00002.safetensors"));
  write_file(d.file("model.safetensors.index.json"), R"({"metadata": {"total_size": 0}, "weight_map": {
    "model.a": "model-00001-of-00002.safetensors", "model.s0": "model-00001-of-00002.safetensors",
    "model.b": "model-00002-of-00002.safetensors", "model.s1": "model-00002-of-00002.safetensors",
    "model.sbf": "model-00002-of-00002.safetensors", "model.vec": "model-00002-of-00002.safetensors"}})");
  write_file(d.file("config.json"), R"({"model_type": "deepseek_v3"})");
}

TEST(Checkpoint, ShardedIndexLoadsEveryTensor) {
  TempDir d;
  const uint64_t seed = locus::testing::fresh_seed();
  Tensor a = locus::testing::randn({4, 8}, DType::kBF16, seed);
  Tensor b = locus::testing::randn({3}, DType::kFP32, seed + 1);
  write_sharded(d, a, b);
  Checkpoint c = Checkpoint::open(d.path());
  EXPECT_EQ(c.num_shards(), 2u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"model.a", "model.b", "model.s0", "model.s1", "model.sbf", "model.vec"}));
  EXPECT_TRUE(c.has("model.a"));
  EXPECT_FALSE(c.has("model.c"));
  EXPECT_EQ(c.shape("model.a"), (Shape{4, 8}));
  EXPECT_EQ(c.dtype("model.b"), DType::kFP32);
  EXPECT_NE(c.shard_path("model.b").find("model-00002-of-00002"), std::string::npos);
  EXPECT_TRUE(locus::testing::bitwise_equal(c.get("model.a"), a));
  EXPECT_TRUE(locus::testing::bitwise_equal(c.get("model.b", DType::kFP32, {3}), b));
  EXPECT_EQ(c.get_scalar("model.s0"), 0.5f);   // 0-d
  EXPECT_EQ(c.get_scalar("model.s1"), -2.f);   // [1]
  EXPECT_EQ(c.get_scalar("model.sbf"), 3.f);   // bf16 [1]
  EXPECT_EQ(c.config_json()["model_type"], "deepseek_v3");
  EXPECT_EQ(c.total_tensor_bytes(), 4u * 8 * 2 + 3 * 4 + 4 + 4 + 2 + 8);

  expect_error([&] { c.get("model.layers.0.missing.weight"); }, {"'model.layers.0.missing.weight'", "missing", d.path()});
  expect_error([&] { c.get("model.a", DType::kBF16, {8, 4}); }, {"'model.a'", "expected bf16[8, 4]", "found BF16[4, 8]"});
  expect_error([&] { c.get("model.b", DType::kBF16, {3}); }, {"'model.b'", "expected bf16[3]", "found F32[3]"});
  expect_error([&] { c.get_scalar("model.vec"); }, {"'model.vec'", "scalar", "[2]"});
  expect_error([&] { c.get_scalar("model.a"); }, {"'model.a'", "scalar"});
}

TEST(Checkpoint, BrokenDirectoriesGiveClearErrors) {
  TempDir d;
  expect_error([&] { Checkpoint::open(d.file("nope")); }, {"nope", "does not exist"});
  expect_error([&] { Checkpoint::open(d.path()); }, {"neither model.safetensors nor model.safetensors.index.json"});

  const uint64_t seed = locus::testing::fresh_seed();
  write_sharded(d, locus::testing::randn({2, 2}, DType::kBF16, seed), locus::testing::randn({2}, DType::kFP32, seed));
  // Index names a tensor the shard does not hold.
  write_file(d.file("model.safetensors.index.json"),
             R"({"weight_map": {"model.a": "model-00001-of-00002.safetensors", "model.ghost": "model-00001-of-00002.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.path()); }, {"'model.ghost'", "model-00001-of-00002.safetensors", "does not hold it"});
  // Index names a missing shard.
  write_file(d.file("model.safetensors.index.json"), R"({"weight_map": {"model.a": "model-00009-of-00009.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.path()); }, {"model-00009-of-00009.safetensors", "missing"});
  // Path traversal in the index.
  write_file(d.file("model.safetensors.index.json"), R"({"weight_map": {"model.a": "../x.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.path()); }, {"../x.safetensors", "not a plain file name"});
  write_file(d.file("model.safetensors.index.json"), R"({"weight_map": [1, 2]})");
  expect_error([&] { Checkpoint::open(d.path()); }, {"model.safetensors.index.json", "weight_map"});
  write_file(d.file("model.safetensors.index.json"), R"({"weight_map": )");
  expect_error([&] { Checkpoint::open(d.path()); }, {"model.safetensors.index.json", "not valid JSON"});
  // A truncated shard is reported with its path.
  write_file(d.file("model.safetensors.index.json"), R"({"weight_map": {"model.a": "model-00001-of-00002.safetensors"}})");
  std::string bytes = locus::testing::read_file(d.file("model-00001-of-00002.safetensors"));
  write_file(d.file("model-00001-of-00002.safetensors"), bytes.substr(0, bytes.size() - 3));
  expect_error([&] { Checkpoint::open(d.path()); }, {"model-00001-of-00002.safetensors", "run past the data section"});
}

TEST(Checkpoint, SingleFileCheckpoint) {
  TempDir d;
  SafetensorsWriter w;
  Tensor a = locus::testing::randn({2, 3}, DType::kBF16, locus::testing::fresh_seed());
  w.add("lm_head.weight", a);
  w.write(d.file("model.safetensors"));
  Checkpoint c = Checkpoint::open(d.path());
  EXPECT_EQ(c.names(), std::vector<std::string>{"lm_head.weight"});
  EXPECT_TRUE(locus::testing::bitwise_equal(c.get("lm_head.weight"), a));
  expect_error([&] { c.config_json(); }, {"no config.json"});
}

}  // namespace
}  // namespace locus::runtime
