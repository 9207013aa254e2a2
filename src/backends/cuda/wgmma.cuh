// Internal to the CUDA backend (device code, sm_90a): warpgroup MMA (wgmma) with the A operand in
// registers and B in shared memory, as the NVFP4 decode kernel uses it (nvfp4_wgmma.h).
//
// wgmma.mma_async m64nNk16 (bf16 in, fp32 accumulate) is issued by the 4 warps of a warpgroup
// together. Warp w holds A rows 16w..16w+15 in the mma.m16n8k16 A-fragment order
// (mma_fragments.cuh) and D rows 16w..16w+15: d[4i + 0, 1] = (row g, columns 8i + 2t, + 1),
// d[4i + 2, 3] = (row g + 8, the same columns), lane = 4g + t. B (N x 16, K-major) is read from
// shared memory through a descriptor: here rows of 128 bytes (64 K values) in the 128-byte
// swizzle (16-byte piece p of row n at n * 128 + ((p ^ (n % 8)) * 16), 8-row atoms 1024 bytes
// apart, the tile 1024-byte aligned); k-step s of the row starts 32 s bytes in.
//
// The instructions run asynchronously: registers they read (A) or write (D) must not be touched
// until wgmma_wait says they are done. So A registers are rewritten only after a wait, and the
// compiler is told not to read D before one (wgmma_keep).
#pragma once
#include <cstdint>

namespace locus::cuda::detail {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LOCUS_WGMMA 1
#else
#define LOCUS_WGMMA 0
#endif

// The descriptor of a K-major, 128-byte-swizzled B tile whose k-step starts at shared address `addr`.
__device__ __forceinline__ uint64_t wgmma_desc_k128(uint32_t addr) {
  constexpr uint64_t kLeading = 1;             // unused with this swizzle (16 bytes)
  constexpr uint64_t kStride = 1024 >> 4;      // next 8-row atom
  constexpr uint64_t kSwizzle128 = 1;
  return ((addr & 0x3FFFFu) >> 4) | (kLeading << 16) | (kStride << 32) | (kSwizzle128 << 62);
}

// Orders earlier register writes (A, D) before the wgmma instructions that follow.
__device__ __forceinline__ void wgmma_fence() {
#if LOCUS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if LOCUS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
// Waits until at most N committed groups are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if LOCUS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// Ties accumulators (D) to the point after a wgmma_wait: the compiler must not read them earlier,
// so they are "rewritten" here (an empty asm; no instruction is emitted).
template <int R>
__device__ __forceinline__ void wgmma_keep(float (&r)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// d = A (64 x 16, registers a0..a3) * B (N x 16 at descriptor `desc`)^T (+ d when `accumulate`),
// N = 8 * NB. Starting a sum with accumulate = false (rather than zeroing d) keeps d written by
// wgmma alone, so ptxas need not wait for the running group where a loop would zero it.
template <int NB>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[NB * 4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint64_t desc, bool accumulate);

template <>
__device__ __forceinline__ void wgmma_bf16_rs<4>(float (&d)[16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint64_t desc, bool accumulate) {
#if LOCUS_WGMMA
  asm volatile(
      "{\n.reg .pred acc;\nsetp.ne.b32 acc, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, acc, 1, 1, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(static_cast<uint32_t>(accumulate)));
#endif
}

template <>
__device__ __forceinline__ void wgmma_bf16_rs<8>(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint64_t desc, bool accumulate) {
#if LOCUS_WGMMA
  asm volatile(
      "{\n.reg .pred acc;\nsetp.ne.b32 acc, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,"
      "%30,%31}, {%32,%33,%34,%35}, %36, acc, 1, 1, 0;\n}"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(static_cast<uint32_t>(accumulate)));
#endif
}

}  // namespace locus::cuda::detail
