// Internal to the CUDA backend's attention kernels (device code): where one sequence of a launch
// finds its operands (MlaAttentionArgs::num_seqs, or a decode table).
#pragma once
#include <cstdint>

#include "backends/cuda/attention_kernels.h"

namespace locus::cuda::detail {

// Sequence `seq`'s operands (MlaAttentionArgs::num_seqs): its query and output rows and its keys.
// `a` lives in the launch's parameters (__grid_constant__), so the per-sequence arrays are read
// from there, not copied; a table's entries come from device memory.
__device__ __forceinline__ AttnSeqOperands seq_operands(const MlaAttentionArgs& a, int seq) {
  AttnSeqOperands o{a.q_a, a.q_b, a.k_a, a.k_b, a.v, a.out, a.q_start};
  if (a.num_seqs > 0) {
    const int64_t r0 = static_cast<int64_t>(seq) * a.T;
    o.q_a.ptr = static_cast<const uint16_t*>(a.q_a.ptr) + r0 * a.q_a.row_stride;
    o.q_b.ptr = static_cast<const uint16_t*>(a.q_b.ptr) + r0 * a.q_b.row_stride;
    o.out = static_cast<char*>(a.out) + r0 * a.out_row_stride * (a.out_f32 ? 4 : 2);
    const bool table = a.table_rows != nullptr;
    const uint16_t* k = table ? reinterpret_cast<const uint16_t*>(a.table_rows[seq])
                              : static_cast<const uint16_t*>(a.seq_k_a[seq]);
    o.k_a.ptr = k;
    o.k_b.ptr = k + a.k_b_delta;
    o.v.ptr = k + a.v_delta;
    o.q_start = table ? a.table_lengths[seq] : a.seq_keys[seq] - a.T;
  }
  return o;
}

}  // namespace locus::cuda::detail
