// Internal to the CUDA backend: a captured graph's memset nodes turned into kernel nodes.
// Why: in a decode step's graph, cuBLASLt's split-K o_proj brings a memset node (0.8 us), and the
// GEMM after it started 5-6 us after the memset ended, each layer (H100 kernel trace,
// docs/benchmarks.md); a kernel node hands over to the next kernel as any kernel does.
#pragma once
#include <cuda_runtime_api.h>

namespace locus::cuda::detail {

// Replaces every memset node at the top level of `graph` by a kernel node that writes the same
// elements (1, 2 or 4 bytes each, rows of `width` elements `pitch` bytes apart), with the memset
// node's dependencies and dependents and their edge data. Returns how many it replaced. A node
// the driver will not let us replace stays a memset (a warning names the call that failed, once).
// A graph with memory (allocation or free) nodes keeps its memsets: the driver removes no node
// from such a graph.
int memset_nodes_to_kernels(cudaGraph_t graph);

// Whether `graph` has memory nodes at its top level (then it may also be instantiated only once
// at a time).
bool has_memory_nodes(cudaGraph_t graph);

}  // namespace locus::cuda::detail
