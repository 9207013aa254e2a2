// Internal to the CUDA backend: host-side launchers for the kernels in the .cu files, so that the
// C++ sources (cuBLASLt glue, green contexts, op validation) stay plain host code.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace locus::cuda::detail {

// Reads `bytes` (16-byte aligned, a multiple of 16; zeros) of buf through L2, leaving L2 full of
// its clean lines; *sink is never written for a buffer of zeros. With let_next_start each CTA
// lets the next kernel launch as it starts (programmatic dependent launch), as the decode step's
// small kernels do: a next kernel launched with that attribute starts during the sweep's last wave.
void launch_l2_sweep(const void* buf, size_t bytes, unsigned* sink, cudaStream_t stream, bool let_next_start);

// One warp that only waits for the kernel before it, launched as a decode step's next small kernel
// is (launch_small_op: it may start during that kernel's last wave unless LOCUS_SMALL_OPS_PDL=0):
// after one kernel it costs nearly nothing; after a join of streams (a fork/join) it waits for the
// join and then pays its whole start, as the step's next kernel does.
void launch_waiting_successor(cudaStream_t stream);

// Every block spins briefly, then sets seen[smid] = 1 (seen holds 1024 entries).
void launch_smid_probe(unsigned* seen, int blocks, cudaStream_t stream);

// y[m, i] = silu(g[m, i]) * u[m, i], read as fp32 (is_f32) or bf16, written as fp32 or bf16.
struct SwigluArgs {
  const void* gate; const void* up;  // element pointers of column 0
  int64_t gate_ld, up_ld;            // row strides in elements
  bool in_f32;
  void* y; int64_t y_ld; bool out_f32;
  int64_t m, i;
};
void launch_swiglu(const SwigluArgs& a, cudaStream_t stream);

// dst[i] = float(bf16 src[i])
void launch_bf16_to_f32(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream);

// dst[r, c] = bf16(src[r, c]) (round to nearest even), strided rows.
void launch_f32_to_bf16_2d(const float* src, int64_t src_ld, uint16_t* dst, int64_t dst_ld, int64_t rows, int64_t cols,
                           cudaStream_t stream);

// A prepared (kCudaTiled) NVFP4 weight dequantized into bf16 rows: out[r, k] = e2m1 * block scale
// * 2^-16 for r < n, k < chunks * 64 (exact), and *alpha_out = global scale * 2^16, so that
// alpha_out * (x out^T) is the product with the dequantized weight.
void launch_nvfp4_dequant(const uint8_t* tiles, const uint16_t* scales, const float* global_scale, int64_t n,
                          int64_t chunks, uint16_t* out, int64_t out_ld, float* alpha_out, cudaStream_t stream);

}  // namespace locus::cuda::detail
