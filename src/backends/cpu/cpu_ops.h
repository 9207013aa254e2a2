// The CPU backend's op implementations, called by the dispatchers in src/ops/ for CPU tensors.
// Same contracts as the ops/ headers; operands arrive validated (shapes, dtypes, devices), so
// these functions only assert what the dispatchers cannot know. `pool` is the worker group to
// run on (cpu::ThreadPool::from_native(stream.native)).
#pragma once
#include <cstdint>

#include "backends/cpu/thread_pool.h"
#include "core/tensor.h"
#include "ops/nvfp4.h"
#include "ops/rope.h"

namespace locus::cpu {

// ---- dense products (fixed K order per output element; see dot_kernel.h) ----
void gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, ThreadPool& pool);
void gemm_swiglu(const Tensor& x, const Tensor& w_gate_up, const Tensor& y, ThreadPool& pool);
void swiglu(const Tensor& gate_up, const Tensor& y, ThreadPool& pool);
void bmm(const Tensor& a, const Tensor& b, const Tensor& y, ThreadPool& pool);

// ---- NVFP4 (ModelOpt) ----
float nvfp4_global_scale_for(const Tensor& w, ThreadPool& pool);
// The row-major index of w's first non-finite element, -1 when all are finite.
int64_t first_non_finite(const Tensor& w, ThreadPool& pool);
ops::Nvfp4Weight nvfp4_quantize(const Tensor& w, float global_scale, ThreadPool& pool);
Tensor nvfp4_dequantize(const ops::Nvfp4Weight& w, ThreadPool& pool);
void nvfp4_gemm(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y, ThreadPool& pool);
void nvfp4_gemm_swiglu(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& y, ThreadPool& pool);
// Rows [n0, n0 + rows) of a kLinear weight dequantized to fp32 into out[rows][k] (the one
// dequantization formula every CPU path uses: e2m1(q) * (fp32(scale) * global_scale)).
void nvfp4_dequantize_rows(const ops::Nvfp4Weight& w, int64_t n0, int64_t rows, float* out);

// ---- normalization and element-wise ----
void rmsnorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, ThreadPool& pool);
void add(const Tensor& a, const Tensor& b, const Tensor& y, ThreadPool& pool);
void cast(const Tensor& x, const Tensor& y, ThreadPool& pool);
void embedding(const Tensor& table, const Tensor& ids, const Tensor& y, ThreadPool& pool);

// ---- rotary embedding, softmax, top-k ----
void apply_rope(const Tensor& x, const Tensor& positions, const ops::RopeTable& table, bool interleaved,
                ThreadPool& pool);
void softmax(const Tensor& x, const Tensor& y, ThreadPool& pool);
void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices, ThreadPool& pool);

// Reads index i of an i32/i64 tensor (any strides).
int64_t load_index(const Tensor& ids, int64_t i);

}  // namespace locus::cpu
