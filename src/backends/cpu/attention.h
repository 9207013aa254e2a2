// CPU implementation of ops::mla_attention (see ops/attention.h for the contract). The entry point
// in ops/ validates the operands; this runs over (token, head) pairs on the given pool.
#pragma once
#include "backends/cpu/thread_pool.h"
#include "core/tensor.h"

namespace locus::cpu {

void mla_attention(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b, const Tensor& v,
                   const Tensor& out, float scale, int64_t q_start, ThreadPool& pool);

}  // namespace locus::cpu
