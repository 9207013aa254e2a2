// DType names and sizes, more Tensor view/copy cases, and the operand-overlap checks ops rely on.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/dtype.h"
#include "core/float_convert.h"
#include "core/tensor.h"
#include "core/tensor_checks.h"

namespace locus {
namespace {

TEST(DType, NamesSizesAndSafetensorsRoundTrip) {
  for (DType t : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3, DType::kFP4E2M1x2, DType::kU8, DType::kI32,
                  DType::kI64}) {
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
    if (t != DType::kFP4E2M1x2) {
      EXPECT_EQ(dtype_from_safetensors(dtype_safetensors_name(t)), t);
    }
  }
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kFP4E2M1x2), 1u);  // one byte holds two e2m1 values
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::kBF16);
  try {
    dtype_from_name("fp12");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'fp12'"), std::string::npos);
  }
  EXPECT_THROW(dtype_from_safetensors("F64"), Error);
}

TEST(Tensor, TransposeSelectUnsqueezeAndStridedCopy) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::kFP32);
  for (int i = 0; i < 24; ++i) t.data<float>()[i] = static_cast<float>(i);
  Tensor tt = t.transpose(0, 2);  // [4, 3, 2]
  EXPECT_EQ(tt.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(tt.strides(), (Shape{1, 4, 12}));
  Tensor c = tt.clone();
  EXPECT_TRUE(c.is_contiguous());
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 3; ++b)
      for (int d = 0; d < 2; ++d) EXPECT_EQ(c.data<float>()[(a * 3 + b) * 2 + d], static_cast<float>(d * 12 + b * 4 + a));
  Tensor s = t.select(1, 2);  // [2, 4]
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.data<float>()[0], 8.f);
  EXPECT_EQ(s.unsqueeze(0).shape(), (Shape{1, 2, 4}));
  EXPECT_EQ(t.view({6, -1}).shape(), (Shape{6, 4}));
  EXPECT_THROW(tt.view({24}), Error);  // not contiguous
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.slice(2, 3, 5), Error);
  // Strided destination from a strided source.
  Tensor dst = Tensor::zeros({4, 3, 2}, DType::kFP32);
  dst.transpose(0, 2).copy_(t);
  EXPECT_TRUE(std::memcmp(dst.data_ptr(), c.data_ptr(), c.nbytes()) == 0);
  EXPECT_THROW(dst.copy_(t), Error);  // shape mismatch
}

TEST(Tensor, FillNanUsesEachFormatsPoison) {
  Tensor b = Tensor::empty({3}, DType::kBF16), h = Tensor::empty({3}, DType::kFP16);
  Tensor e = Tensor::empty({3}, DType::kFP8E4M3), u = Tensor::empty({3}, DType::kU8);
  for (Tensor* t : {&b, &h, &e, &u}) t->fill_nan_();
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(b.data<uint16_t>()[2])));
  EXPECT_TRUE(std::isnan(f16_bits_to_f32(h.data<uint16_t>()[2])));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(e.data<uint8_t>()[2])));
  EXPECT_EQ(u.data<uint8_t>()[2], 0xFF);
}

TEST(TensorChecks, OverlapIsDetectedOnlyWhereBytesAreShared) {
  Tensor buf = Tensor::empty({4, 10}, DType::kBF16);
  // Column slices of one buffer: their byte ranges interleave, their columns do not.
  EXPECT_FALSE(checks::may_overlap(buf.slice(1, 0, 5), buf.slice(1, 5, 10)));
  EXPECT_TRUE(checks::may_overlap(buf.slice(1, 0, 6), buf.slice(1, 5, 10)));
  EXPECT_FALSE(checks::may_overlap(buf.slice(1, 2, 4).slice(0, 1, 3), buf.slice(1, 4, 10)));
  // A transposed view (rows 2-3 of sq) does meet columns 0-1 of sq.
  Tensor sq = Tensor::empty({4, 4}, DType::kBF16);
  EXPECT_TRUE(checks::may_overlap(sq.slice(1, 0, 2), sq.transpose(0, 1).slice(1, 2, 4)));
  EXPECT_FALSE(checks::may_overlap(buf.slice(0, 0, 2), buf.slice(0, 2, 4)));
  EXPECT_FALSE(checks::may_overlap(buf, Tensor::empty({4, 10}, DType::kBF16)));
  EXPECT_FALSE(checks::may_overlap(buf, Tensor()));
  try {
    checks::dtype("op", "w", buf, {DType::kFP32, DType::kFP16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "op: w must be fp32 or fp16, got bf16[4, 10] on cpu:0");
  }
}

}  // namespace
}  // namespace locus
