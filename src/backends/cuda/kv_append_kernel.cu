// cuda::kv_append_rows (cuda_kv_table.h): one CTA per sequence reads its cache's address and
// length from the table and copies its new row there, 2 bytes per thread-element (rows of latent
// caches are a few hundred values, so the copy is latency-bound either way); and
// cuda::kv_lengths_advance, the table's lengths one further.
#include "backends/cuda/cuda_kv_table.h"
#include "backends/cuda/small_ops_launch.cuh"

namespace locus::cuda {
namespace {

__global__ void kv_append_kernel(const uint16_t* src, int64_t src_row_stride, const int64_t* rows,
                                 const int32_t* lengths, int64_t width) {
  detail::small_op_start();
  const int64_t b = blockIdx.x;
  uint16_t* dst = reinterpret_cast<uint16_t*>(rows[b]) + static_cast<int64_t>(lengths[b]) * width;
  const uint16_t* s = src + b * src_row_stride;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) dst[c] = s[c];
}

__global__ void kv_lengths_advance_kernel(int32_t* lengths, int64_t n) {
  detail::small_op_start();
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < n;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x)
    ++lengths[b];
}

}  // namespace

void kv_lengths_advance(const Tensor& lengths, void* stream) {
  const int64_t n = lengths.numel();
  if (!detail::start_op("cuda::kv_lengths_advance", lengths, n)) return;
  detail::launch_small_op(kv_lengths_advance_kernel, detail::grid_blocks((n + 255) / 256, 64), 256, 0,
                          detail::as_stream(stream), "kv_lengths_advance kernel launch", lengths.data<int32_t>(), n);
}

void kv_append_rows(const Tensor& src, const ops::KvTable& table, void* stream) {
  const int64_t B = src.size(0);
  if (!detail::start_op("cuda::kv_append_rows", src, B * table.width)) return;
  LOCUS_CHECK(B <= 0x7fffffff, "cuda::kv_append_rows: ", B, " sequences do not fit one launch");
  detail::launch_small_op(kv_append_kernel, static_cast<unsigned>(B), detail::block_threads(table.width, 256), 0,
                          detail::as_stream(stream), "kv_append_rows kernel launch",
                          static_cast<const uint16_t*>(src.data_ptr()), src.stride(0), table.rows.data<int64_t>(),
                          table.lengths.data<int32_t>(), table.width);
}

}  // namespace locus::cuda
