// The CUDA forms of ops/kv_table.h (the op validates the operands first). `stream` is a
// cudaStream_t. Both read the table on the device and are capturable in a CUDA graph: a replay
// sees the table's contents at that time. No CUDA header is included here.
#pragma once
#include "core/tensor.h"
#include "ops/kv_table.h"

namespace locus::cuda {

// One CTA per sequence copies its row (kv_append_kernel.cu).
void kv_append_rows(const Tensor& src, const ops::KvTable& table, void* stream);
// lengths[b] += 1 (kv_append_kernel.cu).
void kv_lengths_advance(const Tensor& lengths, void* stream);
// The tensor-core attention kernel with each sequence's key address and length read from the
// table, up to kAttnMaxSeqs sequences a launch, key splits planned for table.max_keys
// (cuda_attention.cpp).
void mla_attention_table(const Tensor& q_a, const Tensor& q_b, const ops::KvTable& table, const Tensor& out,
                         float scale, void* stream);

}  // namespace locus::cuda
