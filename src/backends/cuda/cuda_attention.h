// MLA attention on the CUDA backend, called by ops::mla_attention (ops/attention.h has the
// contract; the op validates the operands before dispatching here). `stream` is a cudaStream_t
// (nullptr = the legacy default stream). Asynchronous and capturable in a CUDA graph: scratch
// for key splits comes from the stream-ordered pool, nothing synchronizes with the host.
// No CUDA header is included here, so host code in other layers can include this file.
#pragma once
#include <cstdint>

#include <vector>

#include "core/tensor.h"
#include "ops/attention.h"

namespace locus::cuda {

void mla_attention(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b, const Tensor& v,
                   const Tensor& out, float scale, int64_t q_start, void* stream);
// ops::mla_attention_batch: one launch of the tensor-core kernel (and one combine) for up to
// kAttnMaxSeqs sequences whose keys share dtypes, strides and the offsets of k_b and v from k_a;
// otherwise one mla_attention per sequence.
void mla_attention_batch(const Tensor& q_a, const Tensor& q_b, const std::vector<ops::AttentionKeys>& keys,
                         const Tensor& out, float scale, void* stream);

// Decode attention (one query token per sequence over one shared latent head) runs on the
// CUDA-core decode kernel where its sequences' keys, summed, are at most `keys` (or each
// sequence's at most min(128, keys), with at most two CTAs per SM), else on the tensor-core one;
// 0 sends all to the tensor-core kernel, -1 restores the default (512, or
// LOCUS_ATTN_DECODE_MAX_KEYS). For tests and benchmarks; a graph keeps the kernel chosen when it
// was captured.
void set_attention_decode_max_keys(int64_t keys);
// The decode kernel's key splits cover at least `keys` keys; -1 restores the default (64, or
// LOCUS_ATTN_DECODE_SPLIT_KEYS). For tests and benchmarks.
void set_attention_decode_split_keys(int64_t keys);
// 1: the decode kernel merges its key splits itself (its last CTA of each head group: the
// default), 0: in a second launch, the combine kernel; -1 restores the default (on, or
// LOCUS_ATTN_DECODE_FUSED_COMBINE). Both give the same bits. For tests and benchmarks.
void set_attention_decode_fused_combine(int64_t on);

}  // namespace locus::cuda
