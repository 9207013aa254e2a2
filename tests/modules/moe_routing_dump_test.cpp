// LOCUS_ROUTING_DUMP's records (modules/moe_routing_dump.h): two calls appended to one file, read
// back field by field as tools/gpu/compare_routing.py reads them; with and without a correction
// bias; a strided logits view is written dense; an unwritable path is a clear error.
#include "modules/moe_routing_dump.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/moe_routing.h"
#include "runtime/runtime_test_util.h"
#include "test_util.h"

namespace locus::testing {
namespace {

// Reads the file's records one field at a time.
struct Reader {
  std::string bytes;
  size_t pos = 0;
  template <typename T>
  T get() {
    T v{};
    EXPECT_LE(pos + sizeof(T), bytes.size());
    if (pos + sizeof(T) <= bytes.size()) std::memcpy(&v, bytes.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string get_string(size_t n) {
    const std::string s = bytes.substr(pos, n);
    pos += n;
    return s;
  }
};

Tensor f32_tensor(Shape shape, float start) {
  Tensor t = Tensor::empty(shape, DType::kFP32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + 0.25f * static_cast<float>(i);
  return t;
}

TEST(MoeRoutingDump, AppendsRecordsThatReadBackFieldByField) {
  TempDir dir;
  const std::string path = dir.file("routing.bin");
  ops::MoeRoutingConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  cfg.n_group = 2;
  cfg.topk_group = 1;
  // Logits [2, 4] as the first 4 columns of a [2, 6] buffer: written dense.
  const Tensor wide = f32_tensor({2, 6}, -1.f);
  const Tensor logits = wide.slice(1, 0, 4);
  const Tensor bias = f32_tensor({4}, 0.5f);
  Tensor ids = Tensor::empty({2, 2}, DType::kI32);
  const int32_t chosen[] = {3, 1, 0, 2};
  std::memcpy(ids.data_ptr(), chosen, sizeof chosen);
  modules::dump_routing(path, "model.layers.1.mlp", logits, bias, cfg, ids);
  cfg.scoring = ops::MoeScoring::kSoftmax;
  modules::dump_routing(path, "model.layers.2.mlp", logits, Tensor(), cfg, ids);

  Reader r{read_file(path)};
  for (int rec = 0; rec < 2; ++rec) {
    SCOPED_TRACE(rec);
    EXPECT_EQ(r.get_string(4), "LRD1");
    const uint32_t n = r.get<uint32_t>();
    EXPECT_EQ(r.get_string(n), rec == 0 ? "model.layers.1.mlp" : "model.layers.2.mlp");
    const std::vector<uint32_t> head = {2, 4, 2, 2, 1, rec == 0 ? 0u : 1u, rec == 0 ? 1u : 0u};
    for (uint32_t want : head) EXPECT_EQ(r.get<uint32_t>(), want);
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(r.get<float>(), wide.data<float>()[t * 6 + e]);
    if (rec == 0)
      for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(r.get<float>(), 0.5f + 0.25f * static_cast<float>(e));
    for (int32_t id : chosen) EXPECT_EQ(r.get<int32_t>(), id);
  }
  EXPECT_EQ(r.pos, r.bytes.size());
}

TEST(MoeRoutingDump, AnUnwritablePathIsAClearError) {
  ops::MoeRoutingConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  Tensor ids = Tensor::empty({1, 2}, DType::kI32);
  ids.data<int32_t>()[0] = 0;
  ids.data<int32_t>()[1] = 1;
  expect_error([&] { modules::dump_routing("/nonexistent/dir/r.bin", "moe", f32_tensor({1, 4}, 0.f), Tensor(), cfg, ids); },
               {"LOCUS_ROUTING_DUMP", "/nonexistent/dir/r.bin"});
}

// RoutingReplay takes each layer's records in order: the recorded ids, with the weights
// moe_route gives those experts (bitwise its own where it chose the same); then an error once the
// layer's records are used up, or when a record's shape differs from the call's.
TEST(MoeRoutingReplay, TakesEachLayersRecordedExpertsInOrder) {
  TempDir dir;
  const std::string path = dir.file("routing.bin");
  ops::MoeRoutingConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  cfg.routed_scaling_factor = 2.5f;
  const Tensor logits = f32_tensor({2, 4}, -0.6f);  // token rows rise with the expert index
  Tensor w_ref = Tensor::empty({2, 2}, DType::kFP32), ids_ref = Tensor::empty({2, 2}, DType::kI32);
  ops::moe_route(logits, Tensor(), cfg, w_ref, ids_ref);
  Tensor other = Tensor::empty({2, 2}, DType::kI32);
  const int32_t forced[] = {0, 2, 1, 3};
  std::memcpy(other.data_ptr(), forced, sizeof forced);
  modules::dump_routing(path, "L", logits, Tensor(), cfg, ids_ref);
  modules::dump_routing(path, "M", logits, Tensor(), cfg, other);
  modules::dump_routing(path, "L", logits, Tensor(), cfg, other);

  modules::RoutingReplay replay(path);
  Tensor w = Tensor::empty({2, 2}, DType::kFP32), ids = Tensor::empty({2, 2}, DType::kI32);
  replay.route("L", logits, cfg, w, ids);  // record 0 of L: moe_route's own choice
  EXPECT_TRUE(bitwise_equal(ids, ids_ref));
  EXPECT_TRUE(bitwise_equal(w, w_ref));
  replay.route("L", logits, cfg, w, ids);  // record 1 of L: the forced experts
  auto sigmoid = [](float v) { return 1.f / (1.f + std::exp(-v)); };
  for (int64_t t = 0; t < 2; ++t) {
    const float* row = logits.data<float>() + t * 4;
    const float s0 = sigmoid(row[forced[2 * t]]), s1 = sigmoid(row[forced[2 * t + 1]]);
    for (int64_t j = 0; j < 2; ++j) {
      EXPECT_EQ(ids.data<int32_t>()[t * 2 + j], forced[t * 2 + j]);
      const float s = j == 0 ? s0 : s1;
      EXPECT_NEAR(w.data<float>()[t * 2 + j], s / (s0 + s1) * 2.5f, 1e-6f);
    }
  }
  expect_error([&] { replay.route("L", logits, cfg, w, ids); }, {"LOCUS_ROUTING_REPLAY", "no record 2 for L"});
  expect_error([&] { replay.route("N", logits, cfg, w, ids); }, {"no record 0 for N"});
  // M's record holds 2 tokens; a call with 1 is refused.
  Tensor w1 = Tensor::empty({1, 2}, DType::kFP32), ids1 = Tensor::empty({1, 2}, DType::kI32);
  expect_error([&] { replay.route("M", logits.slice(0, 0, 1), cfg, w1, ids1); }, {"M's record 0", "has 2 tokens"});
}

TEST(MoeRoutingReplay, MalformedFilesAndIdsAreClearErrors) {
  TempDir dir;
  expect_error([&] { modules::RoutingReplay r(dir.file("missing.bin")); }, {"LOCUS_ROUTING_REPLAY", "cannot read"});
  write_file(dir.file("junk.bin"), "JUNKJUNK");
  expect_error([&] { modules::RoutingReplay r(dir.file("junk.bin")); }, {"record 0", "LRD1"});
  ops::MoeRoutingConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  Tensor ids = Tensor::empty({1, 2}, DType::kI32);
  ids.data<int32_t>()[0] = 0;
  ids.data<int32_t>()[1] = 9;  // no such expert
  const std::string path = dir.file("r.bin");
  modules::dump_routing(path, "L", f32_tensor({1, 4}, 0.f), Tensor(), cfg, ids);
  const std::string whole = read_file(path);
  write_file(dir.file("cut.bin"), whole.substr(0, whole.size() - 3));
  expect_error([&] { modules::RoutingReplay r(dir.file("cut.bin")); }, {"ends inside record 0"});
  modules::RoutingReplay replay(path);
  Tensor w = Tensor::empty({1, 2}, DType::kFP32), out = Tensor::empty({1, 2}, DType::kI32);
  expect_error([&] { replay.route("L", f32_tensor({1, 4}, 0.f), cfg, w, out); }, {"forced expert id 9", "[0, 4)"});
}

}  // namespace
}  // namespace locus::testing
