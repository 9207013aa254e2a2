// Exhaustive checks of the narrow-format conversions against independent references computed
// in double: every e2m1, e4m3, bf16 and fp16 code, and round-to-nearest-even at every midpoint.
#include "core/float_convert.h"

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <limits>
#include <random>

#include "test_util.h"

namespace locus {
namespace {

// Value of a binary format code with `mant_bits` stored mantissa bits and exponent bias `bias`.
double decode_ieee_like(uint32_t code, int exp_bits, int mant_bits, int bias) {
  const uint32_t sign = code >> (exp_bits + mant_bits);
  const uint32_t exp = (code >> mant_bits) & ((1u << exp_bits) - 1);
  const uint32_t mant = code & ((1u << mant_bits) - 1);
  const double v = exp == 0 ? std::ldexp(static_cast<double>(mant), 1 - bias - mant_bits)
                            : std::ldexp(static_cast<double>(mant | (1u << mant_bits)), static_cast<int>(exp) - bias - mant_bits);
  return sign ? -v : v;
}

// Round-to-nearest-even of x to a format with p significand bits, minimum normal exponent emin
// and largest finite value max_finite; values that round above max_finite become inf.
double rne_reference(double x, int p, int emin, double max_finite) {
  if (x == 0 || std::isinf(x) || std::isnan(x)) return x;
  int e;
  std::frexp(x, &e);  // x = f * 2^e, 0.5 <= |f| < 1: unit in the last place is 2^(e - p)
  const int q = std::max(e - p, emin - p + 1);  // subnormals share the smallest quantum
  const double scaled = std::ldexp(x, -q);       // exact: a power-of-two scaling
  const double r = std::ldexp(std::nearbyint(scaled), q);  // nearbyint: ties to even (default mode)
  if (std::fabs(r) > max_finite) return std::copysign(INFINITY, x);
  return r;
}

TEST(FloatConvert, E2m1EveryCode) {
  const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (uint8_t c = 0; c < 16; ++c) {
    const float v = e2m1_to_f32(c);
    EXPECT_EQ(std::fabs(v), mags[c & 7]) << int(c);
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << int(c);
    EXPECT_EQ(f32_to_e2m1(v), c) << int(c);
  }
}

TEST(FloatConvert, E2m1RoundsToNearestEvenAndSaturates) {
  // Every midpoint between neighbouring magnitudes goes to the even code; just off it, to the nearer one.
  const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int c = 0; c < 7; ++c) {
    const float mid = (mags[c] + mags[c + 1]) / 2;
    const int even = (c % 2 == 0) ? c : c + 1;
    for (float s : {1.f, -1.f}) {
      const uint8_t sign = s < 0 ? 8 : 0;
      EXPECT_EQ(f32_to_e2m1(s * mid), sign | even) << mid;
      EXPECT_EQ(f32_to_e2m1(s * std::nextafter(mid, 0.f)), sign | c) << mid;
      EXPECT_EQ(f32_to_e2m1(s * std::nextafter(mid, 100.f)), sign | (c + 1)) << mid;
    }
  }
  EXPECT_EQ(f32_to_e2m1(7.f), 7);
  EXPECT_EQ(f32_to_e2m1(1e30f), 7);
  EXPECT_EQ(f32_to_e2m1(INFINITY), 7);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 15);
  EXPECT_EQ(f32_to_e2m1(NAN), 0);
}

TEST(FloatConvert, E4m3EveryCodeDecodesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {  // the only NaN encodings of e4m3fn
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(f32_to_e4m3(v) & 0x7F, 0x7F) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), decode_ieee_like(static_cast<uint32_t>(c), 4, 3, 7)) << c;
    EXPECT_EQ(f32_to_e4m3(v), c) << c;
    EXPECT_EQ(f32_to_e4m3(v, false), c) << c;
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.f, -9));
}

TEST(FloatConvert, E4m3RoundsToNearestEvenAtEveryMidpoint) {
  // Positive codes 0..0x7E in increasing order; between each pair test the midpoint and its neighbours.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_f32(static_cast<uint8_t>(c)), hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact in fp32
    const int even = (c % 2 == 0) ? c : c + 1;
    for (int neg = 0; neg < 2; ++neg) {
      const float s = neg ? -1.f : 1.f;
      const int sign = neg ? 0x80 : 0;
      EXPECT_EQ(f32_to_e4m3(s * mid), sign | even) << "mid " << mid;
      EXPECT_EQ(f32_to_e4m3(s * std::nextafter(mid, 0.f)), sign | c) << "below " << mid;
      EXPECT_EQ(f32_to_e4m3(s * std::nextafter(mid, 1e9f)), sign | (c + 1)) << "above " << mid;
    }
  }
  // Subnormal edge: half the smallest subnormal ties to zero.
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.f, -10)), 0);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(std::ldexp(1.f, -10), 1.f)), 1);
  EXPECT_EQ(f32_to_e4m3(-std::ldexp(1.f, -10)), 0x80);
  EXPECT_EQ(f32_to_e4m3(1e-30f), 0);
  // Saturation: 464 is the midpoint of 448 and the missing 480 and ties to 448; above it overflows.
  EXPECT_EQ(f32_to_e4m3(464.f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(464.f, 1e9f)), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::nextafter(464.f, 1e9f), false), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(f32_to_e4m3(INFINITY, false), 0x7F);
  EXPECT_EQ(f32_to_e4m3(NAN) & 0x7F, 0x7F);
}

TEST(FloatConvert, Bf16EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = bf16_bits_to_f32(h);
    EXPECT_EQ(f32_bits(f), b << 16);
    if (std::isnan(f)) {
      const uint16_t back = f32_to_bf16_bits(f);
      ASSERT_TRUE(std::isnan(bf16_bits_to_f32(back))) << b;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << b;
    } else {
      ASSERT_EQ(f32_to_bf16_bits(f), h) << b;
    }
  }
}

TEST(FloatConvert, Fp16EveryPatternDecodesAndRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = f16_bits_to_f32(h);
    const uint32_t exp = (b >> 10) & 0x1F;
    if (exp == 0x1F) {
      if (b & 0x3FF) {
        ASSERT_TRUE(std::isnan(f)) << b;
        ASSERT_TRUE(std::isnan(f16_bits_to_f32(f32_to_f16_bits(f)))) << b;
      } else {
        ASSERT_TRUE(std::isinf(f)) << b;
        ASSERT_EQ(f32_to_f16_bits(f), h) << b;
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), decode_ieee_like(b, 5, 10, 15)) << b;
    ASSERT_EQ(f32_to_f16_bits(f), h) << b;
  }
}

// Compares the conversions with the double-precision RNE reference on one fp32 value.
void expect_rne(float x) {
  const double rb = rne_reference(x, 8, -126, 0x1.FEp127);
  const double rh = rne_reference(x, 11, -14, 65504.0);
  const float gb = bf16_bits_to_f32(f32_to_bf16_bits(x));
  const float gh = f16_bits_to_f32(f32_to_f16_bits(x));
  ASSERT_EQ(static_cast<double>(gb), rb) << "bf16 of " << std::hexfloat << x;
  ASSERT_EQ(std::signbit(gb), std::signbit(x)) << std::hexfloat << x;
  ASSERT_EQ(static_cast<double>(gh), rh) << "fp16 of " << std::hexfloat << x;
  ASSERT_EQ(std::signbit(gh), std::signbit(x)) << std::hexfloat << x;
}

TEST(FloatConvert, Bf16AndFp16RoundToNearestEvenLikeTheDoubleReference) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  // Every exact midpoint between neighbouring bf16 values (ties), and its two fp32 neighbours.
  for (uint32_t b = 0; b < 0x7F80; ++b) {
    const float mid = f32_from_bits((b << 16) | 0x8000u);
    for (float v : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) {
      expect_rne(v);
      expect_rne(-v);
    }
  }
  // Every midpoint between neighbouring finite fp16 values, including subnormals and the overflow edge.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = decode_ieee_like(h, 5, 10, 15);
    const double hi = h + 1 < 0x7C00 ? decode_ieee_like(h + 1, 5, 10, 15) : 65536.0;
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: needs 12 significant bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    for (float v : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) {
      expect_rne(v);
      expect_rne(-v);
    }
  }
  // Random fp32 bit patterns across the whole range.
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < 200000; ++i) {
    const float v = f32_from_bits(rng());
    if (!std::isnan(v)) expect_rne(v);
  }
  expect_rne(std::numeric_limits<float>::denorm_min());
  expect_rne(std::numeric_limits<float>::max());
}

}  // namespace
}  // namespace locus
