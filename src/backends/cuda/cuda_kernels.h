// Internal to the CUDA backend: host-side launchers for the kernels in the .cu files, so that the
// C++ sources (cuBLASLt glue, green contexts, op validation) stay plain host code.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace locus::cuda::detail {

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

// NVFP4 weight-only GEMM on the kCudaTiled layout (see nvfp4_layout.h).
struct Nvfp4GemmArgs {
  const uint16_t* x; int64_t x_ld;   // bf16 [M, K], rows 16-byte aligned
  const uint8_t* w_tiles;            // packed tiles [N16/16][K64/64][32 lanes][16 bytes]
  const uint16_t* w_scales;          // [N16/16][K64/64][32 lanes] two re-encoded scale bytes
  const float* global_scale;         // device pointer (rewritten in place on reload)
  int64_t n, k, m;                   // logical sizes; n = output columns
  int64_t k_chunks;                  // K64 / 64
  const void* bias; bool bias_f32;   // nullptr: no bias
  void* y; int64_t y_ld; bool y_f32;
  bool swiglu;                       // gate rows [0, n), up rows [n16, n16 + n) of the tiles
  int64_t up_tile_offset;            // row-tile index where the up rows start (swiglu only)
};
void launch_nvfp4_gemm(const Nvfp4GemmArgs& a, cudaStream_t stream);

}  // namespace locus::cuda::detail
