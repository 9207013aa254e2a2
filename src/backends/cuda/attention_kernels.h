// Internal to the CUDA backend: the MLA attention kernels (ops/attention.h has the contract) and
// their host-side launchers. cuda_attention.cpp turns tensors into MlaAttentionArgs, picks a
// kernel and plans the key splits; the kernels live in the attention_*.cu files.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace locus::cuda::detail {

// One [rows, heads, dim] operand: element pointer of (0, 0, 0) and its strides in elements.
// A head stride of 0 makes every query head read head 0 (the operand's one shared head).
struct AttnOperand {
  const void* ptr = nullptr;
  int64_t row_stride = 0, head_stride = 0;
  bool f32 = false;  // fp32 elements, else bf16
};

// Sequences one launch may hold (mla_attention_batch); their key pointers travel in the launch's
// parameters.
constexpr int kAttnMaxSeqs = 64;

struct MlaAttentionArgs {
  AttnOperand q_a, q_b, k_a, k_b, v;
  void* out = nullptr;
  int64_t out_row_stride = 0, out_head_stride = 0;
  bool out_f32 = false;
  int64_t T = 0, H = 0, S = 0;  // query tokens, query heads, keys
  int Da = 0, Db = 0, Dv = 0;
  int64_t q_start = 0;
  float scale = 1.f;
  // The tensor-core kernel reads v's tile from k_a's (v and k_a are one view: the absorbed
  // decode's latent cache).
  bool v_is_k_a = false;
  // Query rows that share one K/V head form a group: all T*H rows when k_a, k_b and v have one
  // shared head (absorbed decode), else one group of T rows per query head.
  bool per_head_groups = false;
  // A batch of sequences (num_seqs > 0, one per blockIdx.z; one in blockIdx.y for the combine):
  // sequence i owns query and output rows [i*T, (i+1)*T) and attends seq_keys[i] keys at
  // seq_k_a[i] (its k_a row 0), with k_b and v at the same element offsets from it as in sequence
  // 0 (k_b_delta, v_delta); its queries are its last T keys. The operands above then describe
  // sequence 0 (S: the most keys of any sequence).
  int num_seqs = 0;
  int64_t k_b_delta = 0, v_delta = 0;
  const void* seq_k_a[kAttnMaxSeqs] = {};
  int32_t seq_keys[kAttnMaxSeqs] = {};
  // Or, when table_rows is set (ops::mla_attention_table, for decode steps captured in graphs),
  // from device memory read at run time: sequence i's k_a is at address table_rows[i] and it
  // attends table_lengths[i] + T keys. S is then the table's bound.
  const int64_t* table_rows = nullptr;
  const int32_t* table_lengths = nullptr;
};

// One sequence's operands in a launch: args' own without a batch (seq 0).
struct AttnSeqOperands {
  AttnOperand q_a, q_b, k_a, k_b, v;
  void* out;
  int64_t q_start;
};

// Scores are kept in the log2 domain (scale * log2(e)) so the softmax uses exp2.
constexpr float kAttnLog2e = 1.4426950408889634f;

// raise_dynamic_smem_limit: cuda_check.h.

// ---- tensor-core kernel (bf16 inputs): flash attention with an online softmax in fp32 ----

// Dynamic shared memory the tensor-core kernel needs for these dims, or 0 when it does not
// apply (an fp32 input, Dv > 512). The caller also compares it with the device's limit.
int attn_tc_smem_bytes(const MlaAttentionArgs& a);
// Resident CTAs per SM of the tensor-core kernel for these dims (occupancy query, cached).
int attn_tc_ctas_per_sm(const MlaAttentionArgs& a, int device);
// Query rows per CTA and keys per tile of the tensor-core kernel (the split planner's units).
constexpr int kAttnTcRows = 64;
constexpr int kAttnTcKeys = 32;

// Key splits (flash-decoding): CTA split z covers keys [z * split_keys, (z + 1) * split_keys).
// With splits == 1 the kernel writes `out`; otherwise it writes unnormalized partial sums to
// `partial_o` [splits][T*H][Dv] and (running max, sum) to `partial_ml` [splits][T*H][2], and
// launch_attn_combine merges them into `out` in a fixed order.
struct AttnSplit {
  int splits = 1;
  int64_t split_keys = 0;  // a multiple of kAttnTcKeys
  float* partial_o = nullptr;
  float* partial_ml = nullptr;
  // The decode kernel only: one zero counter per (sequence, head group), or nullptr. With them the
  // last CTA of a head group to finish merges its splits (launch_attn_combine's result, bit for
  // bit) and sets its counter back to zero; without them launch_attn_combine must follow.
  unsigned* counters = nullptr;
};
void launch_attn_tc(const MlaAttentionArgs& a, const AttnSplit& split, int smem_bytes, cudaStream_t stream);
void launch_attn_combine(const MlaAttentionArgs& a, const AttnSplit& split, cudaStream_t stream);
constexpr int kAttnMaxSplits = 256;

// ---- decode kernel (CUDA cores): one query token per sequence over one shared latent head ----
// MLA's absorbed decode at short contexts, where the tensor-core kernel's 64-row tiles leave
// most SMs idle: a CTA takes kAttnDecodeHeads query heads of one sequence and one key split,
// scores its keys (a warp per key), takes the softmax, and sums the values (a thread per pair of
// value columns), in fp32. It writes `out` (one split) or the same partial sums and (max, sum)
// as the tensor-core kernel's splits, merged by launch_attn_combine or by its own last CTA of
// each head group (AttnSplit::counters).
constexpr int kAttnDecodeHeads = 4;
constexpr int kAttnDecodeMaxDa = 512;        // k_a (and v) head dims
constexpr int kAttnDecodeMaxDb = 64;         // k_b head dims
constexpr int kAttnDecodeMaxSplitKeys = 512;  // keys of one split (shared-memory scores)
// Whether the decode kernel takes `a`: one query token per sequence (T = 1), bf16 operands, k_a,
// k_b and v one head shared by every query head, even head dims within the limits above, and
// every pointer and stride whole 32-bit words (8 bytes for an fp32 output).
bool attn_decode_applies(const MlaAttentionArgs& a);
// split.split_keys <= kAttnDecodeMaxSplitKeys (any multiple of 1), split.splits <= kAttnMaxSplits,
// and split.splits * split.split_keys at least every sequence's keys. Unlike the tensor-core
// kernel's, split z of a sequence of S keys covers keys [z * ceil(S / splits), ...): its own keys
// spread evenly over the splits, whatever bound the plan was made for.
void launch_attn_decode(const MlaAttentionArgs& a, const AttnSplit& split, cudaStream_t stream);

// ---- CUDA-core kernel: any dtypes and dims, one warp per (token, head) ----

// Dynamic shared memory it needs (fp32 query and accumulator rows of its warps).
int attn_simt_smem_bytes(const MlaAttentionArgs& a);
void launch_attn_simt(const MlaAttentionArgs& a, cudaStream_t stream);

}  // namespace locus::cuda::detail
