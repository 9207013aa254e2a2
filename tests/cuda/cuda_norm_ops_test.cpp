// RMSNorm, add, cast and embedding on CUDA (through the ops/ dispatchers) against fp64 and the
// CPU ops: odd and DeepSeek-sized rows, 1 row and many rows, strided views, in-place aliasing,
// every dtype combination the contracts allow, NaN rows for out-of-range device-side ids, and
// the RMSNorm / Embedding modules on the GPU against the same modules on the CPU.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>

#include "cuda_test_util.h"
#include "modules/rmsnorm.h"
#include "ops/fp64_reference.h"
#include "ops/norm.h"

namespace locus::testing {
namespace {

double rmsnorm_tolerance(DType out, int64_t h) {
  return out == DType::kBF16 ? bf16_gemm_tolerance(h) : fp32_out_gemm_tolerance(h);
}

struct NormCase {
  Shape shape;
  DType x, w, y;
};

TEST(CudaRmsnorm, MatchesFp64AndCpuOverShapesAndDtypes) {
  LOCUS_REQUIRE_GPU();
  const NormCase cases[] = {
      {{1, 129}, DType::kBF16, DType::kBF16, DType::kBF16},      // 1 row, H not a multiple of 8
      {{37, 7168}, DType::kBF16, DType::kBF16, DType::kBF16},    // DeepSeek hidden size, vector path
      {{300, 64}, DType::kFP32, DType::kFP32, DType::kFP32},     // many short rows
      {{5, 8}, DType::kBF16, DType::kFP32, DType::kFP32},
      {{2, 3, 512}, DType::kFP32, DType::kBF16, DType::kBF16},   // rank 3
      {{64, 1536}, DType::kBF16, DType::kBF16, DType::kFP32},
      {{3, 7}, DType::kFP32, DType::kFP32, DType::kBF16},
      {{4096, 128}, DType::kBF16, DType::kBF16, DType::kBF16},
      // Rows longer than the two chunks a thread keeps in registers: the vector and scalar paths.
      {{3, 20000}, DType::kBF16, DType::kBF16, DType::kBF16},
      {{2, 3001}, DType::kFP32, DType::kBF16, DType::kBF16},
  };
  for (const NormCase& c : cases) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " shape " << shape_to_string(c.shape));
    const int64_t h = c.shape.back();
    Tensor x = randn(c.shape, c.x, seed, 3.0), w = randn({h}, c.w, seed + 1);
    Tensor y = poisoned_gpu(c.shape, c.y);
    ops::rmsnorm(to_gpu(x), to_gpu(w), 1e-6f, y);
    Tensor y_cpu = Tensor::empty(c.shape, c.y);
    ops::rmsnorm(x, w, 1e-6f, y_cpu);
    const Tensor out = fetch(y);
    const double tol = rmsnorm_tolerance(c.y, h);
    EXPECT_LT(rel_error(out, ref_rmsnorm(x, w, 1e-6)), tol);
    EXPECT_LT(rel_error(out, to_doubles(y_cpu)), tol);
  }
}

TEST(CudaRmsnorm, InPlaceOnColumnSlicesWithContiguousAndStridedWeight) {
  LOCUS_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kFP32})
    for (int64_t c0 : {int64_t{4}, int64_t{8}}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dt) << " c0 " << c0);
      // x: columns [c0, c0 + 64) of a [2, 3, 80] buffer (the kv_a part of a fused projection).
      // c0 = 8 keeps rows 16-byte aligned (vector path); c0 = 4 uses a stride-2 weight.
      auto view = [&](const Tensor& buf) { return buf.slice(2, c0, c0 + 64); };
      Tensor buf = randn({2, 3, 80}, dt, seed);
      const Tensor wbuf = randn(c0 == 8 ? Shape{64, 1} : Shape{64, 2}, DType::kFP32, seed + 1);
      const Tensor w = wbuf.select(1, 0), gw = to_gpu(wbuf).select(1, 0);  // stride 1 or 2
      Tensor gbuf = to_gpu(buf);
      ops::rmsnorm(view(gbuf), gw, 1e-5f, view(gbuf));
      Tensor cbuf = buf.clone();
      ops::rmsnorm(view(cbuf), w, 1e-5f, view(cbuf));
      const Tensor out = fetch(gbuf);
      const double tol = rmsnorm_tolerance(dt, 64);
      EXPECT_LT(rel_error(view(out), ref_rmsnorm(view(buf), w, 1e-5)), tol);
      EXPECT_LT(rel_error(view(out), to_doubles(view(cbuf))), tol);
      EXPECT_TRUE(bitwise_equal(out.slice(2, 0, c0), buf.slice(2, 0, c0)));
      EXPECT_TRUE(bitwise_equal(out.slice(2, c0 + 64, 80), buf.slice(2, c0 + 64, 80)));
    }
}

// a + b on the GPU and on the CPU: both are one fp32 addition and one rounding, so the results
// agree bit for bit.
void expect_add_matches_cpu(const Tensor& a, const Tensor& b, DType out) {
  Tensor y = poisoned_gpu(a.shape(), out);
  ops::add(to_gpu(a), to_gpu(b), y);
  Tensor y_cpu = Tensor::empty(a.shape(), out);
  ops::add(a, b, y_cpu);
  EXPECT_TRUE(bitwise_equal(fetch(y), y_cpu));
}

TEST(CudaAddRmsnorm, IsTheCudaAddThenRmsnormBitwiseAndNearTheCpu) {
  LOCUS_REQUIRE_GPU();
  // The decoder layer's residual sum and post-attention norm at DeepSeek's hidden size (the
  // vector path), odd fp32 rows, and rows longer than the two chunks a thread keeps in registers
  // (vector and scalar); the fused kernel against CUDA's two ops and the CPU's.
  for (auto [shape, dt] : {std::pair<Shape, DType>{{3, 7168}, DType::kBF16}, {{5, 129}, DType::kFP32},
                           {{2, 20000}, DType::kBF16}, {{2, 3001}, DType::kBF16}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << dtype_name(dt));
    const int64_t h = shape.back();
    const Tensor x_cpu = randn(shape, dt, seed, 3.0), r_cpu = randn(shape, dt, seed + 1), w_cpu = randn({h}, DType::kBF16, seed + 2);
    const Tensor r = to_gpu(r_cpu), w = to_gpu(w_cpu);
    Tensor x = to_gpu(x_cpu), y = poisoned_gpu(shape, DType::kBF16);
    ops::add_rmsnorm(x, r, w, 1e-6f, y);
    Tensor x2 = to_gpu(x_cpu), y2 = poisoned_gpu(shape, DType::kBF16);
    ops::add(x2, r, x2);
    ops::rmsnorm(x2, w, 1e-6f, y2);
    EXPECT_TRUE(bitwise_equal(fetch(x), fetch(x2)));
    EXPECT_TRUE(bitwise_equal(fetch(y), fetch(y2)));
    Tensor x3 = x_cpu.clone(), y3 = Tensor::empty(shape, DType::kBF16);
    ops::add_rmsnorm(x3, r_cpu, w_cpu, 1e-6f, y3);
    EXPECT_TRUE(bitwise_equal(fetch(x), x3));  // the sum: one rounding of an fp32 add on both
    EXPECT_LT(rel_error(fetch(y), to_doubles(y3)), rmsnorm_tolerance(DType::kBF16, h));
  }
}

TEST(CudaAdd, BitExactWithCpuForDtypesShapesAndStrides) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  expect_add_matches_cpu(randn({64, 7168}, DType::kBF16, seed), randn({64, 7168}, DType::kBF16, seed + 1),
                         DType::kBF16);
  expect_add_matches_cpu(randn({3, 4, 5}, DType::kFP32, seed + 2), randn({3, 4, 5}, DType::kBF16, seed + 3),
                         DType::kBF16);
  expect_add_matches_cpu(randn({1, 1}, DType::kFP32, seed + 4), randn({1, 1}, DType::kFP32, seed + 5),
                         DType::kFP32);
  // Strided operands on the device: b transposed, a a misaligned column slice, y a column slice.
  Tensor abuf = randn({5, 10}, DType::kBF16, seed + 6), bt = randn({9, 5}, DType::kFP32, seed + 7);
  Tensor ybuf = Tensor::empty({5, 12}, DType::kFP32);
  ybuf.fill_nan_();
  Tensor ga = to_gpu(abuf), gb = to_gpu(bt), gy = to_gpu(ybuf);
  ops::add(ga.slice(1, 1, 10), gb.transpose(0, 1), gy.slice(1, 2, 11));
  ops::add(abuf.slice(1, 1, 10), bt.transpose(0, 1), ybuf.slice(1, 2, 11));
  EXPECT_TRUE(bitwise_equal(fetch(gy), ybuf));
}

TEST(CudaAdd, InPlaceIntoEitherOperand) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (Shape shape : {Shape{33, 100}, Shape{8, 7168}}) {
    Tensor a = randn(shape, DType::kBF16, seed), b = randn(shape, DType::kFP32, seed + 1);
    Tensor want = Tensor::empty(shape, DType::kBF16);
    ops::add(a, b, want);
    Tensor ga = to_gpu(a), gb = to_gpu(b);
    ops::add(ga, gb, ga);  // the residual update x = x + a of a decoder layer
    EXPECT_TRUE(bitwise_equal(fetch(ga), want));
    Tensor want_b = Tensor::empty(shape, DType::kFP32);
    ops::add(a, b, want_b);
    ops::add(to_gpu(a), gb, gb);
    EXPECT_TRUE(bitwise_equal(fetch(gb), want_b));
  }
}

TEST(CudaCast, EveryDirectionBitExactWithCpuOnStridedAndSpecialValues) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Tensor x = randn({6, 11}, DType::kFP32, seed, 100.0);
  const float special[] = {1e6f, 3e-6f, -1e-8f, NAN, -INFINITY, -0.f, 65520.f, 1.00048828125f};
  for (int i = 0; i < 8; ++i) x.data<float>()[i * 7] = special[i];  // overflow, subnormals, ties
  for (DType src : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    Tensor xs = Tensor::empty({6, 11}, src);
    ops::cast(x, xs);
    const Tensor gxs = to_gpu(xs);
    for (DType dst : {DType::kBF16, DType::kFP16, DType::kFP32}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(src) << " -> " << dtype_name(dst));
      Tensor y = poisoned_gpu({11, 6}, dst), y_cpu = Tensor::empty({11, 6}, dst);
      ops::cast(gxs.transpose(0, 1), y);
      ops::cast(xs.transpose(0, 1), y_cpu);
      EXPECT_TRUE(bitwise_equal(fetch(y), y_cpu));
    }
  }
  // Contiguous (16-byte accesses).
  Tensor big = randn({128, 1024}, DType::kFP32, seed + 1);
  Tensor yb = poisoned_gpu({128, 1024}, DType::kBF16), yb_cpu = Tensor::empty({128, 1024}, DType::kBF16);
  ops::cast(to_gpu(big), yb);
  ops::cast(big, yb_cpu);
  EXPECT_TRUE(bitwise_equal(fetch(yb), yb_cpu));
}

TEST(CudaCast, CopiesTheRopeColumnsIntoACacheSliceAsMlaDoes) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t T = 5, dc = 512, dr = 64, cap = 16, len = 3;
  Tensor kva = randn({T, dc + dr}, DType::kBF16, seed), latent = randn({cap, dc + dr}, DType::kBF16, seed + 1);
  auto run = [&](const Tensor& src, const Tensor& cache) {
    ops::cast(src.slice(1, dc, dc + dr), cache.slice(0, len, len + T).slice(1, dc, dc + dr));
  };
  Tensor glat = to_gpu(latent);
  run(to_gpu(kva), glat);
  run(kva, latent);
  EXPECT_TRUE(bitwise_equal(fetch(glat), latent));
}

TEST(CudaEmbedding, GathersRowsBitExactWithCpu) {
  LOCUS_REQUIRE_GPU();
  struct Case {
    int64_t vocab, h, tokens;
    DType table, y, ids;
  };
  const Case cases[] = {
      {500, 256, 37, DType::kBF16, DType::kBF16, DType::kI32},  // vector path
      {500, 256, 1, DType::kBF16, DType::kFP32, DType::kI64},
      {50, 129, 9, DType::kFP32, DType::kBF16, DType::kI64},    // odd H
      {64, 24, 300, DType::kFP16, DType::kFP16, DType::kI32},
  };
  for (const Case& c : cases) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " H " << c.h << " T " << c.tokens);
    Tensor table = randn({c.vocab, c.h}, c.table, seed);
    // ids as every other element of a [T, 2] buffer (a strided view).
    Tensor idbuf = Tensor::empty({c.tokens, 2}, c.ids);
    std::mt19937_64 rng(seed + 1);
    for (int64_t t = 0; t < c.tokens * 2; ++t) {
      const int64_t id = static_cast<int64_t>(rng() % c.vocab);
      if (c.ids == DType::kI32) idbuf.data<int32_t>()[t] = static_cast<int32_t>(id);
      else idbuf.data<int64_t>()[t] = id;
    }
    Tensor y = poisoned_gpu({c.tokens, c.h}, c.y), y_cpu = Tensor::empty({c.tokens, c.h}, c.y);
    ops::embedding(to_gpu(table), to_gpu(idbuf).select(1, 0), y);
    ops::embedding(table, idbuf.select(1, 0), y_cpu);
    EXPECT_TRUE(bitwise_equal(fetch(y), y_cpu));
  }
}

TEST(CudaEmbedding, OutOfRangeDeviceIdsGiveNanRowsAndTheRestIsExact) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t vocab = 40, h = 64;
  Tensor table = randn({vocab, h}, DType::kBF16, seed);
  const int64_t want[] = {3, -1, vocab, 7, INT32_MAX, int64_t{1} << 40, INT64_MIN, vocab - 1};
  const bool bad[] = {false, true, true, false, true, true, true, false};
  Tensor ids = Tensor::empty({8}, DType::kI64);
  for (int t = 0; t < 8; ++t) ids.data<int64_t>()[t] = want[t];
  Tensor y = poisoned_gpu({8, h}, DType::kFP32);
  ops::embedding(to_gpu(table), to_gpu(ids), y);
  const Tensor out = fetch(y);
  for (int t = 0; t < 8; ++t) {
    SCOPED_TRACE(::testing::Message() << "row " << t << " id " << want[t]);
    for (int64_t c = 0; c < h; ++c) {
      if (bad[t]) EXPECT_TRUE(std::isnan(get(out, t * h + c)));
      else EXPECT_EQ(get(out, t * h + c), get(table, want[t] * h + c));
    }
  }
  // The same ids on the CPU are validated on the host and rejected with the offending entry.
  EXPECT_THROW(ops::embedding(table, ids, Tensor::empty({8, h}, DType::kFP32)), Error);
}

modules::ModuleContext context(const std::string& name, Device device) {
  modules::ModuleContext c;
  c.device = device;
  c.name = name;
  return c;
}

TEST(CudaNormModules, RmsNormAndEmbeddingOnTheGpuMatchTheCpuModules) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t M = 4, H = 7168, vocab = 300, He = 2048;
  const Device dev = Device::cuda(0);
  modules::RMSNorm norm_cpu(context("model.norm", Device::cpu()), H, 1e-6f), norm_gpu(context("model.norm", dev), H, 1e-6f);
  Tensor w = randn({H}, DType::kBF16, seed), x = randn({M, H}, DType::kBF16, seed + 1);
  for (modules::RMSNorm* n : {&norm_cpu, &norm_gpu}) {
    n->load("weight", w);
    n->localize();
  }
  ASSERT_TRUE(norm_gpu.weight().device().is_cuda());
  Tensor y_cpu = Tensor::empty({M, H}, DType::kBF16), y = poisoned_gpu({M, H}, DType::kBF16);
  norm_cpu.forward(x, y_cpu);
  norm_gpu.forward(to_gpu(x), y);
  EXPECT_LT(rel_error(fetch(y), to_doubles(y_cpu)), bf16_gemm_tolerance(H));
  EXPECT_LT(rel_error(fetch(y), ref_rmsnorm(x, w, 1e-6)), bf16_gemm_tolerance(H));
  // Reload in place: same device pointer, new values used.
  const void* p = norm_gpu.weight().data_ptr();
  Tensor w2 = randn({H}, DType::kBF16, seed + 2);
  norm_gpu.reload({{"weight", w2}});
  EXPECT_EQ(norm_gpu.weight().data_ptr(), p);
  y = poisoned_gpu({M, H}, DType::kBF16);
  norm_gpu.forward(to_gpu(x), y);
  EXPECT_LT(rel_error(fetch(y), ref_rmsnorm(x, w2, 1e-6)), bf16_gemm_tolerance(H));

  modules::Embedding emb_cpu(context("model.embed_tokens", Device::cpu()), vocab, He),
      emb_gpu(context("model.embed_tokens", dev), vocab, He);
  Tensor table = randn({vocab, He}, DType::kBF16, seed + 3);
  for (modules::Embedding* e : {&emb_cpu, &emb_gpu}) {
    e->load("weight", table);
    e->localize();
  }
  Tensor ids = Tensor::empty({6}, DType::kI32);
  const int32_t v[6] = {299, 0, 17, 17, 150, 1};
  std::copy(v, v + 6, ids.data<int32_t>());
  Tensor e_cpu = Tensor::empty({6, He}, DType::kBF16), e_gpu = poisoned_gpu({6, He}, DType::kBF16);
  emb_cpu.forward(ids, e_cpu);
  emb_gpu.forward(to_gpu(ids), e_gpu);
  EXPECT_TRUE(bitwise_equal(fetch(e_gpu), e_cpu));
}

}  // namespace
}  // namespace locus::testing
