// cuda::kv_append_rows (cuda_kv_table.h): one CTA per sequence reads its cache's address and
// length from the table and copies its new row there, 2 bytes per thread-element (rows of latent
// caches are a few hundred values, so the copy is latency-bound either way).
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

}  // namespace

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
