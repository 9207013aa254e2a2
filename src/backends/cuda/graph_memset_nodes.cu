// Memset nodes as kernel nodes (graph_memset_nodes.h).
#include "backends/cuda/graph_memset_nodes.h"

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
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

// Why a memset node stayed one: the call that failed and its error.
struct Refusal {
  const char* call = nullptr;
  cudaError_t error = cudaSuccess;
};

// The memset node `node` of `g` as a kernel node with the same edges. The memset node is removed
// only once the kernel node has all of its edges; a call that fails before that removes the kernel
// node again, which leaves the graph as it was, and is returned.
Refusal replace_by_kernel(cudaGraph_t g, cudaGraphNode_t node) {
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
  cudaError_t e = cudaGraphAddKernelNode(&kernel, g, nullptr, 0, &kp);
  if (e != cudaSuccess) return {"cudaGraphAddKernelNode", e};
  if (!in.nodes.empty()) {
    const std::vector<cudaGraphNode_t> to(in.nodes.size(), kernel);
    e = cudaGraphAddDependencies(g, in.nodes.data(), to.data(), in.data.data(), in.nodes.size());
    if (e != cudaSuccess) {
      LOCUS_CUDA_CHECK(cudaGraphDestroyNode(kernel));
      return {"cudaGraphAddDependencies (the memset's dependencies)", e};
    }
  }
  if (!out.nodes.empty()) {
    const std::vector<cudaGraphNode_t> from(out.nodes.size(), kernel);
    e = cudaGraphAddDependencies(g, from.data(), out.nodes.data(), out.data.data(), out.nodes.size());
    if (e != cudaSuccess) {
      LOCUS_CUDA_CHECK(cudaGraphDestroyNode(kernel));
      return {"cudaGraphAddDependencies (the memset's dependents)", e};
    }
  }
  LOCUS_CUDA_CHECK(cudaGraphDestroyNode(node));
  return {};
}

// The edge types of `e`, for the refusal's message.
std::string edge_types(const Edges& e) {
  std::string s;
  for (const cudaGraphEdgeData& d : e.data)
    s += std::to_string(int(d.type)) + "/" + std::to_string(int(d.from_port)) + "/" + std::to_string(int(d.to_port)) + " ";
  return s.empty() ? "none" : s;
}

}  // namespace

bool has_memory_nodes(cudaGraph_t graph) {
  for (cudaGraphNode_t node : graph_nodes(graph)) {
    cudaGraphNodeType type{};
    LOCUS_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeMemAlloc || type == cudaGraphNodeTypeMemFree) return true;
  }
  return false;
}

int memset_nodes_to_kernels(cudaGraph_t graph) {
  if (has_memory_nodes(graph)) return 0;
  int replaced = 0;
  for (cudaGraphNode_t node : graph_nodes(graph)) {
    cudaGraphNodeType type{};
    LOCUS_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    const Refusal r = replace_by_kernel(graph, node);
    if (r.call == nullptr) {
      ++replaced;
      continue;
    }
    // The memset stays (it is correct, only slower); the failed call must not leave its error for
    // the next launch's check to report.
    cudaGetLastError();
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr, "locus: warning: a graph memset node stays a memset: %s failed: %s (edges in: %s; out: %s)\n",
                   r.call, cudaGetErrorName(r.error), edge_types(edges_of(node, true)).c_str(),
                   edge_types(edges_of(node, false)).c_str());
    });
  }
  return replaced;
}

}  // namespace locus::cuda::detail
