// Decode steps whose per-step inputs live on the device, so that a step can be captured once in a
// CUDA graph and replayed while the caches grow: each sequence's latent KV cache is reached
// through a table of addresses and lengths that the step reads at run time, never through
// host-side views (whose pointers and lengths a graph would freeze).
//
// The table is the caller's promise: rows[b] is the address of row 0 of sequence b's cache, a
// contiguous bf16 [capacity, width] tensor on the op's device, with lengths[b] + 1 <= capacity and
// lengths[b] + 1 <= max_keys. The ops cannot check addresses on the device; runtime/decode_graphs
// builds the table from the caches themselves and checks their capacities on the host first.
#pragma once
#include <cstdint>

#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

struct KvTable {
  Tensor rows;           // i64 [B]: address of each sequence's cache row 0
  Tensor lengths;        // i32 [B]: tokens each cache holds before this step (its new token's position)
  int64_t width = 0;     // values per cached row (kv_lora_rank + rope_dim)
  int64_t max_keys = 0;  // every lengths[b] + 1 is at most this (sizes the attention launch)
};

// Appends one row per sequence: row lengths[b] of sequence b's cache = src[b] (bf16 [B, width],
// unit last stride).
void kv_append_rows(const Tensor& src, const KvTable& table, const Stream& stream = {});

// lengths[b] += 1 for every sequence (i32 [B], contiguous): a decode step leaves its table's
// lengths ready for the next step, so that a step chained on the device (runtime::DecodeGraphs)
// needs nothing from the host.
void kv_lengths_advance(const Tensor& lengths, const Stream& stream = {});

// Absorbed decode attention (ops::mla_attention_batch with one query row per sequence) with each
// sequence's keys in its cache: k_a = v = columns [0, Da), k_b = columns [Da, width), and
// lengths[b] + 1 keys (the appended row included). q_a bf16 [B, H, Da], q_b bf16 [B, H, width - Da],
// out bf16 or fp32 [B, H, Da]. The same as mla_attention_batch over those views (bitwise on the CPU).
void mla_attention_table(const Tensor& q_a, const Tensor& q_b, const KvTable& table, const Tensor& out, float scale,
                         const Stream& stream = {});

}  // namespace locus::ops
