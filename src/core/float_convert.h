// Exact scalar conversions between fp32 and the narrow formats Locus stores: bf16, fp16,
// fp8 e4m3 (the "fn" variant: no inf, max 448, NaN = 0x7F/0xFF) and fp4 e2m1.
// All narrowing conversions round to nearest, ties to even. Usable in CUDA device code.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LOCUS_HD __host__ __device__ __forceinline__
#else
#define LOCUS_HD inline
#endif

namespace locus {

LOCUS_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
LOCUS_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// ---- bf16: the top 16 bits of an fp32 ----
LOCUS_HD uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;  // round to nearest even; overflow rounds into inf as IEEE requires
  return static_cast<uint16_t>(u >> 16);
}
LOCUS_HD float bf16_bits_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// ---- fp16 (IEEE binary16) ----
LOCUS_HD uint16_t f32_to_f16_bits(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520 -> inf
  if (a < 0x38800000u) {  // result is subnormal or zero: value = m * 2^-24
    // Scale into an integer count of 2^-24 units with round-to-nearest-even.
    if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0 (2^-25 ties to 0)
    uint32_t exp = a >> 23;            // biased fp32 exponent
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - exp;        // so that result = mant >> (shift) in 2^-24 units (shift in 14..24)
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // normal: rebias exponent 127 -> 15, round mantissa 23 -> 10 bits
  uint32_t r = a - 0x38000000u;  // exponent rebias (112 << 23)
  uint32_t lsb = (r >> 13) & 1u;
  r += 0xFFFu + lsb;
  return static_cast<uint16_t>(sign | (r >> 13));
}
LOCUS_HD float f16_bits_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    // subnormal: mant * 2^-24, exact in fp32
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// ---- fp8 e4m3 (fn): bias 7, 3 mantissa bits, max 448, no inf ----
LOCUS_HD float e4m3_to_f32(uint8_t b) {
  uint32_t sign = (b & 0x80u) ? 0x80000000u : 0u;
  uint32_t exp = (b >> 3) & 0xFu;
  uint32_t mant = b & 0x7u;
  if (exp == 0xF && mant == 0x7) return f32_from_bits(sign | 0x7FC00000u);  // NaN
  if (exp == 0) {
    float v = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 120u) << 23) | (mant << 20));
}

// Round-to-nearest-even into e4m3. Magnitudes that round above 448 saturate to 448 when
// `saturate` is true (what ModelOpt's scale cast relies on) and become NaN otherwise.
LOCUS_HD uint8_t f32_to_e4m3(float f, bool saturate = true) {
  uint32_t u = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7F);
  // 464 is the midpoint between 448 and the (nonexistent) 480; it ties to even (448), above overflows.
  if (a > 0x43E80000u) return static_cast<uint8_t>(sign | (saturate ? 0x7E : 0x7F));
  if (a < 0x3C800000u) {  // below 2^-6: subnormal range, units of 2^-9
    if (a <= 0x3A800000u) return sign;  // <= 2^-10 (half of the smallest subnormal) ties to 0
    uint32_t exp = a >> 23;
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 141 - exp;  // value / 2^-9 = mant * 2^(exp-127-23+9)
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);  // q == 8 correctly becomes the smallest normal
  }
  uint32_t r = a - (120u << 23);
  uint32_t lsb = (r >> 20) & 1u;
  r += 0x7FFFFu + lsb;
  return static_cast<uint8_t>(sign | (r >> 20));
}

// ---- fp4 e2m1: codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 is the sign ----
LOCUS_HD float e2m1_to_f32(uint8_t code) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  float v = mag[code & 7u];
  return (code & 8u) ? -v : v;
}

// Round to nearest even, saturating at 6; NaN maps to +0 (e2m1 has no NaN).
LOCUS_HD uint8_t f32_to_e2m1(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = (u >> 31) ? 8 : 0;
  float a = f32_from_bits(u & 0x7FFFFFFFu);
  if (!(a == a)) return 0;
  uint8_t q;
  // Ties go to the even code: 0.25->0, 0.75->1.0(code 2), 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0, 5->4.0
  if (a <= 0.25f) q = 0;
  else if (a < 0.75f) q = 1;
  else if (a <= 1.25f) q = 2;
  else if (a < 1.75f) q = 3;
  else if (a <= 2.5f) q = 4;
  else if (a < 3.5f) q = 5;
  else if (a <= 5.f) q = 6;
  else q = 7;
  return static_cast<uint8_t>(sign | q);
}

// A bf16 value type for host code and containers (storage only; arithmetic goes through float).
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  LOCUS_HD explicit bf16(float f) : bits(f32_to_bf16_bits(f)) {}
  LOCUS_HD static bf16 from_bits(uint16_t b) { bf16 h; h.bits = b; return h; }
  LOCUS_HD operator float() const { return bf16_bits_to_f32(bits); }
};
static_assert(sizeof(bf16) == 2, "bf16 must be 2 bytes");

}  // namespace locus
