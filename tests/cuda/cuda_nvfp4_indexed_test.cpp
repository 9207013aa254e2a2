// ops::nvfp4_gemm_indexed on CUDA (weights by ids that only the device reads): every row against
// fp64 with its token's row and its expert's weight, tokens sharing experts, plain and SwiGLU, an
// id out of range giving a zero row; then in a CUDA graph, replayed after the ids changed on the
// device and after an in-place reload of one weight (the graph reads the new ids and weights).
// Each on every path: as timed, the streaming kernel, and the matrix-vector kernel (nvfp4_gemv.h)
// in its own block shape and in two forced ones.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backends/cuda/cuda_graph.h"
#include "cuda_test_util.h"
#include "ops/nvfp4_indexed.h"

namespace locus {
namespace {

using namespace locus::testing;

struct IndexedCase {
  int64_t experts, n, k, tokens, choices;
  bool swiglu;
};

// Random weights (prepared for the GPU), tokens and ids; the ids as given (some may be bad).
struct Indexed {
  std::vector<ops::Nvfp4Weight> host, gpu;
  std::unique_ptr<ops::Nvfp4WeightSet> set;
  Tensor x;
  Indexed(const IndexedCase& c, uint64_t seed) {
    for (int64_t e = 0; e < c.experts; ++e) {
      host.push_back(random_nvfp4(c.swiglu ? 2 * c.n : c.n, c.k, seed + 10 + static_cast<uint64_t>(e)));
      gpu.push_back(cuda::nvfp4_prepare(host.back(), 0, -1));
    }
    std::vector<const ops::Nvfp4Weight*> ptrs;
    for (const auto& w : gpu) ptrs.push_back(&w);
    set = std::make_unique<ops::Nvfp4WeightSet>(ptrs);
    x = randn({c.tokens, c.k}, DType::kBF16, seed + 1);
  }
  // fp64 reference of row t*k + j (zeros for a bad id).
  std::vector<double> ref(const IndexedCase& c, const std::vector<int32_t>& ids) const {
    std::vector<double> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t t = static_cast<int64_t>(i) / c.choices;
      if (ids[i] < 0 || ids[i] >= c.experts) {
        out.insert(out.end(), static_cast<size_t>(c.n), 0.0);
        continue;
      }
      std::vector<double> r = ref_gemm_dense(x.slice(0, t, t + 1), dequant_ref(host[static_cast<size_t>(ids[i])]),
                                             c.swiglu ? 2 * c.n : c.n);
      if (c.swiglu) r = ref_swiglu(r, 1, c.n);
      out.insert(out.end(), r.begin(), r.end());
    }
    return out;
  }
};

struct PathCase {
  Nvfp4Path path;
  cuda::detail::Nvfp4GemvShape shape;
};
constexpr PathCase kPaths[] = {{Nvfp4Path::kTimed, {0, 0}},
                               {Nvfp4Path::kStreaming, {0, 0}},
                               {Nvfp4Path::kMatrixVector, {0, 0}},
                               {Nvfp4Path::kMatrixVector, {1, 1}},
                               {Nvfp4Path::kMatrixVector, {2, 8}}};
::testing::Message path_message(const PathCase& p) {
  return ::testing::Message() << nvfp4_path_name(p.path) << " " << p.shape.tiles_per_warp << "x"
                              << p.shape.warps_per_slot;
}

Tensor device_ids(const std::vector<int32_t>& ids, int64_t choices) {
  Tensor t = Tensor::empty({static_cast<int64_t>(ids.size()) / choices, choices}, DType::kI32);
  std::memcpy(t.data_ptr(), ids.data(), ids.size() * sizeof(int32_t));
  return to_gpu(t);
}

std::vector<int32_t> random_ids(const IndexedCase& c, std::mt19937_64& rng) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < c.tokens * c.choices; ++i) ids.push_back(static_cast<int32_t>(rng() % c.experts));
  return ids;
}

TEST(CudaNvfp4Indexed, EveryRowMatchesFp64WithItsExpert) {
  LOCUS_REQUIRE_GPU();
  // DeepSeek-V3's expert shapes at decode (gate/up fused 2 x 2048 over 7168, down 7168 over 2048)
  // and small odd ones; tokens share experts (random ids over few experts).
  for (const IndexedCase c : {IndexedCase{6, 2048, 7168, 1, 8, true}, IndexedCase{6, 7168, 2048, 2, 4, false},
                              IndexedCase{3, 48, 128, 5, 3, false}, IndexedCase{4, 64, 256, 3, 2, true}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " N " << c.n << " K " << c.k << " T " << c.tokens);
    std::mt19937_64 rng(seed);
    const Indexed in(c, seed);
    const std::vector<int32_t> ids = random_ids(c, rng);
    const DType out_dtype = c.swiglu ? DType::kBF16 : DType::kFP32;
    const std::vector<double> want = in.ref(c, ids);
    const Tensor xg = to_gpu(in.x), ids_gpu = device_ids(ids, c.choices);
    for (const PathCase& p : kPaths) {
      SCOPED_TRACE(path_message(p));
      const ScopedNvfp4Path path(p.path, p.shape);
      Tensor y = poisoned_gpu({c.tokens * c.choices, c.n}, out_dtype);
      ops::nvfp4_gemm_indexed(xg, ids_gpu, *in.set, y, c.swiglu);
      EXPECT_LT(rel_error(fetch(y), want), c.swiglu ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k));
    }
  }
}

// Two products in one launch, as MoE decode runs its routed experts with its shared expert (a
// set of one weight, ids of zeros) at DeepSeek-V3's expert shapes: both row ranges of the output
// against fp64, nothing left unwritten.
TEST(CudaNvfp4Indexed, TwoProductsInOneLaunchMatchFp64) {
  LOCUS_REQUIRE_GPU();
  for (const IndexedCase c : {IndexedCase{5, 2048, 7168, 1, 8, true}, IndexedCase{5, 7168, 2048, 1, 8, false},
                              IndexedCase{4, 64, 256, 3, 2, true}}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " N " << c.n << " K " << c.k << " T " << c.tokens);
    std::mt19937_64 rng(seed);
    const Indexed in(c, seed);
    // Experts 0..E-2 are routed; expert E-1 plays the shared one.
    IndexedCase routed_case = c;
    routed_case.experts = c.experts - 1;
    const ops::Nvfp4WeightSet routed([&] {
      std::vector<const ops::Nvfp4Weight*> p;
      for (int64_t e = 0; e + 1 < c.experts; ++e) p.push_back(&in.gpu[static_cast<size_t>(e)]);
      return p;
    }());
    const ops::Nvfp4WeightSet shared({&in.gpu.back()});
    const std::vector<int32_t> ids = random_ids(routed_case, rng);
    const int64_t R = c.tokens * c.choices, T = c.tokens;
    const DType out_dtype = c.swiglu ? DType::kBF16 : DType::kFP32;
    const Tensor xg = to_gpu(in.x), routed_ids = device_ids(ids, c.choices),
                 shared_ids = device_ids(std::vector<int32_t>(static_cast<size_t>(T), 0), 1);
    std::vector<double> want = in.ref(c, ids);  // the routed rows, then each token's row with the shared weight
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> r = ref_gemm_dense(in.x.slice(0, t, t + 1), dequant_ref(in.host.back()), c.swiglu ? 2 * c.n : c.n);
      if (c.swiglu) r = ref_swiglu(r, 1, c.n);
      want.insert(want.end(), r.begin(), r.end());
    }
    for (const PathCase& p : kPaths) {
      SCOPED_TRACE(path_message(p));
      const ScopedNvfp4Path path(p.path, p.shape);
      Tensor y = poisoned_gpu({R + T, c.n}, out_dtype);
      ops::nvfp4_gemm_indexed({{xg, routed_ids, &routed, y.slice(0, 0, R)}, {xg, shared_ids, &shared, y.slice(0, R, R + T)}},
                              c.swiglu);
      EXPECT_LT(rel_error(fetch(y), want), c.swiglu ? bf16_gemm_tolerance(c.k) : fp32_out_gemm_tolerance(c.k));
    }
  }
}

TEST(CudaNvfp4Indexed, AnIdOutOfRangeGivesAZeroRow) {
  LOCUS_REQUIRE_GPU();
  const IndexedCase c{3, 64, 128, 2, 3, false};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const Indexed in(c, seed);
  const std::vector<int32_t> ids = {0, 7, 2, -1, 1, 1};
  for (const PathCase& p : kPaths) {
    SCOPED_TRACE(path_message(p));
    const ScopedNvfp4Path path(p.path, p.shape);
    Tensor y = poisoned_gpu({6, c.n}, DType::kFP32);
    ops::nvfp4_gemm_indexed(to_gpu(in.x), device_ids(ids, c.choices), *in.set, y, false);
    const Tensor got = fetch(y);
    for (const int64_t bad : {1, 3})
      for (double v : to_doubles(got.slice(0, bad, bad + 1))) EXPECT_EQ(v, 0.0) << "row " << bad;
    EXPECT_LT(rel_error(got, in.ref(c, ids)), fp32_out_gemm_tolerance(c.k));
  }
}

// A graph of the products replayed after new ids were written on the device, then after an
// in-place reload of an expert, against fp64 each time.
void check_graph_replays() {
  const IndexedCase c{5, 256, 512, 2, 4, true};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  Indexed in(c, seed);
  std::vector<int32_t> ids = random_ids(c, rng);
  Tensor ids_gpu = device_ids(ids, c.choices), xg = to_gpu(in.x);
  Tensor y = poisoned_gpu({c.tokens * c.choices, c.n}, DType::kBF16);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Stream st{Device::cuda(0), stream};
  ops::nvfp4_gemm_indexed(xg, ids_gpu, *in.set, y, true, st);  // eager first: the table is built outside the capture
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cuda::Graph graph;
  graph.begin_capture(stream);
  ops::nvfp4_gemm_indexed(xg, ids_gpu, *in.set, y, true, st);
  graph.end_capture();
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    ids = random_ids(c, rng);  // new routing, written into the same device buffer
    ids_gpu.copy_(device_ids(ids, c.choices));
    if (round == 1) {  // an in-place reload of the first id's expert
      const size_t e = static_cast<size_t>(ids[0]);
      in.host[e] = random_nvfp4(2 * c.n, c.k, seed + 99);
      cuda::nvfp4_prepare_into(in.host[e], in.gpu[e]);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    graph.replay(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_LT(rel_error(fetch(y), in.ref(c, ids)), bf16_gemm_tolerance(c.k));
  }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaNvfp4Indexed, AGraphReadsTheIdsAndWeightsOfEachReplay) {
  LOCUS_REQUIRE_GPU();
  for (const PathCase& p : kPaths) {
    SCOPED_TRACE(path_message(p));
    const ScopedNvfp4Path path(p.path, p.shape);
    check_graph_replays();
  }
}

}  // namespace
}  // namespace locus
