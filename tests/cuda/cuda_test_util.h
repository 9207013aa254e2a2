// Helpers for the GPU tests: skip without a device, fp64 references, random NVFP4 weights.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "backends/cuda/cta_trace.h"
#include "backends/cuda/cuda_attention.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/nvfp4_gemv.h"
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

// How the NVFP4 ops at decode M run while it lives: as timed (the faster of the streaming kernel
// and the matrix-vector kernel), the streaming kernel alone, or the matrix-vector kernel alone (in
// a forced block shape, or its own where the shape is {0, 0}).
enum class Nvfp4Path { kTimed, kStreaming, kMatrixVector };
class ScopedNvfp4Path {
 public:
  explicit ScopedNvfp4Path(Nvfp4Path path, cuda::detail::Nvfp4GemvShape shape = {0, 0}) {
    cuda::set_nvfp4_gemv_enabled(path != Nvfp4Path::kStreaming);
    cuda::detail::set_nvfp4_gemv_always(path == Nvfp4Path::kMatrixVector);
    cuda::detail::set_nvfp4_gemv_shape(shape);
  }
  ~ScopedNvfp4Path() {
    cuda::set_nvfp4_gemv_enabled(true);
    cuda::detail::set_nvfp4_gemv_always(false);
    cuda::detail::set_nvfp4_gemv_shape({0, 0});
  }
  ScopedNvfp4Path(const ScopedNvfp4Path&) = delete;
  ScopedNvfp4Path& operator=(const ScopedNvfp4Path&) = delete;
};
inline const char* nvfp4_path_name(Nvfp4Path p) {
  return p == Nvfp4Path::kTimed ? "as timed" : p == Nvfp4Path::kStreaming ? "streaming kernel" : "matrix-vector kernel";
}

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

// The columns of `out` outside [left, left + n) are all NaN (the poison a kernel must not touch).
inline void expect_columns_around_poisoned(const Tensor& out, int64_t left, int64_t n) {
  for (const double v : to_doubles(out.slice(1, 0, left).clone())) EXPECT_TRUE(std::isnan(v));
  for (const double v : to_doubles(out.slice(1, left + n, out.size(1)).clone())) EXPECT_TRUE(std::isnan(v));
}

// Two calls, then three replays of a graph of one, each into `y` poisoned first: every one writes
// `expected` bitwise.
inline void expect_same_bits_on_every_run(Tensor& y, const Tensor& expected,
                                          const std::function<void(cudaStream_t)>& launch, cudaStream_t stream) {
  cuda::Graph g;
  g.begin_capture(stream);
  launch(stream);
  g.end_capture();
  for (int run = 0; run < 5; ++run) {
    y.fill_nan_();
    if (run < 2) launch(stream);
    else g.replay(stream);
    EXPECT_TRUE(bitwise_equal(fetch(y), expected)) << (run < 2 ? "call " : "replay ") << (run < 2 ? run : run - 2);
  }
}

// A kernel writing columns [left, left + n) of the poisoned `y`: `launch` on `stream` matches
// `ref` within `tol` there and leaves the other columns NaN; two more calls and three replays of
// a graph of it, each into a poisoned `y`, give the same bits. Returns the first result.
inline Tensor expect_slice_and_repeats(Tensor& y, int64_t left, int64_t n, const std::vector<double>& ref, double tol,
                                       const std::function<void(cudaStream_t)>& launch, cudaStream_t stream) {
  y.fill_nan_();
  launch(stream);
  const Tensor first = fetch(y);
  EXPECT_LT(rel_error(first.slice(1, left, left + n).clone(), ref), tol);
  expect_columns_around_poisoned(first, left, n);
  expect_same_bits_on_every_run(y, first, launch, stream);
  return first;
}

// An op whose path choice is timed on first use: `run` captured into a graph before any eager
// call (a choice without an answer takes its first path untimed), then eagerly (as the timed
// choice picks), then a graph captured after that, which must replay the eager bits. Each result
// against `ref` within `tol`.
inline void expect_captured_eager_and_graph(Tensor& y, const std::vector<double>& ref, double tol,
                                            const std::function<void()>& run, cudaStream_t stream) {
  y.fill_nan_();
  cuda::Graph first;
  first.begin_capture(stream);
  run();
  first.end_capture();
  first.replay(stream);
  EXPECT_LT(rel_error(fetch(y), ref), tol) << "captured before any eager call";
  y.fill_nan_();
  run();
  const Tensor eager = fetch(y);
  EXPECT_LT(rel_error(eager, ref), tol) << "eagerly, as chosen";
  y.fill_nan_();
  cuda::Graph chosen;
  chosen.begin_capture(stream);
  run();
  chosen.end_capture();
  chosen.replay(stream);
  EXPECT_TRUE(bitwise_equal(fetch(y), eager)) << "a graph of the choice";
}

}  // namespace locus::testing
