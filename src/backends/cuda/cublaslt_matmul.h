// Internal to the CUDA backend: one cuBLASLt matmul in column-major terms, with a handle and a
// workspace per stream (so each domain's partition stream has its own) and a tactic cache: the
// heuristic's candidates (on a partition stream, those for its SM count as well) timed once per
// shape outside any capture, keyed by shape, dtypes, alignments, epilogue and the stream's SM
// partition size.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace locus::cuda::detail {

struct LtMatmul {
  bool trans_a = false, trans_b = false;  // op(A), op(B) in cuBLAS column-major terms
  int64_t m = 0, n = 0, k = 0;            // D is m x n
  int64_t lda = 0, ldb = 0, ldd = 0;      // leading dimensions of the stored matrices
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;
  const void* a = nullptr;  // bf16
  const void* b = nullptr;  // bf16
  void* d = nullptr;
  bool d_f32 = false;
  const void* bias = nullptr;  // per row of D (length m), or nullptr
  bool bias_f32 = false;
  // D = alpha * op(A) op(B) (+ bias): alpha = 1, or an fp32 read from device memory at run time
  // (the NVFP4 global scale, so in-place reloads reach captured graphs).
  const float* alpha_device = nullptr;
};

void lt_matmul(const LtMatmul& mm, cudaStream_t stream);

// Stream-ordered scratch (cudaMallocAsync: capturable, becomes a graph memory node).
void* scratch_alloc(size_t bytes, cudaStream_t stream);
void scratch_free(void* p, cudaStream_t stream);

// Number of tactic-cache entries (for tests and benchmarks).
size_t tactic_cache_size();

}  // namespace locus::cuda::detail
