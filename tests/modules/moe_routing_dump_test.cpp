// LOCUS_ROUTING_DUMP's records (modules/moe_routing_dump.h): two calls appended to one file, read
// back field by field as tools/gpu/compare_routing.py reads them; with and without a correction
// bias; a strided logits view is written dense; an unwritable path is a clear error.
#include "modules/moe_routing_dump.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/runtime_test_util.h"

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

}  // namespace
}  // namespace locus::testing
