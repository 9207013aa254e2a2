// CPU implementations of ops/moe_routing.h (contracts there); operands are validated by ops/.
#pragma once
#include "backends/cpu/thread_pool.h"
#include "core/tensor.h"
#include "ops/moe_routing.h"

namespace locus::cpu {

// forced_ids defined: those experts instead of steps 2-4 (ops::moe_route_forced).
void moe_route(const Tensor& logits, const Tensor& correction_bias, const ops::MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, ThreadPool& pool, const Tensor& forced_ids = Tensor());
// Sequential (one counting pass, one placement pass): the ids are few (T * k).
void moe_group(const Tensor& ids, int64_t num_experts, const Tensor& offsets, const Tensor& rows, const Tensor& slot);
void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, ThreadPool& pool);
void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, ThreadPool& pool);

}  // namespace locus::cpu
