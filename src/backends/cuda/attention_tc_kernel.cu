// MLA attention on tensor cores (bf16 inputs; see ops/attention.h for the contract).
//
// A CTA owns 64 query rows of one K/V group (kAttnTcRows) and a range of keys, walked in tiles
// of 32 keys (kAttnTcKeys) with a flash-style online softmax:
// - shared memory holds the CTA's query rows [q_a | q_b] once and a double-buffered K tile
//   [k_a | k_b] (cp.async, prefetched one tile ahead) plus a V tile (or none: when v is k_a's
//   view, as in the absorbed decode, V is read from the K tile). Every K/V byte is loaded once
//   per CTA and reused by its 64 rows: with one shared latent head that is 64 (token, head)
//   pairs per load. Head dims are zero-padded to multiples of 16 in shared memory, so any Da,
//   Db, Dv work; rows or keys past the end are zeros.
// - warps: 4 row groups of 16 rows x DVS column parts (DVS = 1, 2, 4 for Dv <= 128, 256, 512).
//   (1) scores: warp (rg, part) multiplies its 16 query rows with the 32 keys over every
//       DVS-th k-step of 16 (mma.m16n8k16 bf16, fp32 accumulate) into partial-score slot
//       `part`; (2) softmax: the partial slots are added in order, scaled (log2 domain), masked
//       (causal and key range), and the running max / sum of each row updated in fp32; the
//       probabilities are written as a bf16 pair p = hi + lo (p - hi is exact in fp32; the pair
//       carries 16 significant bits, so the weighted sum is as exact as an fp32 one);
//       (3) values: warp (rg, part) rescales its fp32 accumulators (16 rows x 128 columns) and
//       adds hi*V + lo*V (V fragments by ldmatrix.trans).
// - flash-decoding: with few rows (decode), the keys are split over blockIdx.y so the grid fills
//   the GPU; each split writes unnormalized partial sums and its (max, sum), and a second kernel
//   merges the splits in a fixed order. Everything is deterministic (no atomics).
#include <cuda_bf16.h>

#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/attention_combine.cuh"
#include "backends/cuda/attention_kernels.h"
#include "backends/cuda/attention_seq.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/mma_fragments.cuh"
#include "backends/cuda/small_ops_launch.cuh"

namespace locus::cuda::detail {
namespace {

constexpr int BM = kAttnTcRows;          // query rows per CTA
constexpr int BN = kAttnTcKeys;          // keys per tile
constexpr int kRowGroups = BM / 16;      // one m16 row group per warp
constexpr int kColsPerWarp = 128;        // output columns per warp (16 n8 tiles)
constexpr int kScoreLd = BN + 8;         // fp32 partial-score row stride (conflict-free float2 stores)
constexpr int kProbLd = BN + 8;          // bf16 probability row stride (20 words: conflict-free)
static_assert(BN == 32, "the softmax maps 8 lanes x 4 keys onto one 32-key row");
static_assert(BM % 16 == 0, "rows come in m16 groups");

__host__ __device__ constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Column parts per row group: Dv padded to 16 over 128-column warps (0: Dv too large).
__host__ __device__ constexpr int column_parts(int dv) {
  const int dv16 = round_up(dv, 16);
  return dv16 <= 128 ? 1 : dv16 <= 256 ? 2 : dv16 <= 512 ? 4 : 0;
}

// Shared-memory layout, computed the same way on the host (size) and the device (offsets).
// bf16 rows are padded by 8 elements: a row stride of 4 (mod 8) words makes the fragment loads
// and ldmatrix conflict-free. Every offset is a multiple of 16 bytes.
struct Layout {
  int da16, dk16, dv16;  // padded dims: q_a/k_a part, [a | b] total, v
  int ld_qk, ld_v;       // bf16 row strides of Q/K and V tiles
  int q_off, k_off, v_off, s_off, ph_off, pl_off, stat_off, total;
};

__host__ __device__ inline Layout make_layout(int da, int db, int dv, bool v_is_k_a, int parts) {
  Layout l{};
  l.da16 = round_up(da, 16);
  l.dk16 = l.da16 + round_up(db, 16);
  l.dv16 = round_up(dv, 16);
  l.ld_qk = l.dk16 + 8;
  l.ld_v = l.dv16 + 8;
  l.q_off = 0;
  l.k_off = l.q_off + BM * l.ld_qk * 2;
  l.v_off = l.k_off + 2 * BN * l.ld_qk * 2;
  l.s_off = l.v_off + (v_is_k_a ? 0 : 2 * BN * l.ld_v * 2);
  l.ph_off = l.s_off + parts * BM * kScoreLd * 4;
  l.pl_off = l.ph_off + BM * kProbLd * 2;
  l.stat_off = l.pl_off + BM * kProbLd * 2;
  l.total = l.stat_off + 4 * BM * 4;  // running max, running sum, rescale factor, key limit
  return l;
}

__device__ __forceinline__ uint32_t lds32(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(gmem_src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 bf16 matrices, transposed: the B fragments of two n8 tiles of a row-major [k][n] tile.
__device__ __forceinline__ void ldmatrix_x4_trans(const uint16_t* p, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
}


// Row i (token or key) of an operand for head h (head_stride 0: the shared head).
__device__ __forceinline__ const uint16_t* row_ptr(const AttnOperand& o, int64_t i, int64_t h) {
  return static_cast<const uint16_t*>(o.ptr) + i * o.row_stride + h * o.head_stride;
}

// Fills 8 bf16 of shared memory with elements [d0, d0 + 8) of a row of D elements (zeros past
// D, or everywhere when src_row is null): one cp.async when the 16 bytes are whole and aligned.
__device__ __forceinline__ void copy_chunk(uint16_t* dst, const uint16_t* src_row, int d0, int D) {
  if (src_row != nullptr && d0 < D) {
    const uint16_t* s = src_row + d0;
    if (d0 + 8 <= D && (reinterpret_cast<uintptr_t>(s) & 15) == 0) {
      cp_async16(dst, s);
      return;
    }
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = d0 + 2 * i < D ? s[2 * i] : 0u;
      const uint32_t hi = d0 + 2 * i + 1 < D ? s[2 * i + 1] : 0u;
      w[i] = lo | (hi << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
}

__device__ __forceinline__ uint32_t pack_bf16(float x, float y) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(x))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(y))) << 16);
}

template <int DVS>
__global__ void __launch_bounds__(kRowGroups * DVS * 32)
    attn_tc_kernel(const __grid_constant__ MlaAttentionArgs a, AttnSplit sp) {
  small_op_start();
  constexpr int kWarps = kRowGroups * DVS;
  constexpr int kThreads = kWarps * 32;
  extern __shared__ __align__(16) unsigned char smem[];
  const Layout L = make_layout(a.Da, a.Db, a.Dv, a.v_is_k_a, DVS);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem + L.q_off);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + L.k_off);
  uint16_t* Vs = a.v_is_k_a ? Ks : reinterpret_cast<uint16_t*>(smem + L.v_off);
  const int ld_v = a.v_is_k_a ? L.ld_qk : L.ld_v;
  float* Sp = reinterpret_cast<float*>(smem + L.s_off);
  uint16_t* Ph = reinterpret_cast<uint16_t*>(smem + L.ph_off);
  uint16_t* Pl = reinterpret_cast<uint16_t*>(smem + L.pl_off);
  float* m_s = reinterpret_cast<float*>(smem + L.stat_off);
  float* l_s = m_s + BM;
  float* alpha_s = l_s + BM;
  int* lim_s = reinterpret_cast<int*>(alpha_s + BM);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;  // mma fragment coordinates
  const int rg = warp % kRowGroups, part = warp / kRowGroups;
  const AttnSeqOperands so = seq_operands(a, static_cast<int>(blockIdx.z));
  const int64_t split_index = static_cast<int64_t>(blockIdx.z) * sp.splits + blockIdx.y;  // partial slots

  // This CTA's group, rows [row0, row0 + BM) of it (late rows first: they see the most keys),
  // and key split.
  const int64_t groups = a.per_head_groups ? a.H : 1;
  const int64_t rows = a.per_head_groups ? a.T : a.T * a.H;
  const int64_t row_tiles = (rows + BM - 1) / BM;
  const int64_t group = blockIdx.x % groups;
  const int64_t row0 = (row_tiles - 1 - blockIdx.x / groups) * BM;
  // Rows are below 2^31 (launch_attn_tc checks T * H): 32-bit divisions, a few instructions
  // where 64-bit ones call a routine.
  const int heads = static_cast<int>(a.H);
  auto token_of = [&](int64_t r) -> int64_t { return a.per_head_groups ? r : static_cast<int>(r) / heads; };
  auto head_of = [&](int64_t r) -> int64_t { return a.per_head_groups ? group : static_cast<int>(r) % heads; };
  const int64_t last_row = (row0 + BM < rows ? row0 + BM : rows) - 1;
  const int64_t causal_end = so.q_start + token_of(last_row) + 1;  // <= S (checked by the op)
  const int64_t key_lo = static_cast<int64_t>(blockIdx.y) * sp.split_keys;
  const int64_t key_hi = key_lo + sp.split_keys < causal_end ? key_lo + sp.split_keys : causal_end;
  const int n_tiles = key_hi > key_lo ? static_cast<int>((key_hi - key_lo + BN - 1) / BN) : 0;

  for (int r = tid; r < BM; r += kThreads) {
    const int64_t row = row0 + r;
    int64_t lim = 0;  // keys [key_lo, key_lo + lim) are visible to this row (none for padding rows)
    if (row < rows) {
      const int64_t end = so.q_start + token_of(row) + 1;
      lim = (end < key_hi ? end : key_hi) - key_lo;
      if (lim < 0) lim = 0;
    }
    lim_s[r] = static_cast<int>(lim);
    m_s[r] = -INFINITY;
    l_s[r] = 0.f;
  }

  // Query rows [q_a | q_b], zero-padded; committed with the first K/V tile. A warp per row, its
  // lanes over the row's 16-byte chunks (the row's token and head worked out once).
  const int qk_chunks = L.dk16 / 8, a_chunks = L.da16 / 8;
  for (int r = warp; r < BM; r += kWarps) {
    const int64_t row = row0 + r;
    const bool valid = row < rows;
    const int64_t t = valid ? token_of(row) : 0, h = valid ? head_of(row) : 0;
    const uint16_t* qa_row = valid ? row_ptr(so.q_a, t, h) : nullptr;
    const uint16_t* qb_row = valid ? row_ptr(so.q_b, t, h) : nullptr;
    for (int c = lane; c < qk_chunks; c += 32) {
      uint16_t* dst = Qs + r * L.ld_qk + c * 8;
      if (c < a_chunks) copy_chunk(dst, qa_row, c * 8, a.Da);
      else copy_chunk(dst, qb_row, (c - a_chunks) * 8, a.Db);
    }
  }

  auto load_tile = [&](int j, int buf) {
    const int64_t k0 = key_lo + static_cast<int64_t>(j) * BN;
    uint16_t* kd = Ks + buf * BN * L.ld_qk;
    for (int r = warp; r < BN; r += kWarps) {  // a warp per key row, as the query rows
      const bool valid = k0 + r < key_hi;
      const uint16_t* ka_row = valid ? row_ptr(so.k_a, k0 + r, group) : nullptr;
      const uint16_t* kb_row = valid ? row_ptr(so.k_b, k0 + r, group) : nullptr;
      for (int c = lane; c < qk_chunks; c += 32) {
        uint16_t* dst = kd + r * L.ld_qk + c * 8;
        if (c < a_chunks) copy_chunk(dst, ka_row, c * 8, a.Da);
        else copy_chunk(dst, kb_row, (c - a_chunks) * 8, a.Db);
      }
    }
    if (!a.v_is_k_a) {
      const int v_chunks = L.dv16 / 8;
      uint16_t* vd = Vs + buf * BN * L.ld_v;
      for (int r = warp; r < BN; r += kWarps) {
        const uint16_t* v_row = k0 + r < key_hi ? row_ptr(so.v, k0 + r, group) : nullptr;
        for (int c = lane; c < v_chunks; c += 32) copy_chunk(vd + r * L.ld_v + c * 8, v_row, c * 8, a.Dv);
      }
    }
  };

  const float scale_log2 = a.scale * kAttnLog2e;
  const int col0 = part * kColsPerWarp;  // this warp's output columns [col0, col0 + 128)
  float acc[kColsPerWarp / 8][4];
#pragma unroll
  for (int n = 0; n < kColsPerWarp / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.f;

  if (n_tiles > 0) load_tile(0, 0);
  cp_async_commit();
  for (int j = 0; j < n_tiles; ++j) {
    if (j + 1 < n_tiles) load_tile(j + 1, (j + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();  // the query rows and tile j have landed
    __syncthreads();
    const uint16_t* kt = Ks + (j & 1) * BN * L.ld_qk;
    const uint16_t* vt = Vs + (j & 1) * BN * ld_v;

    // (1) partial scores of 16 rows x 32 keys over k-steps part, part + DVS, ...
    {
      float s[BN / 8][4];
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[n][i] = 0.f;
      const uint16_t* qg = Qs + rg * 16 * L.ld_qk;
      for (int kk = part; kk < L.dk16 / 16; kk += DVS) {
        const int c = kk * 16 + 2 * t4;
        const uint32_t a0 = lds32(qg + g * L.ld_qk + c), a1 = lds32(qg + (g + 8) * L.ld_qk + c);
        const uint32_t a2 = lds32(qg + g * L.ld_qk + c + 8), a3 = lds32(qg + (g + 8) * L.ld_qk + c + 8);
#pragma unroll
        for (int n = 0; n < BN / 8; ++n) {
          const uint16_t* kr = kt + (n * 8 + g) * L.ld_qk + c;
          mma_bf16_16816(s[n], a0, a1, a2, a3, lds32(kr), lds32(kr + 8));
        }
      }
      float* out = Sp + (part * BM + rg * 16) * kScoreLd;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        *reinterpret_cast<float2*>(out + g * kScoreLd + n * 8 + 2 * t4) = make_float2(s[n][0], s[n][1]);
        *reinterpret_cast<float2*>(out + (g + 8) * kScoreLd + n * 8 + 2 * t4) = make_float2(s[n][2], s[n][3]);
      }
    }
    __syncthreads();

    // (2) online softmax: 8 lanes per row, 4 keys per lane.
    {
      const int sub = lane & 7;
      for (int r = warp * 4 + (lane >> 3); r < BM; r += kWarps * 4) {
        float4 sc = *reinterpret_cast<const float4*>(Sp + r * kScoreLd + sub * 4);
#pragma unroll
        for (int p = 1; p < DVS; ++p) {
          const float4 o = *reinterpret_cast<const float4*>(Sp + (p * BM + r) * kScoreLd + sub * 4);
          sc.x += o.x;
          sc.y += o.y;
          sc.z += o.z;
          sc.w += o.w;
        }
        const int lim = lim_s[r], k_rel = j * BN + sub * 4;
        float x[4] = {sc.x, sc.y, sc.z, sc.w};
        float tile_max = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          x[i] = k_rel + i < lim ? x[i] * scale_log2 : -INFINITY;
          tile_max = fmaxf(tile_max, x[i]);
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
        const float m_old = m_s[r], l_old = l_s[r];
        const float m_new = fmaxf(m_old, tile_max);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no visible key yet: every p is 0
        float p[4], lo[4], sum = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          p[i] = exp2f(x[i] - m_use);
          sum += p[i];
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        const float alpha = exp2f(m_old - m_use);
#pragma unroll
        for (int i = 0; i < 4; ++i) lo[i] = p[i] - __bfloat162float(__float2bfloat16_rn(p[i]));
        *reinterpret_cast<uint2*>(Ph + r * kProbLd + sub * 4) =
            make_uint2(pack_bf16(p[0], p[1]), pack_bf16(p[2], p[3]));
        *reinterpret_cast<uint2*>(Pl + r * kProbLd + sub * 4) =
            make_uint2(pack_bf16(lo[0], lo[1]), pack_bf16(lo[2], lo[3]));
        __syncwarp();  // every lane has read the row's old statistics
        if (sub == 0) {
          m_s[r] = m_new;
          l_s[r] = l_old * alpha + sum;
          alpha_s[r] = alpha;
        }
      }
    }
    __syncthreads();

    // (3) acc = alpha * acc + (P_hi + P_lo) V over this warp's 16 rows and 128 columns.
    {
      const float al = alpha_s[rg * 16 + g], ah = alpha_s[rg * 16 + g + 8];
#pragma unroll
      for (int n = 0; n < kColsPerWarp / 8; ++n) {
        acc[n][0] *= al;
        acc[n][1] *= al;
        acc[n][2] *= ah;
        acc[n][3] *= ah;
      }
      const uint16_t* ph = Ph + rg * 16 * kProbLd;
      const uint16_t* pl = Pl + rg * 16 * kProbLd;
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks) {
        const int c = ks * 16 + 2 * t4;
        const uint32_t h0 = lds32(ph + g * kProbLd + c), h1 = lds32(ph + (g + 8) * kProbLd + c);
        const uint32_t h2 = lds32(ph + g * kProbLd + c + 8), h3 = lds32(ph + (g + 8) * kProbLd + c + 8);
        const uint32_t l0 = lds32(pl + g * kProbLd + c), l1 = lds32(pl + (g + 8) * kProbLd + c);
        const uint32_t l2 = lds32(pl + g * kProbLd + c + 8), l3 = lds32(pl + (g + 8) * kProbLd + c + 8);
        // ldmatrix rows: lanes 0-7 keys 0-7 / 8-15 keys 8-15 (columns +0), lanes 16-31 the same at columns +8.
        const uint16_t* vrow = vt + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld_v + col0 + (lane >> 4) * 8;
#pragma unroll
        for (int np = 0; np < kColsPerWarp / 16; ++np) {
          if (col0 + np * 16 < L.dv16) {
            uint32_t b0, b1, b2, b3;
            ldmatrix_x4_trans(vrow + np * 16, b0, b1, b2, b3);
            mma_bf16_16816(acc[2 * np], h0, h1, h2, h3, b0, b1);
            mma_bf16_16816(acc[2 * np], l0, l1, l2, l3, b0, b1);
            mma_bf16_16816(acc[2 * np + 1], h0, h1, h2, h3, b2, b3);
            mma_bf16_16816(acc[2 * np + 1], l0, l1, l2, l3, b2, b3);
          }
        }
      }
    }
    __syncthreads();  // tile buffer (j & 1) and the score/probability slots are free again
  }
  cp_async_wait<0>();
  __syncthreads();  // the row statistics are final (also when this CTA had no keys)

  // Epilogue: rows g and g + 8 of the row group; columns col0 + 8n + 2*t4 + {0, 1}.
  const int64_t TH = a.T * a.H;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = rg * 16 + g + 8 * half;
    const int64_t row = row0 + r;
    if (row >= rows) continue;
    const int64_t t = token_of(row), h = head_of(row);
    if (sp.splits == 1) {
      const float inv = 1.f / l_s[r];  // > 0: key 0 is visible to every row
      char* base = static_cast<char*>(so.out);
      const int64_t off = t * a.out_row_stride + h * a.out_head_stride;
#pragma unroll
      for (int n = 0; n < kColsPerWarp / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + n * 8 + 2 * t4 + e;
          if (col >= a.Dv) continue;
          const float v = acc[n][2 * half + e] * inv;
          if (a.out_f32) reinterpret_cast<float*>(base)[off + col] = v;
          else reinterpret_cast<__nv_bfloat16*>(base)[off + col] = __float2bfloat16_rn(v);
        }
    } else {
      float* po = sp.partial_o + (split_index * TH + t * a.H + h) * a.Dv;
#pragma unroll
      for (int n = 0; n < kColsPerWarp / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + n * 8 + 2 * t4 + e;
          if (col < a.Dv) po[col] = acc[n][2 * half + e];
        }
    }
  }
  if (sp.splits > 1) {
    for (int r = tid; r < BM; r += kThreads) {
      const int64_t row = row0 + r;
      if (row >= rows) continue;
      float* ml = sp.partial_ml + (split_index * TH + token_of(row) * a.H + head_of(row)) * 2;
      ml[0] = m_s[r];
      ml[1] = l_s[r];
    }
  }
}

// out[t, h, :] from the splits' partial sums: weights 2^(m_z - max m), in split order.
__global__ void __launch_bounds__(128) attn_combine_kernel(const __grid_constant__ MlaAttentionArgs a, AttnSplit sp) {
  small_op_start();
  __shared__ float w_s[kAttnMaxSplits];
  __shared__ float inv_l;
  const int64_t TH = a.T * a.H, row = blockIdx.x;  // row = t * H + h of sequence blockIdx.y
  const AttnSeqOperands so = seq_operands(a, static_cast<int>(blockIdx.y));
  // This row's slots: split z of sequence blockIdx.y at (blockIdx.y * splits + z) * TH + row.
  const float* pml = sp.partial_ml + (static_cast<int64_t>(blockIdx.y) * sp.splits * TH + row) * 2;
  const float* po = sp.partial_o + (static_cast<int64_t>(blockIdx.y) * sp.splits * TH + row) * a.Dv;
  if (threadIdx.x == 0) inv_l = attn_split_weights(pml, TH * 2, sp.splits, w_s);
  __syncthreads();
  const int64_t t = row / a.H, h = row % a.H;
  const int64_t off = t * a.out_row_stride + h * a.out_head_stride;
  attn_write_combined_row(po, TH * a.Dv, sp.splits, w_s, inv_l, so.out, a.out_f32, off, a.Dv, threadIdx.x,
                          blockDim.x);
}

const void* tc_kernel_for(int parts) {
  switch (parts) {
    case 1: return reinterpret_cast<const void*>(&attn_tc_kernel<1>);
    case 2: return reinterpret_cast<const void*>(&attn_tc_kernel<2>);
    case 4: return reinterpret_cast<const void*>(&attn_tc_kernel<4>);
  }
  LOCUS_THROW("MLA attention: no tensor-core kernel for ", parts, " column parts");
}

}  // namespace

int attn_tc_smem_bytes(const MlaAttentionArgs& a) {
  for (const AttnOperand* o : {&a.q_a, &a.q_b, &a.k_a, &a.k_b, &a.v})
    if (o->f32) return 0;
  const int parts = column_parts(a.Dv);
  if (parts == 0 || (a.v_is_k_a && a.Dv != a.Da)) return 0;
  return make_layout(a.Da, a.Db, a.Dv, a.v_is_k_a, parts).total;
}

int attn_tc_ctas_per_sm(const MlaAttentionArgs& a, int device) {
  const int parts = column_parts(a.Dv), smem = attn_tc_smem_bytes(a);
  static std::mutex mu;
  static std::map<std::tuple<int, int, int>, int> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find({device, parts, smem});
    if (it != cache.end()) return it->second;
  }
  const void* kernel = tc_kernel_for(parts);
  raise_dynamic_smem_limit(kernel, smem);
  int n = 0;
  LOCUS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kRowGroups * parts * 32, smem));
  n = n > 0 ? n : 1;
  std::lock_guard<std::mutex> lock(mu);
  cache[{device, parts, smem}] = n;
  return n;
}

void launch_attn_tc(const MlaAttentionArgs& a, const AttnSplit& split, int smem_bytes, cudaStream_t stream) {
  const int parts = column_parts(a.Dv);
  const void* kernel = tc_kernel_for(parts);
  raise_dynamic_smem_limit(kernel, smem_bytes);
  const int64_t groups = a.per_head_groups ? a.H : 1;
  const int64_t rows = a.per_head_groups ? a.T : a.T * a.H;
  const int64_t ctas = (rows + BM - 1) / BM * groups;
  LOCUS_CHECK(a.T * a.H <= 0x7fffffff, "MLA attention: ", a.T, " tokens x ", a.H, " heads are beyond the kernel's range");
  LOCUS_CHECK(ctas <= 0x7fffffff && split.splits >= 1 && split.splits <= kAttnMaxSplits,
              "MLA attention: ", ctas, " row tiles x ", split.splits, " key splits do not fit one launch");
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>(split.splits),
                  static_cast<unsigned>(a.num_seqs > 0 ? a.num_seqs : 1));
  const dim3 block(kRowGroups * parts * 32);
  constexpr const char* kWhat = "MLA attention (tensor-core) kernel launch";
  switch (parts) {
    case 1: launch_small_op(attn_tc_kernel<1>, grid, block, smem_bytes, stream, kWhat, a, split); break;
    case 2: launch_small_op(attn_tc_kernel<2>, grid, block, smem_bytes, stream, kWhat, a, split); break;
    default: launch_small_op(attn_tc_kernel<4>, grid, block, smem_bytes, stream, kWhat, a, split); break;
  }
}

void launch_attn_combine(const MlaAttentionArgs& a, const AttnSplit& split, cudaStream_t stream) {
  const int64_t rows = a.T * a.H;
  LOCUS_CHECK(rows <= 0x7fffffff, "MLA attention: ", rows, " (token, head) rows do not fit one launch");
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(a.num_seqs > 0 ? a.num_seqs : 1));
  launch_small_op(attn_combine_kernel, grid, 128, 0, stream, "MLA attention split-combine kernel launch", a, split);
}

}  // namespace locus::cuda::detail
