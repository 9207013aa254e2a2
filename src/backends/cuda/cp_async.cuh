// Internal to the CUDA backend (device code): cp.async (global -> shared without registers, so
// that many copies are in flight per warp) and the shared-memory loads the streaming kernels use.
#pragma once
#include <cstdint>

namespace locus::cuda::detail {

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid = true) {
  // With a source size of 0 nothing is read and the 16 bytes are zero-filled.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// 4 bytes (src and dst 4-byte aligned); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid = true) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
// Makes this thread's completed shared-memory writes visible to the async proxy (wgmma operands).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// cp.async.wait_group with a run-time count (a ring depth chosen at launch): 1 to 3.
__device__ __forceinline__ void cp_async_wait_pending(int n) {
  if (n <= 1) cp_async_wait<1>();
  else if (n == 2) cp_async_wait<2>();
  else cp_async_wait<3>();
}
// Asks L2 to fetch `bytes` (a multiple of 16) from global memory at `p` (16-byte aligned); no
// data comes back to the SM, so it is safe to issue before the producer of nearby data finishes.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
// ldmatrix .x4: lanes 8i..8i+7 give the row addresses (16 bytes each) of 8 x 8 bf16 matrix i;
// r[i] gets the lane's pair of matrix i in mma fragment order (row lane / 4, columns 2 (lane % 4) + 0, 1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// .x4 .trans: the same, each matrix transposed (r[i] = the lane's (column lane / 4, rows 2 (lane % 4) + 0, 1)).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// .x2: matrices 0 and 1 (lanes 0..15 give the row addresses).
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ uint32_t lds16(uint32_t addr) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}

}  // namespace locus::cuda::detail
