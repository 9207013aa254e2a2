// Helpers for the GPU tests: skip without a device, fp64 references, random NVFP4 weights.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cuda/cta_trace.h"
#include "backends/cuda/cuda_attention.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/stream_gemm.h"
#include "ops/nvfp4.h"
#include "test_util.h"

#define LOCUS_REQUIRE_GPU()                                                       \
  do {                                                                            \
    if (!::locus::cuda::device_available()) GTEST_SKIP() << "no CUDA device";     \
  } while (0)

namespace locus::testing {

// An attention setting (a cuda::set_attention_* function) at `value` while it lives, then its
// default again.
template <void (*Set)(int64_t)>
class ScopedAttentionSetting {
 public:
  explicit ScopedAttentionSetting(int64_t value) { Set(value); }
  ~ScopedAttentionSetting() { Set(-1); }
  ScopedAttentionSetting(const ScopedAttentionSetting&) = delete;
  ScopedAttentionSetting& operator=(const ScopedAttentionSetting&) = delete;
};
// Decode attention on the CUDA-core decode kernel up to the given keys (0: the tensor-core kernel
// for all).
using DecodeAttentionKeys = ScopedAttentionSetting<cuda::set_attention_decode_max_keys>;
// The decode kernel's key splits at least the given keys long.
using DecodeAttentionSplitKeys = ScopedAttentionSetting<cuda::set_attention_decode_split_keys>;
// The decode kernel's splits merged by its own last CTAs (1) or by the combine kernel (0).
using DecodeAttentionFusedCombine = ScopedAttentionSetting<cuda::set_attention_decode_fused_combine>;
// Both kernels of decode attention, for tests that run each: the tensor-core one, then the
// decode kernel at any key count (its key splits included).
constexpr int64_t kTensorCoreAttention = 0, kDecodeKernelAttention = int64_t{1} << 40;

inline Tensor to_gpu(const Tensor& t) { return t.to(Device::cuda(0)); }

// A poisoned device tensor (every element NaN) so that unwritten outputs fail rel_error.
inline Tensor poisoned_gpu(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype, Device::cuda(0));
  t.fill_nan_();
  return t;
}

// Copies a device result back after waiting for every stream.
inline Tensor fetch(const Tensor& t) {
  cuda::device_synchronize(0);
  return t.to(Device::cpu());
}

// SwiGLU over a [M, 2I] fp64 gate/up product.
inline std::vector<double> ref_swiglu(const std::vector<double>& gu, int64_t M, int64_t I) {
  std::vector<double> out(static_cast<size_t>(M * I));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) out[m * I + i] = silu(gu[m * 2 * I + i]) * gu[m * 2 * I + I + i];
  return out;
}

// A random kLinear NVFP4 weight: random codes, block scales spread over e4m3's range (a few
// zero and subnormal blocks included), a random global scale.
inline ops::Nvfp4Weight random_nvfp4(int64_t n, int64_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ops::Nvfp4Weight w = ops::nvfp4_empty(n, k, 1.f);
  auto* q = w.packed.data<uint8_t>();
  for (int64_t i = 0; i < n * k / 2; ++i) q[i] = static_cast<uint8_t>(rng() & 0xFF);
  auto* s = w.scales.data<uint8_t>();
  std::uniform_real_distribution<double> logu(-4.0, 3.0);
  for (int64_t i = 0; i < n * k / 16; ++i) {
    const uint64_t r = rng() % 64;
    if (r == 0) s[i] = 0;                                   // zero block
    else if (r == 1) s[i] = static_cast<uint8_t>(1 + rng() % 7);  // subnormal e4m3
    else s[i] = f32_to_e4m3(static_cast<float>(std::exp2(logu(rng))));
  }
  w.global_scale = static_cast<float>(std::exp2(-6.0 + (rng() % 1000) / 500.0));
  return w;
}

// Dequantized rows of a kLinear weight, fp64 [N, K].
inline std::vector<double> dequant_ref(const ops::Nvfp4Weight& w) {
  std::vector<double> out(static_cast<size_t>(w.n * w.k));
  const auto* q = w.packed.data<uint8_t>();
  const auto* s = w.scales.data<uint8_t>();
  for (int64_t n = 0; n < w.n; ++n)
    for (int64_t k = 0; k < w.k; ++k) {
      const uint8_t byte = q[n * (w.k / 2) + k / 2];
      const uint8_t code = k % 2 == 0 ? (byte & 0xF) : (byte >> 4);
      out[n * w.k + k] = static_cast<double>(e2m1_to_f32(code)) * e4m3_to_f32(s[n * (w.k / 16) + k / 16]) *
                         static_cast<double>(w.global_scale);
    }
  return out;
}

// Streaming-GEMM arguments (backends/cuda/stream_gemm.h) for x [M, K] (bf16, contiguous, on the
// GPU) times two weight parts over two domains into y [M, N] (contiguous): part 0 gives columns
// [0, n0), part 1 [n0, N); `sm_domain` as StreamGemmArgs::sm_domain. The parts' weights are the
// caller's to fill.
inline cuda::detail::StreamGemmArgs two_domain_args(cuda::detail::StreamWeight format, const Tensor& x, const Tensor& y,
                                                    int64_t n0, const uint8_t* sm_domain) {
  cuda::detail::StreamGemmArgs a = cuda::detail::stream_gemm_args(format, x, y, false, Tensor());
  a.num_parts = 2;
  a.num_domains = 2;
  a.sm_domain = sm_domain;
  for (int p = 0; p < 2; ++p) {
    a.parts[p].rows = static_cast<int32_t>(p ? y.size(1) - n0 : n0);
    a.parts[p].y_offset = p ? n0 : 0;
    a.parts[p].domain = p;
  }
  return a;
}

// fp64 SwiGLU outputs [M, I] of x through two fused NVFP4 gate/up shards (each its gate rows,
// then the matching up rows): s0 gives columns [0, i0), s1 columns [i0, I).
inline std::vector<double> ref_swiglu_two_shards(const Tensor& x, const ops::Nvfp4Weight& s0,
                                                 const ops::Nvfp4Weight& s1, int64_t i0, int64_t I) {
  const int64_t M = x.size(0);
  const auto r0 = ref_swiglu(ref_gemm_dense(x, dequant_ref(s0), 2 * i0), M, i0);
  const auto r1 = ref_swiglu(ref_gemm_dense(x, dequant_ref(s1), 2 * (I - i0)), M, I - i0);
  std::vector<double> ref(static_cast<size_t>(M * I));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < I; ++i) ref[m * I + i] = i < i0 ? r0[m * i0 + i] : r1[m * (I - i0) + i - i0];
  return ref;
}

// fp64 reference of y[h] = a[h] w[h]^T for a [H, M, K] and per-head weights w [H, N, K] (CPU).
inline std::vector<double> ref_bmm_nk(const Tensor& a, const Tensor& w) {
  const int64_t H = a.size(0), M = a.size(1), N = w.size(1);
  std::vector<double> out(static_cast<size_t>(H * M * N));
  for (int64_t h = 0; h < H; ++h) {
    const auto r = ref_gemm(a.select(0, h).clone(), w.select(0, h).clone());
    std::copy(r.begin(), r.end(), out.begin() + h * M * N);
  }
  return out;
}

// A zeroed device buffer for a kernel's CTA timeline (backends/cuda/cta_trace.h): `records`
// records of `words` words.
class TraceRecords {
 public:
  TraceRecords(int records, int words) : words_(words) {
    trace_.records = records;
    const size_t bytes = (cuda::detail::kCtaTraceHeader + size_t(records) * words) * sizeof(unsigned long long);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&trace_.buf), bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(trace_.buf, 0, bytes), cudaSuccess);
  }
  ~TraceRecords() { cudaFree(trace_.buf); }
  TraceRecords(const TraceRecords&) = delete;
  TraceRecords& operator=(const TraceRecords&) = delete;
  const cuda::detail::CtaTrace& trace() const { return trace_; }
  // The records of the CTAs started so far (at most `records`), after the device is idle.
  std::vector<std::vector<unsigned long long>> read() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return cuda::detail::read_cta_trace(trace_, words_);
  }

 private:
  cuda::detail::CtaTrace trace_;
  int words_;
};

// The GPU and a caller stream of the test's own (caller_), destroyed however the test ends.
class CudaCallerStream : public ::testing::Test {
 protected:
  void SetUp() override {
    LOCUS_REQUIRE_GPU();
    ASSERT_EQ(cudaStreamCreateWithFlags(&caller_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (caller_) cudaStreamDestroy(caller_);
  }
  Stream caller() const { return Stream{Device::cuda(0), caller_}; }
  cudaStream_t caller_ = nullptr;
};

// Two emulated locality domains (green-context SM partitions, backfill split) and a caller
// stream, for the tests of single-launch partitioned kernels.
class CudaTwoDomains : public CudaCallerStream {
 protected:
  void SetUp() override {
    CudaCallerStream::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    parts_ = cuda::create_sm_partitions(0, 2, cuda::SplitMode::kBackfill);
  }
  void TearDown() override {
    CudaCallerStream::TearDown();
    cuda::destroy_sm_partitions(parts_);
  }
  std::vector<cuda::SmPartition> parts_;
};

}  // namespace locus::testing
