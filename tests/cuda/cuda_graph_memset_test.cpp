// Memset nodes of captured graphs as kernel nodes (graph_memset_nodes.h): the same bytes, in the
// same order with the nodes around them, for 1-, 2- and 4-byte elements and pitched rows; and
// cuda::Graph applies it to what it captures, except to a graph with memory nodes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cuda/cuda_graph.h"
#include "backends/cuda/graph_memset_nodes.h"
#include "cuda_test_util.h"
#include "ops/norm.h"

namespace locus::testing {
namespace {

// The host's view of a cudaMemsetParams write.
void apply(std::vector<uint8_t>& bytes, const cudaMemsetParams& p, size_t offset) {
  for (size_t r = 0; r < p.height; ++r)
    for (size_t c = 0; c < p.width; ++c)
      std::memcpy(bytes.data() + offset + r * p.pitch + c * p.elementSize, &p.value, p.elementSize);
}

int memset_nodes(cudaGraph_t g) {
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(g, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  EXPECT_EQ(cudaGraphGetNodes(g, nodes.data(), &n), cudaSuccess);
  int count = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    EXPECT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    count += type == cudaGraphNodeTypeMemset;
  }
  return count;
}

class CudaGraphMemsetNodes : public CudaCallerStream {};

TEST_F(CudaGraphMemsetNodes, BecomeKernelsThatWriteTheSameBytesInOrder) {
  constexpr size_t kBytes = 4096;
  void* raw = nullptr;
  ASSERT_EQ(cudaMalloc(&raw, kBytes), cudaSuccess);
  uint8_t* const buf = static_cast<uint8_t*>(raw);
  ASSERT_EQ(cudaMemset(buf, 0xAB, kBytes), cudaSuccess);
  std::vector<uint8_t> want(kBytes, 0xAB);
  // A chain: bytes, then 16-bit elements over part of them (pitched rows), then 32-bit elements
  // elsewhere; a fourth memset of odd width beside the chain (no edges).
  struct Write {
    size_t offset;
    cudaMemsetParams p;
  };
  auto params = [&](size_t offset, unsigned value, unsigned element_size, size_t width, size_t height, size_t pitch) {
    cudaMemsetParams p{};
    p.dst = buf + offset;
    p.value = value;
    p.elementSize = element_size;
    p.width = width;
    p.height = height;
    p.pitch = pitch;
    return Write{offset, p};
  };
  const std::vector<Write> chain = {params(0, 0x11, 1, 1000, 1, 0), params(8, 0x2233, 2, 100, 3, 512),
                                    params(2048, 0x44556677u, 4, 7, 2, 64)};
  const Write beside = params(3001, 0x5A, 1, 333, 1, 0);
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaGraphCreate(&g, 0), cudaSuccess);
  cudaGraphNode_t prev = nullptr;
  for (const Write& w : chain) {
    cudaGraphNode_t node = nullptr;
    ASSERT_EQ(cudaGraphAddMemsetNode(&node, g, prev ? &prev : nullptr, prev ? 1 : 0, &w.p), cudaSuccess);
    apply(want, w.p, w.offset);
    prev = node;
  }
  cudaGraphNode_t lone = nullptr;
  ASSERT_EQ(cudaGraphAddMemsetNode(&lone, g, nullptr, 0, &beside.p), cudaSuccess);
  apply(want, beside.p, beside.offset);

  EXPECT_EQ(cuda::detail::memset_nodes_to_kernels(g), 4);
  EXPECT_EQ(memset_nodes(g), 0);
  size_t nodes = 0, edges = 0;
  ASSERT_EQ(cudaGraphGetNodes(g, nullptr, &nodes), cudaSuccess);
  ASSERT_EQ(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &edges), cudaSuccess);
  EXPECT_EQ(nodes, 4u);
  EXPECT_EQ(edges, 2u) << "the chain's two edges, nothing more";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(kBytes);
  ASSERT_EQ(cudaMemcpy(got.data(), buf, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaFree(buf);
}

TEST_F(CudaGraphMemsetNodes, ACapturedMemsetStillRunsBeforeTheKernelThatReadsIt) {
  // x is zeroed by a memset inside the capture, then y = x + r; poisoned x before each replay
  // would show through if the add ran first.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const Tensor r = to_gpu(randn({3, 300}, DType::kFP32, seed));
  Tensor x = poisoned_gpu({3, 300}, DType::kFP32), y = poisoned_gpu({3, 300}, DType::kFP32);
  cuda::Graph graph;
  graph.begin_capture(caller_);
  ASSERT_EQ(cudaMemsetAsync(x.data_ptr(), 0, x.nbytes(), caller_), cudaSuccess);
  ops::add(x, r, y, caller());
  graph.end_capture();
  for (int replay = 0; replay < 2; ++replay) {
    x.fill_nan_();
    y.fill_nan_();
    cuda::device_synchronize(0);
    graph.replay(caller_);
    EXPECT_TRUE(bitwise_equal(fetch(y), fetch(r))) << "replay " << replay;
  }
}

TEST_F(CudaGraphMemsetNodes, AGraphWithMemoryNodesKeepsItsMemsetAndReplaysFromOneExecutable) {
  // A stream-ordered allocation inside the capture makes memory nodes: the driver removes no node
  // from such a graph and instantiates it once at a time, so end_capture (asked for twins) must
  // leave the memset and make one executable, and the replays still give x + 0 = x.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  const Tensor x = to_gpu(randn({2, 257}, DType::kFP32, seed));
  Tensor y = poisoned_gpu({2, 257}, DType::kFP32);
  cuda::Graph graph;
  graph.begin_capture(caller_);
  void* zeros = nullptr;
  ASSERT_EQ(cudaMallocAsync(&zeros, x.nbytes(), caller_), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(zeros, 0, x.nbytes(), caller_), cudaSuccess);
  ops::add(x, Tensor::from_blob(zeros, {2, 257}, DType::kFP32, Device::cuda(0)), y, caller());
  ASSERT_EQ(cudaFreeAsync(zeros, caller_), cudaSuccess);
  graph.end_capture(/*twin=*/true);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "end_capture left an error for the next launch";
  for (int replay = 0; replay < 3; ++replay) {
    y.fill_nan_();
    cuda::device_synchronize(0);
    graph.replay(caller_);
    EXPECT_TRUE(bitwise_equal(fetch(y), fetch(x))) << "replay " << replay;
  }
}

}  // namespace
}  // namespace locus::testing
