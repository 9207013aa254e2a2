// ops::mla_attention on CUDA against the fp64 reference and the CPU op, in the two forms MLA uses
// (absorbed decode: one shared latent head, k_a and v the same cache view; prefill: per-head keys
// and values, a shared rope key), at DeepSeek-V3 sizes and odd ones, with every mix of shared and
// per-head operands, bf16 and fp32 inputs and outputs, several sequences writing one output, key
// splits, determinism and CUDA-graph capture. Inputs are views of larger buffers whose unused
// parts are NaN (so any read outside a view shows), outputs are poisoned with NaN first.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "modules/mla_attention_reference.h"
#include "ops/attention.h"

namespace locus::testing {
namespace {

using Views = std::array<Tensor, 5>;  // q_a, q_b, k_a, k_b, v

// The same views of host buffers and of their device copies.
struct AttnInputs {
  Views cpu, gpu;
  int64_t T() const { return cpu[0].size(0); }
  int64_t H() const { return cpu[0].size(1); }
  int64_t S() const { return cpu[2].size(0); }
  int64_t qk_dim() const { return cpu[0].size(2) + cpu[1].size(2); }
  int64_t Dv() const { return cpu[4].size(2); }
};

AttnInputs make_inputs(const std::vector<Tensor>& host_buffers,
                       const std::function<Views(const std::vector<Tensor>&)>& views) {
  std::vector<Tensor> dev;
  for (const Tensor& b : host_buffers) dev.push_back(to_gpu(b));
  return {views(host_buffers), views(dev)};
}

// Absorbed decode as MLA::forward builds it: q_lat [T, H, Dc]; q_pe a slice of q [T, H, dn + Dr];
// the latent cache [capacity, Dc + Dr] gives k_a = v = c_kv and k_b = k_pe (one head each).
AttnInputs decode_inputs(int64_t T, int64_t H, int64_t S, int64_t Dc, int64_t Dr, uint64_t seed) {
  const int64_t dn = 24;
  Tensor q_lat = randn({T, H, Dc}, DType::kBF16, seed);
  Tensor q = randn({T, H, dn + Dr}, DType::kBF16, seed + 1);
  q.slice(2, 0, dn).fill_nan_();  // only q_pe is read
  Tensor cache = randn({S + 3, Dc + Dr}, DType::kBF16, seed + 2);
  cache.slice(0, S, S + 3).fill_nan_();  // rows past the sequence are never read
  return make_inputs({q_lat, q, cache}, [=](const std::vector<Tensor>& b) {
    const Tensor rows = b[2].slice(0, 0, S);
    const Tensor kv = rows.slice(1, 0, Dc).unsqueeze(1);
    return Views{b[0], b[1].slice(2, dn, dn + Dr), kv, rows.slice(1, Dc, Dc + Dr).unsqueeze(1), kv};
  });
}

// Prefill as MLA::attend_prefill builds it: q [T, H, dn + dr] split in two; per-head k_nope and
// v as slices of kv_b's output [S, H, dn + dv]; the shared k_pe from the cache [S, Dc + dr].
AttnInputs prefill_inputs(int64_t T, int64_t H, int64_t S, int64_t dn, int64_t dr, int64_t dv, uint64_t seed) {
  const int64_t Dc = 40;
  Tensor q = randn({T, H, dn + dr}, DType::kBF16, seed);
  Tensor kvb = randn({S, H, dn + dv}, DType::kBF16, seed + 1);
  Tensor cache = randn({S, Dc + dr}, DType::kBF16, seed + 2);
  cache.slice(1, 0, Dc).fill_nan_();  // only k_pe is read
  return make_inputs({q, kvb, cache}, [=](const std::vector<Tensor>& b) {
    return Views{b[0].slice(2, 0, dn), b[0].slice(2, dn, dn + dr), b[1].slice(2, 0, dn),
                 b[2].slice(1, Dc, Dc + dr).unsqueeze(1), b[1].slice(2, dn, dn + dv)};
  });
}

// Independent dense operands with the given head counts (H or 1) and dtypes.
AttnInputs plain_inputs(int64_t T, int64_t H, int64_t S, int64_t Da, int64_t Db, int64_t Dv, int64_t ha, int64_t hb,
                        int64_t hv, DType q_dtype, DType kv_dtype, uint64_t seed) {
  return make_inputs({randn({T, H, Da}, q_dtype, seed), randn({T, H, Db}, q_dtype, seed + 1),
                      randn({S, ha, Da}, kv_dtype, seed + 2), randn({S, hb, Db}, kv_dtype, seed + 3),
                      randn({S, hv, Dv}, kv_dtype, seed + 4)},
                     [](const std::vector<Tensor>& b) { return Views{b[0], b[1], b[2], b[3], b[4]}; });
}

float default_scale(const AttnInputs& in) {
  return static_cast<float>(1.5 / std::sqrt(static_cast<double>(in.qk_dim())));
}

void call(const Views& v, const Tensor& out, float scale, int64_t q_start, void* stream = nullptr) {
  ops::mla_attention(v[0], v[1], v[2], v[3], v[4], out, scale, q_start, Stream{Device::cuda(0), stream});
}

// Runs on the GPU into a poisoned output and checks it against fp64 and against the CPU op
// (each within the tolerance of fp64, so within twice of each other).
void expect_matches(const AttnInputs& in, DType out_dtype, int64_t q_start, float scale) {
  const Shape shape{in.T(), in.H(), in.Dv()};
  Tensor out = poisoned_gpu(shape, out_dtype);
  call(in.gpu, out, scale, q_start);
  const Tensor got = fetch(out);
  const double tol = attention_tolerance(out_dtype, in.qk_dim(), in.S());
  EXPECT_LT(rel_error(got, ref_attention(in.cpu[0], in.cpu[1], in.cpu[2], in.cpu[3], in.cpu[4], scale, q_start)), tol);
  Tensor cpu_out = Tensor::empty(shape, out_dtype);
  cpu_out.fill_nan_();
  ops::mla_attention(in.cpu[0], in.cpu[1], in.cpu[2], in.cpu[3], in.cpu[4], cpu_out, scale, q_start);
  EXPECT_LT(rel_error(got, to_doubles(cpu_out)), 2 * tol);
}

TEST(CudaAttention, AbsorbedDecodeAtDeepSeekV3Sizes) {
  LOCUS_REQUIRE_GPU();
  // 128 heads over one latent head of 512 + 64 dims; 1..16 new tokens; long and odd caches.
  for (auto [T, S] : {std::pair<int64_t, int64_t>{1, 2048}, {1, 77}, {4, 1537}, {16, 300}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " T " << T << " S " << S);
    const AttnInputs in = decode_inputs(T, 128, S, 512, 64, seed);
    expect_matches(in, DType::kBF16, S - T, default_scale(in));
  }
}

TEST(CudaAttention, AbsorbedDecodeSmallModelAndFp32Output) {
  LOCUS_REQUIRE_GPU();
  // The tiny model's latent sizes (16 heads, kv_lora 64, rope 16) and an odd latent (Dc 200).
  for (auto [H, Dc, Dr] : {std::array<int64_t, 3>{16, 64, 16}, {5, 200, 24}}) {
    for (DType out : {DType::kBF16, DType::kFP32}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " H " << H << " Dc " << Dc);
      const AttnInputs in = decode_inputs(3, H, 1000, Dc, Dr, seed);
      expect_matches(in, out, 997, default_scale(in));
    }
  }
}

TEST(CudaAttention, DecodeKernelAndTensorCoreKernelEachMatchFp64) {
  LOCUS_REQUIRE_GPU();
  // One new token over DeepSeek-V3's latent (from the query alone to 4 key splits of the decode
  // kernel), the tiny model's sizes, and 5 heads (a CTA's 4 heads, then 1) over an odd latent;
  // bf16 and fp32 outputs, on each kernel.
  for (int64_t max_keys : {kTensorCoreAttention, kDecodeKernelAttention}) {
    DecodeAttentionKeys kernel(max_keys);
    for (auto [H, Dc, Dr, S] : {std::array<int64_t, 4>{128, 512, 64, 1}, {128, 512, 64, 64}, {128, 512, 64, 300},
                                {128, 512, 64, 1700}, {16, 64, 16, 77}, {5, 200, 24, 130}}) {
      for (DType out : {DType::kBF16, DType::kFP32}) {
        const uint64_t seed = fresh_seed();
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " max_keys " << max_keys << " H " << H << " Dc "
                                          << Dc << " S " << S << " out " << dtype_name(out));
        const AttnInputs in = decode_inputs(1, H, S, Dc, Dr, seed);
        expect_matches(in, out, S - 1, default_scale(in));
      }
    }
  }
}

TEST(CudaAttention, DecodeKernelAtEverySplitLength) {
  LOCUS_REQUIRE_GPU();
  // Splits of one key each, of an odd length (fewer keys than the CTA's 8 warps, a last split
  // cut short), the default's and the kernel's longest, over DeepSeek-V3's latent.
  DecodeAttentionKeys kernel(kDecodeKernelAttention);
  for (int64_t split_keys : {1, 7, 32, 512}) {
    DecodeAttentionSplitKeys split(split_keys);
    for (int64_t S : {5, 61, 300, 1100}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " split keys " << split_keys << " S " << S);
      const AttnInputs in = decode_inputs(1, 128, S, 512, 64, seed);
      expect_matches(in, DType::kBF16, S - 1, default_scale(in));
    }
  }
}

TEST(CudaAttention, PrefillAtDeepSeekV3HeadDims) {
  LOCUS_REQUIRE_GPU();
  // qk_nope 128 per head, shared rope 64, v 128 per head: a whole prompt (T = S) and a chunk
  // after a cached prefix (q_start > 0, T < S).
  for (auto [T, S] : {std::pair<int64_t, int64_t>{512, 512}, {100, 900}}) {
    for (DType out : {DType::kBF16, DType::kFP32}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " T " << T << " S " << S);
      const AttnInputs in = prefill_inputs(T, 8, S, 128, 64, 128, seed);
      expect_matches(in, out, S - T, default_scale(in));
    }
  }
}

TEST(CudaAttention, OddSizesEverySharedHeadMix) {
  LOCUS_REQUIRE_GPU();
  // Dims that are not multiples of 8 (unaligned rows: the element-wise load path), 3 heads, a
  // prefix; each of k_a, k_b, v per-head or shared.
  const int64_t T = 7, H = 3, S = 61, Da = 37, Db = 5, Dv = 19;
  for (int mask = 0; mask < 8; ++mask) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " shared mask " << mask);
    const AttnInputs in = plain_inputs(T, H, S, Da, Db, Dv, mask & 1 ? 1 : H, mask & 2 ? 1 : H, mask & 4 ? 1 : H,
                                       DType::kBF16, DType::kBF16, seed);
    for (DType out : {DType::kBF16, DType::kFP32}) expect_matches(in, out, S - T, 0.4f);
  }
}

TEST(CudaAttention, WideValueHeadsAndSingleHead) {
  LOCUS_REQUIRE_GPU();
  // Dv over 128 and 256 columns (two and four column parts per row group), v not k_a's view; one
  // query head; Dv past the tensor-core kernel's 512 and a separate 512-wide v (the CUDA-core
  // kernel takes those).
  struct Case { int64_t T, H, S, Da, Db, Dv, hv; };
  for (const Case& c : {Case{9, 4, 130, 128, 64, 200, 4}, Case{5, 6, 70, 128, 64, 384, 1},
                        Case{33, 1, 40, 16, 8, 24, 1}, Case{2, 4, 90, 520, 8, 520, 1},
                        Case{3, 4, 150, 512, 64, 512, 1}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " Dv " << c.Dv << " H " << c.H);
    const AttnInputs in = plain_inputs(c.T, c.H, c.S, c.Da, c.Db, c.Dv, 1, 1, c.hv, DType::kBF16, DType::kBF16, seed);
    expect_matches(in, DType::kFP32, c.S - c.T, default_scale(in));
  }
}

TEST(CudaAttention, Fp32AndMixedInputs) {
  LOCUS_REQUIRE_GPU();
  for (auto [q_dtype, kv_dtype] : {std::pair{DType::kFP32, DType::kFP32}, {DType::kFP32, DType::kBF16},
                                   {DType::kBF16, DType::kFP32}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " q " << dtype_name(q_dtype) << " kv "
                                      << dtype_name(kv_dtype));
    const AttnInputs shared = plain_inputs(4, 8, 200, 64, 16, 64, 1, 1, 1, q_dtype, kv_dtype, seed);
    expect_matches(shared, DType::kFP32, 196, default_scale(shared));
    const AttnInputs per_head = plain_inputs(20, 3, 50, 33, 7, 12, 3, 1, 3, q_dtype, kv_dtype, seed + 10);
    expect_matches(per_head, DType::kBF16, 30, 0.5f);
  }
}

TEST(CudaAttention, SequencesWriteTheirRowsOfOneOutputOnly) {
  LOCUS_REQUIRE_GPU();
  // As in MLA's decode over a batch: each sequence has its own cache and prefix and writes its
  // rows of one [T, H, Dv] output, here a column slice of a wider poisoned buffer.
  const int64_t H = 16, Dc = 512, Dr = 64, pad = 8;
  const std::array<std::pair<int64_t, int64_t>, 3> seqs{{{1, 1500}, {2, 37}, {3, 3}}};  // (tokens, keys)
  int64_t T = 0;
  for (auto [n, s] : seqs) T += n;
  Tensor wide = poisoned_gpu({T, H, Dc + pad}, DType::kBF16);
  Tensor out = wide.slice(2, 0, Dc);
  std::vector<std::vector<double>> refs;
  int64_t row = 0;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto [n, S] = seqs[i];
    const AttnInputs in = decode_inputs(n, H, S, Dc, Dr, seed + 10 * i);
    call(in.gpu, out.slice(0, row, row + n), default_scale(in), S - n);
    refs.push_back(ref_attention(in.cpu[0], in.cpu[1], in.cpu[2], in.cpu[3], in.cpu[4], default_scale(in), S - n));
    row += n;
  }
  const Tensor got = fetch(wide);
  row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto [n, S] = seqs[i];
    EXPECT_LT(rel_error(got.slice(0, row, row + n).slice(2, 0, Dc), refs[i]),
              attention_tolerance(DType::kBF16, Dc + Dr, S))
        << "sequence " << i;
    row += n;
  }
  for (double x : to_doubles(got.slice(2, Dc, Dc + pad))) ASSERT_TRUE(std::isnan(x)) << "wrote outside its view";
}

// Decode over a batch as MLA::forward runs it with ops::mla_attention_batch: one query row per
// sequence in shared q_lat / q tensors, each sequence's keys in its own latent cache of
// `keys[i]` rows (plus NaN rows past them). `odd` gives the last sequence's cache a wider row, so
// that its keys' layout differs from the others'.
struct BatchDecode {
  int64_t H, Dc, Dr;
  std::vector<int64_t> keys;
  Tensor q_lat, q;                  // host: [B, H, Dc], [B, H, dn + Dr]
  std::vector<Tensor> caches;       // host
  Tensor q_lat_gpu, q_gpu;
  std::vector<Tensor> caches_gpu;
  static constexpr int64_t dn = 24;

  BatchDecode(int64_t h, int64_t dc, int64_t dr, std::vector<int64_t> k, uint64_t seed, bool odd = false)
      : H(h), Dc(dc), Dr(dr), keys(std::move(k)) {
    const int64_t B = static_cast<int64_t>(keys.size());
    q_lat = randn({B, H, Dc}, DType::kBF16, seed);
    q = randn({B, H, dn + Dr}, DType::kBF16, seed + 1);
    q.slice(2, 0, dn).fill_nan_();
    for (int64_t i = 0; i < B; ++i) {
      const int64_t width = Dc + Dr + (odd && i == B - 1 ? 8 : 0);
      Tensor c = randn({keys[i] + 2, width}, DType::kBF16, seed + 2 + static_cast<uint64_t>(i));
      c.slice(0, keys[i], keys[i] + 2).fill_nan_();
      caches.push_back(c);
      caches_gpu.push_back(to_gpu(c));
    }
    q_lat_gpu = to_gpu(q_lat);
    q_gpu = to_gpu(q);
  }
  std::vector<ops::AttentionKeys> key_views(const std::vector<Tensor>& c) const {
    std::vector<ops::AttentionKeys> out;
    for (size_t i = 0; i < c.size(); ++i) {
      const Tensor rows = c[i].slice(0, 0, keys[i]);
      const Tensor kv = rows.slice(1, 0, Dc).unsqueeze(1);
      out.push_back({kv, rows.slice(1, Dc, Dc + Dr).unsqueeze(1), kv});
    }
    return out;
  }
  float scale() const { return static_cast<float>(1.5 / std::sqrt(static_cast<double>(Dc + Dr))); }
  // Runs the batch on the GPU into a poisoned column slice of a wider output; returns the fetched
  // wide buffer after checking that nothing outside the slice was written.
  Tensor run(void* stream = nullptr) const {
    const int64_t B = static_cast<int64_t>(keys.size());
    Tensor wide = poisoned_gpu({B, H, Dc + 8}, DType::kBF16);
    ops::mla_attention_batch(q_lat_gpu, q_gpu.slice(2, dn, dn + Dr), key_views(caches_gpu), wide.slice(2, 0, Dc),
                             scale(), Stream{Device::cuda(0), stream});
    const Tensor got = fetch(wide);
    for (double x : to_doubles(got.slice(2, Dc, Dc + 8))) EXPECT_TRUE(std::isnan(x)) << "wrote outside its view";
    return got.slice(2, 0, Dc);
  }
  void expect_matches(const Tensor& got) const {
    const int64_t B = static_cast<int64_t>(keys.size());
    const auto views = key_views(caches);
    Tensor cpu_out = Tensor::empty({B, H, Dc}, DType::kBF16);
    cpu_out.fill_nan_();
    ops::mla_attention_batch(q_lat, q.slice(2, dn, dn + Dr), views, cpu_out, scale());
    for (int64_t i = 0; i < B; ++i) {
      const auto& k = views[static_cast<size_t>(i)];
      const double tol = attention_tolerance(DType::kBF16, Dc + Dr, keys[i]);
      const auto ref = ref_attention(q_lat.slice(0, i, i + 1), q.slice(0, i, i + 1).slice(2, dn, dn + Dr), k.k_a, k.k_b,
                                     k.v, scale(), keys[i] - 1);
      EXPECT_LT(rel_error(got.slice(0, i, i + 1), ref), tol) << "sequence " << i << " of " << keys[i] << " keys";
      EXPECT_LT(rel_error(got.slice(0, i, i + 1), to_doubles(cpu_out.slice(0, i, i + 1))), 2 * tol) << "sequence " << i;
    }
  }
};

TEST(CudaAttention, BatchedDecodeSequencesOfEveryLengthInOneOp) {
  LOCUS_REQUIRE_GPU();
  // DeepSeek-V3's latent sizes; lengths from one key (the new token alone) to key splits.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const BatchDecode b(128, 512, 64, {1, 5, 70, 300, 1500, 33}, seed);
  b.expect_matches(b.run());
}

TEST(CudaAttention, BatchedDecodeOnEachKernel) {
  LOCUS_REQUIRE_GPU();
  // Sequences of 1 to 1500 keys in one launch of each kernel: on the decode kernel the short
  // ones leave their later key splits empty.
  for (int64_t max_keys : {kTensorCoreAttention, kDecodeKernelAttention}) {
    DecodeAttentionKeys kernel(max_keys);
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " max_keys " << max_keys);
    const BatchDecode b(128, 512, 64, {1, 5, 70, 300, 1500, 33}, seed);
    b.expect_matches(b.run());
    const BatchDecode tiny(16, 64, 16, {2, 40, 7}, seed + 1);
    tiny.expect_matches(tiny.run());
  }
}

TEST(CudaAttention, BatchedDecodeBeyondOneLaunchAndWithOtherLayouts) {
  LOCUS_REQUIRE_GPU();
  // 70 sequences (two launches of at most 64), the tiny model's sizes, random lengths; then a
  // batch whose last cache has wider rows, which the op runs one sequence at a time.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> keys;
  for (int i = 0; i < 70; ++i) keys.push_back(1 + static_cast<int64_t>(rng() % 400));
  const BatchDecode many(16, 64, 16, keys, seed + 1);
  many.expect_matches(many.run());
  const BatchDecode odd(16, 64, 16, {9, 200, 31}, seed + 2, /*odd=*/true);
  odd.expect_matches(odd.run());
}

TEST(CudaAttention, BatchedDecodeIsDeterministicAndCapturable) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const BatchDecode b(128, 512, 64, {3000, 2, 700}, seed);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Tensor first = b.run(stream);
  EXPECT_TRUE(bitwise_equal(b.run(stream), first));
  Tensor out = poisoned_gpu({3, 128, 512}, DType::kBF16);
  cuda::Graph graph;
  graph.begin_capture(stream);
  ops::mla_attention_batch(b.q_lat_gpu, b.q_gpu.slice(2, BatchDecode::dn, BatchDecode::dn + 64),
                           b.key_views(b.caches_gpu), out, b.scale(), Stream{Device::cuda(0), stream});
  graph.end_capture();
  graph.replay(stream);
  EXPECT_TRUE(bitwise_equal(fetch(out), first));
  b.expect_matches(first);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaAttention, DecodeKernelMergesItsSplitsAsTheCombineKernelDoes) {
  LOCUS_REQUIRE_GPU();
  // The decode kernel's last CTA of each head group merges the key splits (the default) or the
  // combine kernel does: the same bits, eagerly and replayed from a graph several times (each
  // launch must leave its counters at zero for the next). Splits of 7 keys (up to 43 of them) and
  // of 64; 128 heads (32 head groups) and 5 (a group of 4 and one of 1); one launch of 5
  // sequences, one of which has a single key.
  DecodeAttentionKeys kernel(kDecodeKernelAttention);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (int64_t split_keys : {7, 64}) {
    DecodeAttentionSplitKeys split(split_keys);
    for (int64_t H : {128, 5}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " split keys " << split_keys << " H " << H);
      const BatchDecode b(H, 512, 64, {1, 300, 70, 33, 5}, seed);
      Tensor by_combine;
      {
        DecodeAttentionFusedCombine fused(0);
        by_combine = b.run(stream);
      }
      DecodeAttentionFusedCombine fused(1);
      const Tensor merged = b.run(stream);
      EXPECT_TRUE(bitwise_equal(merged, by_combine));
      EXPECT_TRUE(bitwise_equal(b.run(stream), by_combine)) << "a second launch";
      b.expect_matches(merged);

      Tensor out = poisoned_gpu({5, H, 512}, DType::kBF16);
      cuda::Graph graph;
      graph.begin_capture(stream);
      ops::mla_attention_batch(b.q_lat_gpu, b.q_gpu.slice(2, BatchDecode::dn, BatchDecode::dn + 64),
                               b.key_views(b.caches_gpu), out, b.scale(), Stream{Device::cuda(0), stream});
      graph.end_capture();
      for (int replay = 0; replay < 3; ++replay) {
        out.fill_nan_();
        cuda::device_synchronize(0);  // the poison is in place before the replay on `stream`
        graph.replay(stream);
        EXPECT_TRUE(bitwise_equal(fetch(out), by_combine)) << "replay " << replay;
      }
    }
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaAttention, DeterministicAndCapturableInAGraph) {
  LOCUS_REQUIRE_GPU();
  // Long decode (key splits + combine, scratch from the stream-ordered pool) and a prefill.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  for (const AttnInputs& in :
       {decode_inputs(2, 16, 3000, 512, 64, seed), prefill_inputs(70, 4, 70, 128, 64, 128, seed + 1)}) {
    const float scale = default_scale(in);
    const int64_t q_start = in.S() - in.T();
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    Tensor eager = poisoned_gpu({in.T(), in.H(), in.Dv()}, DType::kFP32);
    call(in.gpu, eager, scale, q_start, stream);
    const Tensor first = fetch(eager);
    Tensor again = poisoned_gpu({in.T(), in.H(), in.Dv()}, DType::kFP32);
    call(in.gpu, again, scale, q_start, stream);
    EXPECT_TRUE(bitwise_equal(fetch(again), first));

    Tensor graphed = poisoned_gpu({in.T(), in.H(), in.Dv()}, DType::kFP32);
    cuda::Graph graph;
    graph.begin_capture(stream);
    call(in.gpu, graphed, scale, q_start, stream);
    graph.end_capture();
    EXPECT_TRUE(std::isnan(to_doubles(fetch(graphed))[0])) << "capture must not run the kernels";
    graph.replay(stream);
    graph.replay(stream);
    EXPECT_TRUE(bitwise_equal(fetch(graphed), first));
    EXPECT_LT(rel_error(first, ref_attention(in.cpu[0], in.cpu[1], in.cpu[2], in.cpu[3], in.cpu[4], scale, q_start)),
              attention_tolerance(DType::kFP32, in.qk_dim(), in.S()));
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
}

TEST(CudaAttention, OperandsOnDifferentDevicesAreErrors) {
  LOCUS_REQUIRE_GPU();
  const AttnInputs in = plain_inputs(2, 2, 4, 8, 8, 8, 2, 1, 2, DType::kBF16, DType::kBF16, fresh_seed());
  Tensor host_out = Tensor::empty({2, 2, 8}, DType::kFP32);
  EXPECT_THROW(call(in.gpu, host_out, 1.f, 2), Error);
  Views mixed = in.gpu;
  mixed[4] = in.cpu[4];
  EXPECT_THROW(call(mixed, poisoned_gpu({2, 2, 8}, DType::kFP32), 1.f, 2), Error);
}

}  // namespace
}  // namespace locus::testing
