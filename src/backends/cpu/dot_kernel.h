// The one arithmetic core shared by every CPU matrix product (gemm, gemm_swiglu, bmm, nvfp4_gemm).
//
// Determinism contract: the dot product of x row i and w row j is accumulated in kDotLanes fp32
// partial sums, lane l taking k = l, l + 8, l + 16, ... in increasing k, and the lanes are
// combined by reduce_lanes() in one fixed tree. A K tail (K % 8) is read into zero-filled lanes,
// so it is the same as zero padding. No path reorders this: tile shape, tile position, K
// blocking (partial lane sums are stored and reloaded exactly), threads and instruction set
// (the AVX2 variant has no FMA, so it rounds exactly as the baseline one) all leave every bit of
// the result unchanged.
#pragma once
#include <cstdint>

namespace locus::cpu::detail {

constexpr int kDotLanes = 8;
constexpr int kMaxTileM = 4;
constexpr int kMaxTileN = 4;

// acc[(i * acc_ld + j) * kDotLanes + l] += sum over k in [0, klen) with k % 8 == l of x[i][k] * w[j][k],
// for i < mr, j < nr. klen must be a multiple of 8 except for the last block of a row.
// x rows are fp32; w rows are fp32 or bf16 (raw bits), read exactly klen elements each.
void dot_tile(int mr, int nr, const float* const* x, const float* const* w, int64_t klen, float* acc,
              int64_t acc_ld);
void dot_tile(int mr, int nr, const float* const* x, const uint16_t* const* w, int64_t klen, float* acc,
              int64_t acc_ld);

// The fixed combination of the lane partial sums.
inline float reduce_lanes(const float* a) {
  float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  return (s0 + s2) + (s1 + s3);
}

// Register tile the kernels are run at (depends on the instruction set, never on the result).
struct TileShape {
  int mr, nr;
};
TileShape preferred_tile(int64_t m);
const char* dot_kernel_isa();  // "avx2" or "baseline"

// A specific instruction-set variant, for tests that prove the variants agree bit for bit.
enum class DotIsa { kBaseline, kAvx2 };
bool dot_isa_available(DotIsa isa);
void dot_tile_isa(DotIsa isa, int mr, int nr, const float* const* x, const float* const* w, int64_t klen, float* acc,
                  int64_t acc_ld);
void dot_tile_isa(DotIsa isa, int mr, int nr, const float* const* x, const uint16_t* const* w, int64_t klen,
                  float* acc, int64_t acc_ld);

}  // namespace locus::cpu::detail
