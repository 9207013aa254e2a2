// NVFP4 products where each row takes its weight from a set by an id that lives on the device:
// a MoE's decode, where token t's j-th routed expert is ids[t, j]. On CUDA the ids are never read
// on the host, so nothing waits for the routing (and the step can run ahead of the device, or be
// captured in a graph), at the price of one weight read per (token, choice) where tokens share an
// expert: for few tokens per expert (decode) that is the same bytes.
#pragma once
#include <mutex>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"
#include "ops/nvfp4.h"

namespace locus::ops {

// Weights of one shape (N x K, one layout, prepared for one device), by id. Held by pointer: the
// weights must outlive the set. On CUDA the kernel reads a device table of their buffers, built at
// first use and again whenever a weight's buffers moved (localize, a rebuild); in-place reloads
// keep the buffers, so they need nothing.
class Nvfp4WeightSet {
 public:
  explicit Nvfp4WeightSet(std::vector<const Nvfp4Weight*> weights);
  const std::vector<const Nvfp4Weight*>& weights() const { return weights_; }
  int64_t size() const { return static_cast<int64_t>(weights_.size()); }
  // The device table (CUDA weights only).
  Tensor device_table() const;

 private:
  std::vector<const Nvfp4Weight*> weights_;
  mutable std::mutex mu_;
  mutable std::vector<const void*> table_of_;  // the buffers the table was built from
  mutable Tensor table_;
};

// y[t*k + j, :] = x[t, :] dequant(W)^T for W = set[ids[t, j]], every token t and choice j (with
// swiglu: silu(gate) * up of fused [2N, K] weights). x bf16 [T, K]; ids i32 [T, k] on x's
// device; y bf16 or fp32 [T*k, N] (rows of unit column stride). Each row is what nvfp4_gemm (or
// nvfp4_gemm_swiglu) on that token's row with that weight gives: bitwise on the CPU (the calls
// it makes), within fp32 rounding on CUDA. An id outside [0, set.size()): on the CPU an Error
// naming it; on CUDA (ids not read on the host) that row of y is zero.
void nvfp4_gemm_indexed(const Tensor& x, const Tensor& ids, const Nvfp4WeightSet& set, const Tensor& y, bool swiglu,
                        const Stream& stream = {});

// One product of nvfp4_gemm_indexed's form: y[t*k + j] = x[t] W^T for W = set[ids[t, j]].
struct Nvfp4IndexedProduct {
  Tensor x, ids;
  const Nvfp4WeightSet* set = nullptr;
  Tensor y;
};
// Several such products whose weights share one shape, each as nvfp4_gemm_indexed computes it:
// on CUDA in one launch (a MoE decode's routed experts and its shared expert, whose ids are a
// constant column), so that they pay one launch's fill and drain. Every y is a view of the first
// product's storage at or after its start (one output base for the launch), of one dtype.
void nvfp4_gemm_indexed(const std::vector<Nvfp4IndexedProduct>& products, bool swiglu, const Stream& stream = {});

}  // namespace locus::ops
