// Shared helpers for the test suites: seeded random tensors, fp64 references, relative error,
// and the BF16 tolerance rule. Header-only so every test binary can use it.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/device_hooks.h"
#include "core/error.h"
#include "core/float_convert.h"
#include "core/tensor.h"

namespace locus::testing {

#if defined(LOCUS_BINARY_PATH)
// The `locus` executable the CLI tests start: $LOCUS_BIN when set (on the GPU machine the binaries
// run from a copy, not from the build tree), else the build's path compiled in.
inline std::string locus_binary() {
  const char* env = std::getenv("LOCUS_BIN");
  return env && *env ? std::string(env) : std::string(LOCUS_BINARY_PATH);
}
#endif

// A fresh seed per call so inputs differ between runs of a test unless LOCUS_TEST_SEED is set;
// the seed is printed on failure through the returned value (log it with SCOPED_TRACE).
// The message of the locus::Error that fn throws, or "(no error)".
inline std::string error_text(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline uint64_t fresh_seed() {
  static uint64_t base = [] {
    if (const char* s = std::getenv("LOCUS_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(s, nullptr, 10));
    return static_cast<uint64_t>(std::random_device{}()) << 32 | std::random_device{}();
  }();
  static uint64_t counter = 0;
  return base + 0x9E3779B97F4A7C15ull * ++counter;
}

// Every allocation on every backend is filled with NaN bytes while this lives
// (set_poison_allocations): outputs an op leaves unwritten fail rel_error, also deep inside a
// model where the test cannot poison the buffers itself.
class ScopedPoisonedAllocations {
 public:
  ScopedPoisonedAllocations() { set_poison_allocations(true); }
  ~ScopedPoisonedAllocations() { set_poison_allocations(false); }
  ScopedPoisonedAllocations(const ScopedPoisonedAllocations&) = delete;
  ScopedPoisonedAllocations& operator=(const ScopedPoisonedAllocations&) = delete;
};

// Element read/write as double for the float dtypes (CPU tensors, any strides).
inline double get(const Tensor& t, int64_t flat_index_in_shape) {
  int64_t off = 0, rem = flat_index_in_shape;
  for (int d = t.dim() - 1; d >= 0; --d) {
    off += (rem % t.size(d)) * t.stride(d);
    rem /= t.size(d);
  }
  switch (t.dtype()) {
    case DType::kFP32: return t.data<float>()[off];
    case DType::kBF16: return bf16_bits_to_f32(t.data<uint16_t>()[off]);
    case DType::kFP16: return f16_bits_to_f32(t.data<uint16_t>()[off]);
    default: ADD_FAILURE() << "get(): unsupported dtype"; return 0;
  }
}

inline void set(const Tensor& t, int64_t flat_index_in_shape, double v) {
  int64_t off = 0, rem = flat_index_in_shape;
  for (int d = t.dim() - 1; d >= 0; --d) {
    off += (rem % t.size(d)) * t.stride(d);
    rem /= t.size(d);
  }
  switch (t.dtype()) {
    case DType::kFP32: t.data<float>()[off] = static_cast<float>(v); break;
    case DType::kBF16: t.data<uint16_t>()[off] = f32_to_bf16_bits(static_cast<float>(v)); break;
    case DType::kFP16: t.data<uint16_t>()[off] = f32_to_f16_bits(static_cast<float>(v)); break;
    default: ADD_FAILURE() << "set(): unsupported dtype";
  }
}

// Normal(0, stddev) values in a new CPU tensor of the given float dtype.
inline Tensor randn(const Shape& shape, DType dtype, uint64_t seed, double stddev = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) set(t, i, dist(rng));
  return t;
}

// All elements as doubles (row-major logical order).
inline std::vector<double> to_doubles(const Tensor& t) {
  Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<double> v(static_cast<size_t>(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) v[i] = get(c, i);
  return v;
}

// ||out - ref|| / ||ref||; NaN anywhere in out gives +inf so unwritten (poisoned) outputs fail.
inline double rel_error(const std::vector<double>& out, const std::vector<double>& ref) {
  EXPECT_EQ(out.size(), ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
inline double rel_error(const Tensor& out, const std::vector<double>& ref) { return rel_error(to_doubles(out), ref); }

// Round-to-nearest into bf16 (8 significant bits) changes a value by at most its unit roundoff
// 2^-8 relative, so the normwise error ||round(y) - y|| / ||y|| of a bf16 output is below 2^-8.
inline constexpr double kBf16RoundingBound = 0x1p-8;  // 3.906e-3

// Relative-error bound for a BF16 product with reduction length K and fp32 accumulation:
// - the final rounding of the bf16 output: < 2^-8 (above), covered by 4e-3;
// - the fp32 accumulation: bf16 x bf16 products are exact in fp32 (16 significant bits), each of
//   the K additions errs by at most 2^-24 of its partial sum, and for random-signed inputs these
//   errors add like a random walk, so the normwise error is about 2^-24 sqrt(K) (6e-8 sqrt(K));
//   2e-6 sqrt(K) leaves a 30x margin for other summation orders (split-K, tensor-core adders).
// The reference must be computed in double on the same bf16 inputs (they carry no input error).
inline double bf16_gemm_tolerance(int64_t k) { return 4e-3 + 2e-6 * std::sqrt(static_cast<double>(k)); }
// Output rounded to fp32 instead: 2^-24 for the output plus the accumulation term, with the same
// generous factor on the random-walk estimate.
inline double fp32_out_gemm_tolerance(int64_t k) { return 1e-5 * std::sqrt(static_cast<double>(k)) + 1e-6; }

// ref[m, n] = sum_k x[m,k] w[n,k] (+ bias[n]) in fp64; w given as doubles, [n, K] row-major
// (e.g. a dequantized NVFP4 weight).
inline std::vector<double> ref_gemm_dense(const Tensor& x, const std::vector<double>& w, int64_t n,
                                          const Tensor& bias = {}) {
  const int64_t M = x.size(0), K = x.size(1);
  const std::vector<double> xv = to_doubles(x);
  const std::vector<double> bv = bias.defined() ? to_doubles(bias) : std::vector<double>(static_cast<size_t>(n), 0.0);
  std::vector<double> out(static_cast<size_t>(M * n));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < n; ++j) {
      double acc = bv[j];
      for (int64_t k = 0; k < K; ++k) acc += xv[m * K + k] * w[j * K + k];
      out[m * n + j] = acc;
    }
  return out;
}
// The same from a weight tensor [N, K] (its stored, rounded values).
inline std::vector<double> ref_gemm(const Tensor& x, const Tensor& w, const Tensor& bias = {}) {
  return ref_gemm_dense(x, to_doubles(w), w.size(0), bias);
}

inline double silu(double g) { return g / (1.0 + std::exp(-g)); }

// Bit-exact comparison of two CPU tensors of the same shape and dtype (any strides).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.device().is_cpu() ? a.clone() : a.to(Device::cpu());
  Tensor cb = b.device().is_cpu() ? b.clone() : b.to(Device::cpu());
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

}  // namespace locus::testing
