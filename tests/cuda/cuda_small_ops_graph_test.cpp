// The small ops on a caller's stream inside a CUDA graph: capture must succeed (no allocation,
// copy or synchronization inside the ops) and every replay must reproduce the eager results bit
// for bit (the kernels have fixed reduction orders).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "ops/norm.h"
#include "ops/rope.h"
#include "ops/softmax_topk.h"

namespace locus::testing {
namespace {

struct Buffers {
  Tensor ids, table, w, residual, q, positions, logits;             // inputs (q is rotated in place)
  Tensor emb, normed, sum, probs, top_values, top_indices, wide;    // outputs
  ops::RopeTable rope;

  void poison_outputs() const {
    for (Tensor t : {emb, normed, sum, probs, top_values, top_indices, wide}) t.fill_nan_();
  }
};

Buffers make_buffers(uint64_t seed, const ops::RopeTable& rope_cpu) {
  const Device dev = Device::cuda(0);
  const int64_t T = 8, H = 512, vocab = 100, heads = 4, dr = 64, n = 1000;
  Buffers b;
  Tensor ids = Tensor::empty({T}, DType::kI32);
  for (int64_t t = 0; t < T; ++t) ids.data<int32_t>()[t] = static_cast<int32_t>((t * 37 + 11) % vocab);
  Tensor pos = Tensor::empty({T}, DType::kI64);
  for (int64_t t = 0; t < T; ++t) pos.data<int64_t>()[t] = 3 * t + 1;
  b.ids = ids.to(dev);
  b.positions = pos.to(dev);
  b.table = randn({vocab, H}, DType::kBF16, seed).to(dev);
  b.w = randn({H}, DType::kBF16, seed + 1).to(dev);
  b.residual = randn({T, H}, DType::kBF16, seed + 2).to(dev);
  b.q = randn({T, heads, dr}, DType::kBF16, seed + 3).to(dev);
  b.logits = randn({2, n}, DType::kFP32, seed + 4, 4.0).to(dev);
  b.rope = rope_cpu;
  b.rope.cos = rope_cpu.cos.to(dev);
  b.rope.sin = rope_cpu.sin.to(dev);
  b.emb = Tensor::empty({T, H}, DType::kBF16, dev);
  b.normed = Tensor::empty({T, H}, DType::kBF16, dev);
  b.sum = Tensor::empty({T, H}, DType::kFP32, dev);
  b.probs = Tensor::empty({2, n}, DType::kFP32, dev);
  b.top_values = Tensor::empty({2, 10}, DType::kFP32, dev);
  b.top_indices = Tensor::empty({2, 10}, DType::kI32, dev);
  b.wide = Tensor::empty({T, H}, DType::kFP32, dev);
  b.poison_outputs();
  return b;
}

void run_ops(const Buffers& b, const Stream& s) {
  ops::embedding(b.table, b.ids, b.emb, s);
  ops::rmsnorm(b.emb, b.w, 1e-6f, b.normed, s);
  ops::add(b.normed, b.residual, b.sum, s);
  ops::cast(b.normed, b.wide, s);
  ops::apply_rope(b.q, b.positions, b.rope, true, s);
  ops::softmax(b.logits, b.probs, s);
  ops::topk(b.probs, 10, b.top_values, b.top_indices, s);
}

TEST(CudaSmallOpsGraph, CapturedOpsReplayTheEagerResults) {
  LOCUS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  ops::RopeConfig rc;
  rc.dim = 64;
  const ops::RopeTable rope = ops::make_rope_table(rc, 64);
  cudaStream_t raw = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  const Stream stream{Device::cuda(0), raw};

  const Buffers eager = make_buffers(seed, rope);
  run_ops(eager, stream);
  cuda::device_synchronize(0);

  const Buffers graphed = make_buffers(seed, rope);
  const Tensor q0 = fetch(graphed.q);
  {
    cuda::Graph graph;
    graph.begin_capture(raw);
    run_ops(graphed, stream);
    graph.end_capture();
    for (int replay = 0; replay < 2; ++replay) {
      SCOPED_TRACE(replay);
      graphed.poison_outputs();
      Tensor q = graphed.q;
      q.copy_(q0);  // same device pointer: the graph rotates it again
      cuda::device_synchronize(0);
      graph.replay(raw);
      for (auto [got, want] : {std::pair{graphed.emb, eager.emb}, {graphed.normed, eager.normed},
                               {graphed.sum, eager.sum}, {graphed.wide, eager.wide}, {graphed.q, eager.q},
                               {graphed.probs, eager.probs}, {graphed.top_values, eager.top_values},
                               {graphed.top_indices, eager.top_indices}})
        EXPECT_TRUE(bitwise_equal(fetch(got), fetch(want))) << got.describe();
    }
  }
  cudaStreamDestroy(raw);
}

}  // namespace
}  // namespace locus::testing
