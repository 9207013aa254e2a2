// NVFP4: ModelOpt-exact quantization on a hand-checked example, the dequantization error bound,
// and the NVFP4 x BF16 GEMM against fp64 on the dequantized weight (plus bitwise partitioning).
#include "ops/nvfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backends/cpu/thread_pool.h"
#include "core/device_hooks.h"
#include "ops/gemm.h"
#include "test_util.h"

namespace locus {
namespace {

using testing::bf16_gemm_tolerance;
using testing::bitwise_equal;
using testing::fp32_out_gemm_tolerance;
using testing::fresh_seed;
using testing::randn;
using testing::rel_error;

Tensor from_values(const std::vector<float>& v, int64_t rows) {
  Tensor t = Tensor::empty({rows, static_cast<int64_t>(v.size()) / rows}, DType::kFP32);
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = v[i];
  return t;
}

TEST(Nvfp4Quantize, HandCheckedRowMatchesModelOpt) {
  // Global scale 0.25 (exact). Block 0: amax 12 -> scale 12 / (6 * 0.25) = 8 (e4m3 0x50), step d = 2.
  // Block 1: all zero -> scale 1.0 (0x38). Block 2: amax 0.75 -> scale 0.5 (0x30), d = 0.125.
  std::vector<float> w = {3.f, -12.f, 0.5f, 1.5f, 5.f, 7.f, 10.f, -0.f, -1.f, 0.2f, 2.5f, 3.5f, 11.f, -4.f, 1.f, 0.f};
  w.resize(32, 0.f);
  for (float v : {0.75f, 0.375f}) w.push_back(v);
  w.resize(48, 0.f);
  ops::Nvfp4Weight q = ops::nvfp4_quantize(from_values(w, 1), 0.25f);
  ASSERT_EQ(q.n, 1);
  ASSERT_EQ(q.k, 48);
  EXPECT_EQ(q.packed.shape(), (Shape{1, 24}));
  EXPECT_EQ(q.scales.shape(), (Shape{1, 3}));
  EXPECT_EQ(q.global_scale, 0.25f);
  const uint8_t* s = q.scales.data<uint8_t>();
  EXPECT_EQ(s[0], 0x50);
  EXPECT_EQ(s[1], 0x38);
  EXPECT_EQ(s[2], 0x30);
  // w / d: 1.5 -> 3, -6 -> 0xF (low nibble = element 0, high = element 1: byte 0xF3);
  // ties 0.25 -> 0, 0.75 -> 1.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4; -0.0 -> code 0 (ModelOpt's sign is w < 0);
  // -0.5 -> 9, 0.1 -> 0, 1.25 -> 1.0, 1.75 -> 2, 5.5 -> 6, -2 -> 0xC, 0.5 -> 1, 0 -> 0.
  const uint8_t want[8] = {0xF3, 0x20, 0x64, 0x06, 0x09, 0x42, 0xC7, 0x01};
  const uint8_t* p = q.packed.data<uint8_t>();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(p[i], want[i]) << "byte " << i;
  for (int i = 8; i < 16; ++i) EXPECT_EQ(p[i], 0) << "byte " << i;
  EXPECT_EQ(p[16], 0x57);  // 0.75 / 0.125 = 6 -> 7, 0.375 / 0.125 = 3 -> 5
  // Dequantized: e2m1 value * scale * global.
  Tensor d = ops::nvfp4_dequantize(q);
  const float want_d[16] = {3, -12, 0, 2, 4, 8, 8, 0, -1, 0, 2, 4, 12, -4, 1, 0};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(d.data<float>()[i], want_d[i]) << i;
  EXPECT_EQ(d.data<float>()[32], 0.75f);
  EXPECT_EQ(d.data<float>()[33], 0.375f);
}

TEST(Nvfp4Quantize, GlobalScaleIsTheDequantDirection) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Tensor w = randn({8, 64}, DType::kBF16, seed, 0.02);
  float amax = 0.f;
  int64_t arg = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const float v = std::fabs(static_cast<float>(testing::get(w, i)));
    if (v > amax) amax = v, arg = i;
  }
  const float g = ops::nvfp4_global_scale_for(w);
  EXPECT_EQ(g, amax / 2688.0f);  // weight_scale_2 = amax / (6 * 448): multiply to dequantize
  ops::Nvfp4Weight q = ops::nvfp4_quantize(w);
  EXPECT_EQ(q.global_scale, g);
  // The block holding amax gets the largest scale, 448 (0x7E), and amax maps to code 7 (6.0).
  EXPECT_EQ(q.scales.data<uint8_t>()[arg / 16], 0x7E);
  const uint8_t byte = q.packed.data<uint8_t>()[arg / 2];
  EXPECT_EQ((arg % 2 ? byte >> 4 : byte & 0xF) & 7, 7);
  EXPECT_EQ(ops::nvfp4_global_scale_for(Tensor::zeros({2, 16}, DType::kBF16)), 1.0f);
  // A strided (transposed) weight quantizes exactly like its contiguous copy.
  Tensor wt = w.clone().transpose(0, 1).clone().transpose(0, 1);  // same values, column-major storage
  ASSERT_EQ(wt.stride(0), 1);
  EXPECT_EQ(ops::nvfp4_global_scale_for(wt), g);
  ops::Nvfp4Weight qt = ops::nvfp4_quantize(wt);
  EXPECT_TRUE(testing::bitwise_equal(qt.packed, q.packed));
  EXPECT_TRUE(testing::bitwise_equal(qt.scales, q.scales));
}

TEST(Nvfp4Quantize, DequantizationErrorWithinHalfAGridStep) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t n = 24, k = 128;
  Tensor w = randn({n, k}, DType::kBF16, seed);
  w.slice(0, 3, 4).zero_();  // an all-zero row: scales 1.0, codes 0
  ops::Nvfp4Weight q = ops::nvfp4_quantize(w);
  Tensor d = ops::nvfp4_dequantize(q);
  // Per element: |w/step| <= 6 * (1 + 2^-4) (the e4m3 scale may round down by half an ulp), and
  // the e2m1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} has half-gaps <= 1, saturation at 6 costs <= 0.375:
  // so |w - deq| <= step with step = e4m3(scale) * global.
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const double step = e4m3_to_f32(q.scales.data<uint8_t>()[r * (k / 16) + c / 16]) * q.global_scale;
      const double err = std::fabs(testing::get(w, r * k + c) - d.data<float>()[r * k + c]);
      ASSERT_LE(err, step * (1 + 1e-6)) << r << "," << c;
    }
  for (int64_t b = 0; b < k / 16; ++b) EXPECT_EQ(q.scales.data<uint8_t>()[3 * (k / 16) + b], 0x38);
  for (int64_t i = 0; i < k / 2; ++i) EXPECT_EQ(q.packed.data<uint8_t>()[3 * (k / 2) + i], 0);
}

TEST(Nvfp4Dequantize, EveryByteAndScaleFollowTheDocumentedFormulaBitForBit) {
  // 256 rows x 32 columns: row r holds byte r in all 16 positions of block 0 and byte 255 - r in
  // block 1; scales cover normal, subnormal, zero and the largest e4m3 codes.
  ops::Nvfp4Weight w;
  w.n = 256;
  w.k = 32;
  w.global_scale = 0.0137f;
  w.packed = Tensor::empty({256, 16}, DType::kFP4E2M1x2);
  w.scales = Tensor::empty({256, 2}, DType::kFP8E4M3);
  const uint8_t scale_codes[] = {0x38, 0x01, 0x00, 0x7E, 0x45, 0x07, 0x50, 0x33};
  for (int r = 0; r < 256; ++r) {
    for (int i = 0; i < 8; ++i) w.packed.data<uint8_t>()[r * 16 + i] = static_cast<uint8_t>(r);
    for (int i = 8; i < 16; ++i) w.packed.data<uint8_t>()[r * 16 + i] = static_cast<uint8_t>(255 - r);
    w.scales.data<uint8_t>()[r * 2] = scale_codes[r % 8];
    w.scales.data<uint8_t>()[r * 2 + 1] = scale_codes[(r / 8) % 8];
  }
  Tensor d = ops::nvfp4_dequantize(w);
  for (int r = 0; r < 256; ++r)
    for (int c = 0; c < 32; ++c) {
      const uint8_t byte = w.packed.data<uint8_t>()[r * 16 + c / 2];
      const uint8_t code = c % 2 ? byte >> 4 : byte & 0xF;
      const float step = e4m3_to_f32(w.scales.data<uint8_t>()[r * 2 + c / 16]) * w.global_scale;
      const float want = e2m1_to_f32(code) * step;
      ASSERT_EQ(f32_bits(d.data<float>()[r * 32 + c]), f32_bits(want)) << r << "," << c;
    }
}

TEST(Nvfp4Gemm, MatchesFp64OnTheDequantizedWeight) {
  for (int64_t m : {1, 5, 19}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "M=" << m << " seed=" << seed);
    const int64_t n = 23, k = 272;
    Tensor x = randn({m, k}, DType::kBF16, seed);
    ops::Nvfp4Weight w = ops::nvfp4_quantize(randn({n, k}, DType::kBF16, seed + 1, 0.05));
    Tensor wf = ops::nvfp4_dequantize(w);
    Tensor bias = randn({n}, DType::kBF16, seed + 2);
    Tensor y = Tensor::empty({m, n}, DType::kBF16);
    y.fill_nan_();
    ops::nvfp4_gemm(x, w, bias, y);
    EXPECT_LT(rel_error(y, testing::ref_gemm(x, wf, bias)), bf16_gemm_tolerance(k));
    Tensor y32 = Tensor::empty({m, n}, DType::kFP32);
    y32.fill_nan_();
    ops::nvfp4_gemm(x, w, Tensor(), y32);
    EXPECT_LT(rel_error(y32, testing::ref_gemm(x, wf, Tensor())), fp32_out_gemm_tolerance(k));
  }
}

TEST(Nvfp4Gemm, RowShardsIntoColumnSlicesAreBitIdentical) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 7, n = 40, k = 96;
  Tensor x = randn({m, k}, DType::kBF16, seed);
  ops::Nvfp4Weight w = ops::nvfp4_quantize(randn({n, k}, DType::kBF16, seed + 1));
  Tensor full = Tensor::empty({m, n}, DType::kBF16);
  ops::nvfp4_gemm(x, w, Tensor(), full);
  Tensor wide = Tensor::empty({m, n + 5}, DType::kBF16);
  wide.fill_nan_();
  Tensor poison = wide.clone();
  cpu::ThreadPool one(1), three(3);
  ops::nvfp4_gemm(x, ops::nvfp4_prepare(ops::nvfp4_rows(w, 0, 32), Device::cpu(), 0), Tensor(), wide.slice(1, 0, 32),
                  Stream::cpu(&one));
  ops::nvfp4_gemm(x, ops::nvfp4_prepare(ops::nvfp4_rows(w, 32, 40), Device::cpu(), 1), Tensor(), wide.slice(1, 32, 40),
                  Stream::cpu(&three));
  EXPECT_TRUE(bitwise_equal(wide.slice(1, 0, n), full));
  EXPECT_TRUE(bitwise_equal(wide.slice(1, n, n + 5), poison.slice(1, n, n + 5)));
}

// Shard p of a fused gate/up weight: [gate rows p; up rows p].
ops::Nvfp4Weight gate_up_shard(const ops::Nvfp4Weight& w, int64_t n0, int64_t n1) {
  const int64_t inter = w.n / 2, rows = n1 - n0;
  ops::Nvfp4Weight s = w;
  s.n = 2 * rows;
  s.packed = Tensor::empty({2 * rows, w.k / 2}, w.packed.dtype());
  s.scales = Tensor::empty({2 * rows, w.k / 16}, w.scales.dtype());
  s.packed.slice(0, 0, rows).copy_(w.packed.slice(0, n0, n1));
  s.packed.slice(0, rows, 2 * rows).copy_(w.packed.slice(0, inter + n0, inter + n1));
  s.scales.slice(0, 0, rows).copy_(w.scales.slice(0, n0, n1));
  s.scales.slice(0, rows, 2 * rows).copy_(w.scales.slice(0, inter + n0, inter + n1));
  return s;
}

TEST(Nvfp4GemmSwiglu, MatchesFp64AndUnfusedAndShards) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const int64_t m = 6, inter = 21, k = 64;
  Tensor x = randn({m, k}, DType::kBF16, seed);
  ops::Nvfp4Weight w = ops::nvfp4_quantize(randn({2 * inter, k}, DType::kBF16, seed + 1, 0.2));
  Tensor y = Tensor::empty({m, inter}, DType::kBF16);
  y.fill_nan_();
  ops::nvfp4_gemm_swiglu(x, w, y);
  std::vector<double> gu = testing::ref_gemm(x, ops::nvfp4_dequantize(w), Tensor()), ref(static_cast<size_t>(m * inter));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < inter; ++c) {
      const double g = gu[i * 2 * inter + c], u = gu[i * 2 * inter + inter + c];
      ref[i * inter + c] = g / (1 + std::exp(-g)) * u;
    }
  EXPECT_LT(rel_error(y, ref), bf16_gemm_tolerance(k));
  Tensor gu32 = Tensor::empty({m, 2 * inter}, DType::kFP32);
  ops::nvfp4_gemm(x, w, Tensor(), gu32);
  Tensor y2 = Tensor::empty({m, inter}, DType::kBF16);
  ops::swiglu(gu32, y2);
  EXPECT_TRUE(bitwise_equal(y, y2));
  Tensor parts = Tensor::empty({m, inter}, DType::kBF16);
  parts.fill_nan_();
  ops::nvfp4_gemm_swiglu(x, gate_up_shard(w, 0, 16), parts.slice(1, 0, 16));
  ops::nvfp4_gemm_swiglu(x, gate_up_shard(w, 16, 21), parts.slice(1, 16, 21));
  EXPECT_TRUE(bitwise_equal(parts, y));
}

TEST(Nvfp4Prepare, CpuKeepsOwnedWeightsAndCopiesViewsIntoTheDomain) {
  ops::Nvfp4Weight w = ops::nvfp4_quantize(randn({64, 32}, DType::kBF16, fresh_seed()));
  ops::Nvfp4Weight same = ops::nvfp4_prepare(w, Device::cpu(), -1);
  EXPECT_EQ(same.packed.storage(), w.packed.storage());
  const int64_t before = memory_stats(Device::cpu(), 5).live_bytes;
  ops::Nvfp4Weight shard = ops::nvfp4_prepare(ops::nvfp4_rows(w, 32, 64), Device::cpu(), 5);
  EXPECT_NE(shard.packed.storage(), w.packed.storage());
  EXPECT_EQ(shard.packed.domain(), 5);
  EXPECT_EQ(shard.n, 32);
  EXPECT_EQ(memory_stats(Device::cpu(), 5).live_bytes - before, 32 * 16 + 32 * 2);
  EXPECT_TRUE(bitwise_equal(shard.packed, w.packed.slice(0, 32, 64)));
  EXPECT_TRUE(bitwise_equal(shard.scales, w.scales.slice(0, 32, 64)));
}

using locus::testing::error_text;

TEST(Nvfp4, RejectsBadInputsNamingThem) {
  EXPECT_NE(error_text([] { ops::nvfp4_quantize(Tensor::zeros({2, 24}, DType::kBF16)); }).find("K=24 is not a multiple"),
            std::string::npos);
  Tensor bad = Tensor::zeros({2, 16}, DType::kFP32);
  bad.data<float>()[17] = NAN;
  EXPECT_NE(error_text([&] { ops::nvfp4_quantize(bad); }).find("w[1, 1] = nan is not finite"), std::string::npos);
  // Rows split over the thread pool: the first non-finite value in row-major order is named, not
  // the first one a thread happens to find.
  Tensor many = Tensor::zeros({20000, 16}, DType::kFP32);
  many.data<float>()[15000 * 16 + 2] = INFINITY;
  many.data<float>()[9000 * 16 + 5] = NAN;
  many.data<float>()[9000 * 16 + 3] = -INFINITY;
  EXPECT_NE(error_text([&] { ops::nvfp4_quantize(many); }).find("w[9000, 3] = -inf is not finite"), std::string::npos);
  EXPECT_NE(error_text([] { ops::nvfp4_quantize(Tensor::zeros({2, 16}, DType::kBF16), 0.f); }).find("global_scale"),
            std::string::npos);
  ops::Nvfp4Weight w = ops::nvfp4_quantize(Tensor::zeros({4, 32}, DType::kBF16));
  Tensor x = Tensor::zeros({2, 48}, DType::kBF16), y = Tensor::empty({2, 4}, DType::kBF16);
  EXPECT_NE(error_text([&] { ops::nvfp4_gemm(x, w, Tensor(), y); }).find("nvfp4_gemm: w has K=32 but x has K=48"),
            std::string::npos);
  EXPECT_NE(error_text([&] { ops::nvfp4_rows(w, 2, 5); }).find("rows [2, 5) out of range"), std::string::npos);
  ops::Nvfp4Weight broken = w;
  broken.scales = Tensor::zeros({4, 3}, DType::kFP8E4M3);
  Tensor x32 = Tensor::zeros({2, 32}, DType::kBF16);
  EXPECT_NE(error_text([&] { ops::nvfp4_gemm(x32, broken, Tensor(), y); }).find("w.scales is [4, 3]"), std::string::npos);
  ops::Nvfp4Weight odd = ops::nvfp4_quantize(Tensor::zeros({3, 32}, DType::kBF16));
  EXPECT_NE(error_text([&] { ops::nvfp4_gemm_swiglu(x32, odd, y); }).find("gate and up rows"), std::string::npos);
#if !defined(LOCUS_WITH_CUDA)
  EXPECT_NE(error_text([&] { ops::nvfp4_prepare(w, Device::cuda(0), 0); }).find("CUDA"), std::string::npos);
#endif
}

}  // namespace
}  // namespace locus
