// The CUDA backend's MoE routing ops (kernels in moe_*.cu), called by the dispatchers in
// src/ops/moe_routing.cpp when the tensors live on a CUDA device. Same contracts as
// ops/moe_routing.h; operands arrive validated there (shapes, dtypes, devices, aliasing), so call
// these through ops::. `stream` is a cudaStream_t (nullptr = the legacy default stream). The four
// ops only enqueue kernels (no allocation, copy or synchronization: capturable). Values that live
// on the device (ids, rows, slots) are never read on the host: the kernels skip or zero-fill bad
// ones as the ops header documents. No CUDA header is included here.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "ops/moe_routing.h"

namespace locus::cuda {

// One warp per token; E <= 512, top_k <= 32, n_group <= 32 (an Error names a larger one).
void moe_route(const Tensor& logits, const Tensor& correction_bias, const ops::MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, void* stream);
// Three kernels: per-expert counts, one scan into offsets, per-expert ordered placement
// (warp ballots). No atomics, so the output does not depend on scheduling.
void moe_group(const Tensor& ids, int64_t num_experts, const Tensor& offsets, const Tensor& rows, const Tensor& slot,
               void* stream);
void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, void* stream);
void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, void* stream);

}  // namespace locus::cuda
