// softmax and topk on CUDA (through ops/) against fp64 and the CPU ops: vocabulary-sized rows,
// odd and tiny rows, many rows, strided rows and outputs, in-place softmax, -inf / NaN / +inf
// rows, and top-k's ordering contract (ties to the lower index, NaN last, -0 == +0) for small
// and large k, compared bit for bit with the CPU op.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda_test_util.h"
#include "ops/fp64_reference.h"
#include "ops/norm.h"
#include "ops/softmax_topk.h"
#include "runtime/sampler.h"

namespace locus::testing {
namespace {

// fp32 softmax error: the output rounding and expf (2 ulp) give ~3e-7 per element; the row sum
// is the one reduction, rescaled ~ln(n) times per thread, and its relative error is at most
// ~(n / threads + log2(threads)) * 2^-24, far below 1e-7 sqrt(n) for n >= 64.
double softmax_tolerance(int64_t n) { return 1e-6 + 1e-7 * std::sqrt(static_cast<double>(n)); }

TEST(CudaSoftmax, MatchesFp64AndCpuOverShapes) {
  LOCUS_REQUIRE_GPU();
  const Shape shapes[] = {{4, 37}, {3, 129280}, {1000, 256}, {2, 3, 50}, {1, 1}, {5, 4096}};
  for (const Shape& shape : shapes) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " shape " << shape_to_string(shape));
    const int64_t n = shape.back();
    Tensor x = randn(shape, DType::kFP32, seed, 5.0);
    std::mt19937_64 rng(seed + 1);
    for (int i = 0; i < 5 && n > 1; ++i) x.data<float>()[rng() % x.numel()] = -INFINITY;  // masked logits
    Tensor y = poisoned_gpu(shape, DType::kFP32), y_cpu = Tensor::empty(shape, DType::kFP32);
    ops::softmax(to_gpu(x), y);
    ops::softmax(x, y_cpu);
    const Tensor out = fetch(y);
    EXPECT_LT(rel_error(out, ref_softmax(x)), softmax_tolerance(n));
    // The CPU op sums the row serially in fp32 (1.2e-4 off fp64 at n = 129280), so the two
    // backends agree to the general bound for an fp32 reduction of length n.
    EXPECT_LT(rel_error(out, to_doubles(y_cpu)), fp32_out_gemm_tolerance(n));
    for (int64_t i = 0; i < x.numel(); ++i)
      if (std::isinf(x.data<float>()[i])) EXPECT_EQ(out.data<float>()[i], 0.f) << i;
  }
}

TEST(CudaSoftmax, InPlaceOnStridedRowsAndSpecialRows) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t rows = 6, n = 40;
  // x = columns [0, 40) of a [6, 43] buffer (rows not 16-byte aligned: scalar path).
  Tensor buf = randn({rows, n + 3}, DType::kFP32, seed, 3.0);
  float* r = buf.data<float>();
  for (int64_t c = 0; c < n; ++c) r[1 * (n + 3) + c] = -INFINITY;  // all -inf: NaN, as in PyTorch
  r[2 * (n + 3) + 5] = NAN;                                         // a NaN poisons its row
  r[3 * (n + 3) + 7] = INFINITY;                                    // so does +inf
  r[4 * (n + 3) + 0] = -INFINITY;
  Tensor gbuf = to_gpu(buf);
  ops::softmax(gbuf.slice(1, 0, n), gbuf.slice(1, 0, n));
  Tensor cbuf = buf.clone();
  ops::softmax(cbuf.slice(1, 0, n), cbuf.slice(1, 0, n));
  const Tensor out = fetch(gbuf);
  EXPECT_TRUE(bitwise_equal(out.slice(1, n, n + 3), buf.slice(1, n, n + 3)));  // untouched
  for (int64_t row : {1, 2, 3})
    for (int64_t c = 0; c < n; ++c) {
      EXPECT_TRUE(std::isnan(get(out, row * (n + 3) + c))) << row << "," << c;
      EXPECT_TRUE(std::isnan(get(cbuf, row * (n + 3) + c))) << row << "," << c;
    }
  for (int64_t row : {0, 4, 5}) {
    const Tensor in = buf.slice(0, row, row + 1).slice(1, 0, n);
    EXPECT_LT(rel_error(out.slice(0, row, row + 1).slice(1, 0, n), ref_softmax(in)), softmax_tolerance(n)) << row;
  }
}

// Runs topk on the GPU and on the CPU with the same (possibly strided) output views over
// poisoned buffers, and expects identical buffers: the contract fixes every value and index.
void expect_topk_matches_cpu(const Tensor& x, int64_t k, DType values_dt, DType indices_dt, bool strided_out) {
  Shape vshape = x.shape();
  vshape.back() = k;
  const int64_t rows = x.numel() / x.size(-1);
  // Strided outputs: values as columns [0, k) of [rows, k + 5]; indices as a transposed [k, rows].
  Tensor vbuf = Tensor::empty(strided_out ? Shape{rows, k + 5} : vshape, values_dt);
  Tensor ibuf = Tensor::empty(strided_out ? Shape{k, rows} : vshape, indices_dt);
  vbuf.fill_nan_();
  ibuf.fill_nan_();
  auto values = [&](const Tensor& b) { return strided_out ? b.slice(1, 0, k) : b; };
  auto indices = [&](const Tensor& b) { return strided_out ? b.transpose(0, 1) : b; };
  if (strided_out) ASSERT_EQ(x.dim(), 2) << "strided outputs are built for 2-D x";
  Tensor gv = to_gpu(vbuf), gi = to_gpu(ibuf);
  ops::topk(to_gpu(x), k, values(gv), indices(gi));
  ops::topk(x, k, values(vbuf), indices(ibuf));
  EXPECT_TRUE(bitwise_equal(fetch(gi), ibuf)) << "indices differ";
  EXPECT_TRUE(bitwise_equal(fetch(gv), vbuf)) << "values differ";
}

// Random values with many exact ties: bf16 normals, optionally widened to fp32.
Tensor tied_values(const Shape& shape, DType dt, uint64_t seed) {
  Tensor b = randn(shape, DType::kBF16, seed);
  if (dt == DType::kBF16) return b;
  Tensor f = Tensor::empty(shape, DType::kFP32);
  ops::cast(b, f);
  return f;
}

struct TopkCase {
  Shape shape;
  int64_t k;
  DType x, values, indices;
  bool strided_out;
};

TEST(CudaTopk, MatchesCpuBitForBitForSmallAndLargeK) {
  LOCUS_REQUIRE_GPU();
  const TopkCase cases[] = {
      {{6, 256}, 8, DType::kBF16, DType::kFP32, DType::kI32, false},      // MoE routing
      {{2, 129280}, 50, DType::kFP32, DType::kFP32, DType::kI64, false},  // sampling over the vocabulary
      {{3, 129280}, 1, DType::kBF16, DType::kBF16, DType::kI32, true},
      {{4, 1000}, 1000, DType::kFP32, DType::kFP32, DType::kI32, false},  // k = N
      {{1, 10007}, 5000, DType::kFP32, DType::kBF16, DType::kI64, false}, // k > shared-memory sort
      {{2, 3, 77}, 5, DType::kFP32, DType::kFP32, DType::kI64, false},    // rank 3, odd N
      {{1, 1}, 1, DType::kFP32, DType::kFP32, DType::kI32, false},
      {{512, 256}, 8, DType::kFP32, DType::kFP32, DType::kI32, true},     // many rows
      {{2, 4100}, 4097, DType::kBF16, DType::kFP32, DType::kI32, true},
  };
  for (const TopkCase& c : cases) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " shape " << shape_to_string(c.shape) << " k " << c.k);
    expect_topk_matches_cpu(tied_values(c.shape, c.x, seed), c.k, c.values, c.indices, c.strided_out);
  }
}

// Greedy decoding's reduction on the device: the same tokens as the host's argmax() over the
// vocabulary, ties to the lower index, NaN never winning; an all-NaN row is the host's error.
TEST(CudaArgmaxRows, MatchesHostArgmax) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (const Shape& shape : {Shape{1, 129280}, Shape{8, 129280}, Shape{3, 7}}) {
    SCOPED_TRACE(shape_to_string(shape));
    Tensor host = tied_values(shape, DType::kFP32, seed + shape[0]);
    host.data<float>()[0] = NAN;
    const std::vector<int32_t> got = runtime::argmax_rows(host.to(Device::cuda(0)));
    ASSERT_EQ(got.size(), static_cast<size_t>(shape[0]));
    for (int64_t r = 0; r < shape[0]; ++r)
      EXPECT_EQ(got[r], runtime::argmax(host.data<float>() + r * shape[1], shape[1])) << r;
    for (int64_t c = 0; c < shape[1]; ++c) host.data<float>()[c] = NAN;
    EXPECT_THROW(runtime::argmax_rows(host.to(Device::cuda(0))), Error);
  }
}

TEST(CudaTopk, StridedRowsOfX) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Tensor buf = tied_values({7, 303}, DType::kFP32, seed);
  Tensor gbuf = to_gpu(buf);
  Tensor v = poisoned_gpu({7, 9}, DType::kFP32), i = poisoned_gpu({7, 9}, DType::kI64);
  Tensor v_cpu = Tensor::empty({7, 9}, DType::kFP32), i_cpu = Tensor::empty({7, 9}, DType::kI64);
  ops::topk(gbuf.slice(1, 1, 301), 9, v, i);
  ops::topk(buf.slice(1, 1, 301), 9, v_cpu, i_cpu);
  EXPECT_TRUE(bitwise_equal(fetch(i), i_cpu));
  EXPECT_TRUE(bitwise_equal(fetch(v), v_cpu));
}

TEST(CudaTopk, TiesGoToTheLowerIndexAndNanComesLast) {
  LOCUS_REQUIRE_GPU();
  Tensor x = Tensor::empty({2, 8}, DType::kFP32);
  const float row0[8] = {1.f, 3.f, NAN, 3.f, -INFINITY, 2.f, 3.f, 0.f};
  const float row1[8] = {NAN, -1.f, NAN, -1.f, -0.f, 0.f, -2.f, -1.f};
  std::copy(row0, row0 + 8, x.data<float>());
  std::copy(row1, row1 + 8, x.data<float>() + 8);
  Tensor v = poisoned_gpu({2, 8}, DType::kFP32), idx = poisoned_gpu({2, 8}, DType::kI32);
  ops::topk(to_gpu(x), 8, v, idx);
  const Tensor vi = fetch(idx), vv = fetch(v);
  const int32_t want0[8] = {1, 3, 6, 5, 0, 7, 4, 2};
  const int32_t want1[8] = {4, 5, 1, 3, 7, 6, 0, 2};  // -0 == 0: tie, lower index first
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(vi.data<int32_t>()[j], want0[j]) << j;
    EXPECT_EQ(vi.data<int32_t>()[8 + j], want1[j]) << j;
  }
  EXPECT_TRUE(std::signbit(vv.data<float>()[8]));  // the value read back is the stored -0
  EXPECT_TRUE(std::isnan(vv.data<float>()[7]));
  // A row that is all ties, and one that is mostly NaN, against the CPU op.
  for (int64_t k : {int64_t{3}, int64_t{4500}}) {
    Tensor ties = Tensor::zeros({2, 5000}, DType::kFP32);
    for (int64_t c = 0; c < 5000; c += 3) ties.data<float>()[5000 + c] = NAN;
    expect_topk_matches_cpu(ties, k, DType::kFP32, DType::kI64, false);
  }
}

}  // namespace
}  // namespace locus::testing
