// How fast the warps of a streaming GEMM can pull a row-major BF16 weight [N, K] into shared
// memory, depending on the shape of one chunk: R rows x B bytes of each row (R * B = 8 KB, one
// pipeline stage), against the same bytes stored chunk-contiguous (a pre-tiled layout), and on
// the copy: per-lane 16-byte cp.async, one 1D bulk copy per row (TMA), or one 2D tensor copy
// per chunk (TMA). The chunks are walked as the streaming kernel walks them: a row group's
// chunks along K, then the next group; each warp of the grid takes one contiguous range of
// chunks and copies them through its ring, consuming each stage with a read of every byte.
// Standalone (CMake target cuda_row_copy_probe, carried by tools/gpu/package.sh). One launch per
// weight, back to back over rotating copies larger than L2; prints us per launch and GB/s.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backends/cuda/cp_async.cuh"
#include "backends/cuda/tma.cuh"
#include "probe_timing.h"
#include <cudaTypedefs.h>

using namespace locus::cuda::detail;

namespace {

constexpr int kStageBytes = 8192;

enum Copy { kCpAsync, kBulkRows, kTensor2d };

// rows_per_chunk == 0: chunk-contiguous layout (chunk i is the 8 KB at i * 8 KB).
__global__ void row_copy(const uint8_t* __restrict__ w, const __grid_constant__ CUtensorMap map, int copy,
                         int64_t row_bytes, int rows_per_chunk, int64_t chunks_per_row, int64_t total_chunks,
                         int stages, unsigned* out) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t ring = base + 1024 + warp * stages * kStageBytes;
  const uint32_t bar0 = base + warp * 64;  // one mbarrier per stage (at most 8)
  if (copy != kCpAsync && lane == 0)
    for (int s = 0; s < stages; ++s) mbar_init(bar0 + 8 * s, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * warps + warp, all = static_cast<int64_t>(gridDim.x) * warps;
  const int64_t begin = total_chunks * gw / all, end = total_chunks * (gw + 1) / all;
  const int n = static_cast<int>(end - begin);
  const int chunk_row_bytes = rows_per_chunk ? kStageBytes / rows_per_chunk : kStageBytes;
  auto issue = [&](int j) {
    if (j < n) {
      const int64_t chunk = begin + j;
      const int64_t group = rows_per_chunk ? chunk / chunks_per_row : 0, c = rows_per_chunk ? chunk % chunks_per_row : 0;
      const uint8_t* src = rows_per_chunk ? w + group * rows_per_chunk * row_bytes + c * chunk_row_bytes
                                          : w + chunk * kStageBytes;
      const uint32_t dst = ring + (j % stages) * kStageBytes, bar = bar0 + 8 * (j % stages);
      if (copy == kCpAsync) {
#pragma unroll 4
        for (int i = 0; i < kStageBytes / 512; ++i) {
          const int at = i * 512 + lane * 16;
          const int64_t from = rows_per_chunk ? (at / chunk_row_bytes) * row_bytes + at % chunk_row_bytes : at;
          cp_async16(dst + at, src + from);
        }
      } else if (copy == kBulkRows) {  // lane r copies row r (contiguous layout: 8 pieces of 1 KB)
        const int rows = rows_per_chunk ? rows_per_chunk : 8, bytes = kStageBytes / rows;
        if (lane == 0) mbar_expect(bar, kStageBytes);
        __syncwarp();
        for (int r = lane; r < rows; r += 32)
          bulk_copy_to(dst + r * bytes, src + (rows_per_chunk ? r * row_bytes : r * bytes), bytes, bar);
      } else if (lane == 0) {
        mbar_expect(bar, kStageBytes);
        tensor_copy_2d(dst, &map, static_cast<int>(c * chunk_row_bytes / 2), static_cast<int>(group * rows_per_chunk), bar);
      }
    }
    if (copy == kCpAsync) cp_async_commit();
  };
  uint32_t sink = 0;
  for (int j = 0; j < stages - 1; ++j) issue(j);
  for (int j = 0; j < n; ++j) {
    __syncwarp();
    issue(j + stages - 1);
    if (copy == kCpAsync) cp_async_wait_pending(stages - 1);
    else mbar_wait(bar0 + 8 * (j % stages), (j / stages) & 1);
    __syncwarp();
    for (int off = lane * 16; off < kStageBytes; off += 512) {
      const uint4 v = lds128(ring + (j % stages) * kStageBytes + off);
      sink ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (copy == kCpAsync) cp_async_wait<0>();
  if (sink == 0x9e3779b9u) out[0] = 1;  // keeps the reads alive
}

// The 2D map of a row-major BF16 [n, k] weight with boxes of `rows` rows x `row_bytes` bytes.
CUtensorMap tensor_map(const void* w, int64_t n, int64_t k, int rows, int box_bytes) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k * 2)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_bytes / 2), static_cast<cuuint32_t>(rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d) for box %d x %d\n", static_cast<int>(r), rows, box_bytes);
    std::exit(1);
  }
  return map;
}

// us per launch (median), or < 0 where the configuration does not fit.
float time_launches(const std::vector<uint8_t*>& copies, int copy, int64_t n, int64_t k, int rows_per_chunk,
                    int ctas_per_sm, int warps, int stages, int sms, unsigned* out) {
  const int smem = 1024 + warps * stages * kStageBytes;
  if (smem > 227 * 1024) return -1.f;
  CHECK(cudaFuncSetAttribute(row_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int fit = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, row_copy, warps * 32, smem));
  if (fit < ctas_per_sm) return -1.f;
  const int64_t row_bytes = k * 2, total_chunks = n * row_bytes / kStageBytes;
  const int64_t chunks_per_row = rows_per_chunk ? row_bytes / (kStageBytes / rows_per_chunk) : 0;
  std::vector<CUtensorMap> maps(copies.size());
  if (copy == kTensor2d)
    for (size_t i = 0; i < copies.size(); ++i) maps[i] = tensor_map(copies[i], n, k, rows_per_chunk, kStageBytes / rows_per_chunk);
  const float ms = median_batch_ms(3, 12, [&] {
    for (size_t i = 0; i < copies.size(); ++i)
      row_copy<<<sms * ctas_per_sm, warps * 32, smem>>>(copies[i], maps[i], copy, row_bytes, rows_per_chunk,
                                                        chunks_per_row, total_chunks, stages, out);
  });
  return ms * 1e3f / copies.size();
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned* out = nullptr;
  CHECK(cudaMalloc(&out, 64));
  const char* copy_names[] = {"cp.async", "bulk per row", "2D tensor"};
  std::printf("| N x K | chunk (rows x bytes) | copy | CTAs/SM | warps | stages | us per launch | GB/s |\n|---|---|---|---|---|---|---|---|\n");
  for (auto [n, k] : {std::pair<int64_t, int64_t>{7168, 7168}, {18432, 7168}, {7168, 2048}, {32768, 512}}) {
    const int64_t bytes = n * k * 2;
    const int r = static_cast<int>(std::clamp<int64_t>((240LL << 20) / bytes + 1, 2, 32));
    std::vector<uint8_t*> copies(r);
    for (auto& c : copies) {
      CHECK(cudaMalloc(&c, bytes));
      CHECK(cudaMemset(c, 0x35, bytes));
    }
    for (int rows : {64, 32, 16, 8, 0}) {
      if (rows && (kStageBytes / rows > k * 2 || (k * 2) % (kStageBytes / rows))) continue;
      for (int copy : {kCpAsync, kBulkRows, kTensor2d})
      for (int cps : {1, 2})
        for (int stages : {2, 3, 4}) {
          if (copy == kTensor2d && (rows == 0 || kStageBytes / rows > 512)) continue;  // box: at most 256 elements wide
          const float us = time_launches(copies, copy, n, k, rows, cps, 8, stages, sms, out);
          if (us < 0) continue;
          char chunk[32];
          if (rows) std::snprintf(chunk, sizeof chunk, "%d x %d", rows, kStageBytes / rows);
          else std::snprintf(chunk, sizeof chunk, "contiguous 8 KB");
          std::printf("| %lld x %lld | %s | %s | %d | 8 | %d | %.1f | %.0f |\n", (long long)n, (long long)k, chunk,
                      copy_names[copy], cps, stages, us, bytes / (us * 1e3));
        }
    }
    for (auto& c : copies) CHECK(cudaFree(c));
  }
  return 0;
}
