// Memset nodes as kernel nodes (graph_memset_nodes.h).
#include "backends/cuda/graph_memset_nodes.h"

#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_check.h"

namespace locus::cuda::detail {
namespace {

// What cudaMemsetParams describes: `height` rows of `width` elements of `element_size` bytes,
// `pitch` bytes apart, each set to the low bytes of `value`.
__global__ void graph_memset_kernel(char* dst, size_t pitch, unsigned value, unsigned element_size, size_t width,
                                    size_t height) {
  const size_t n = width * height;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    char* p = dst + (i / width) * pitch + (i % width) * element_size;
    if (element_size == 4) *reinterpret_cast<uint32_t*>(p) = value;
    else if (element_size == 2) *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(value);
    else *p = static_cast<char>(value);
  }
}

std::vector<cudaGraphNode_t> graph_nodes(cudaGraph_t g) {
  size_t n = 0;
  LOCUS_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) LOCUS_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  return nodes;
}

// A node's incoming (dependencies) or outgoing (dependents) edges.
struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

Edges edges_of(cudaGraphNode_t node, bool incoming) {
  auto query = incoming ? cudaGraphNodeGetDependencies : cudaGraphNodeGetDependentNodes;
  Edges e;
  size_t n = 0;
  LOCUS_CUDA_CHECK(query(node, nullptr, nullptr, &n));
  e.nodes.resize(n);
  e.data.resize(n);
  if (n > 0) LOCUS_CUDA_CHECK(query(node, e.nodes.data(), e.data.data(), &n));
  return e;
}

// The memset node `node` of `g` as a kernel node with the same edges.
void replace_by_kernel(cudaGraph_t g, cudaGraphNode_t node) {
  cudaMemsetParams p{};
  LOCUS_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &p));
  LOCUS_CHECK(p.elementSize == 1 || p.elementSize == 2 || p.elementSize == 4, "a graph memset node of ",
              p.elementSize, "-byte elements");
  const Edges in = edges_of(node, true), out = edges_of(node, false);
  char* dst = static_cast<char*>(p.dst);
  size_t pitch = p.pitch;
  unsigned value = p.value, element_size = p.elementSize;
  size_t width = p.width, height = p.height;
  void* args[] = {&dst, &pitch, &value, &element_size, &width, &height};
  constexpr unsigned kThreads = 256;
  const size_t blocks = (width * height + kThreads - 1) / kThreads;
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(&graph_memset_kernel);
  kp.gridDim = dim3(static_cast<unsigned>(blocks < 1 ? 1 : blocks > 1024 ? 1024 : blocks));
  kp.blockDim = dim3(kThreads);
  kp.kernelParams = args;
  cudaGraphNode_t kernel = nullptr;
  LOCUS_CUDA_CHECK(cudaGraphAddKernelNode(&kernel, g, nullptr, 0, &kp));
  if (!in.nodes.empty()) {
    const std::vector<cudaGraphNode_t> to(in.nodes.size(), kernel);
    LOCUS_CUDA_CHECK(cudaGraphAddDependencies(g, in.nodes.data(), to.data(), in.data.data(), in.nodes.size()));
  }
  if (!out.nodes.empty()) {
    const std::vector<cudaGraphNode_t> from(out.nodes.size(), kernel);
    LOCUS_CUDA_CHECK(cudaGraphAddDependencies(g, from.data(), out.nodes.data(), out.data.data(), out.nodes.size()));
  }
  LOCUS_CUDA_CHECK(cudaGraphDestroyNode(node));
}

}  // namespace

int memset_nodes_to_kernels(cudaGraph_t graph) {
  int replaced = 0;
  for (cudaGraphNode_t node : graph_nodes(graph)) {
    cudaGraphNodeType type{};
    LOCUS_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    replace_by_kernel(graph, node);
    ++replaced;
  }
  return replaced;
}

}  // namespace locus::cuda::detail
