// Rotary position embedding on CUDA (cuda_small_ops.h), in place on x [T, H, dim] or [T, dim]
// with any token/head strides. Each thread rotates P pairs of one head: interleaved pairs
// (2i, 2i+1) read 2P neighbours, rotate-half pairs (i, i + dim/2) read P from each half; with
// P > 1 every access is 16 bytes wide (checked on the host). A position outside the table reads
// no table row and rotates by NaN, so that token's rotary elements become NaN.
#include "backends/cuda/cuda_small_ops.h"
#include "backends/cuda/float_pack.cuh"
#include "backends/cuda/small_ops_launch.cuh"
#include "backends/cuda/strided_offsets.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

struct RopeArgs {
  void* x;
  int64_t tokens, heads, half;
  int64_t token_stride, head_stride;  // elements
  const void* positions;
  int64_t positions_stride, max_position;
  const float* cos;
  const float* sin;
  int64_t cos_ld, sin_ld;
  int64_t units_per_head;  // half / P
};

template <class XT, class Pos, bool kInterleaved, int P>
__global__ void rope_kernel(RopeArgs a) {
  small_op_start();
  constexpr bool kVector = P > 1;
  using XS = typename XT::Storage;
  const int64_t total = a.tokens * a.heads * a.units_per_head;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < total;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = u % a.units_per_head, th = u / a.units_per_head;
    const int64_t h = th % a.heads, t = th / a.heads;
    const int64_t pos = static_cast<int64_t>(static_cast<const Pos*>(a.positions)[t * a.positions_stride]);
    const int64_t i0 = j * P;  // first pair of this unit
    float c[P], s[P];
    if (pos >= 0 && pos < a.max_position) {
      load_f32<Fp32, P, kVector>(a.cos + pos * a.cos_ld + i0, c);
      load_f32<Fp32, P, kVector>(a.sin + pos * a.sin_ld + i0, s);
    } else {
#pragma unroll
      for (int q = 0; q < P; ++q) c[q] = s[q] = __int_as_float(0x7FC00000);
    }
    XS* head = static_cast<XS*>(a.x) + t * a.token_stride + h * a.head_stride;
    float x0[P], x1[P];
    if constexpr (kInterleaved) {
      float v[2 * P];
      load_f32<XT, 2 * P, kVector>(head + 2 * i0, v);
#pragma unroll
      for (int q = 0; q < P; ++q) {
        x0[q] = v[2 * q];
        x1[q] = v[2 * q + 1];
      }
#pragma unroll
      for (int q = 0; q < P; ++q) {
        v[2 * q] = x0[q] * c[q] - x1[q] * s[q];
        v[2 * q + 1] = x0[q] * s[q] + x1[q] * c[q];
      }
      store_f32<XT, 2 * P, kVector>(head + 2 * i0, v);
    } else {
      load_f32<XT, P, kVector>(head + i0, x0);
      load_f32<XT, P, kVector>(head + a.half + i0, x1);
      float y0[P], y1[P];
#pragma unroll
      for (int q = 0; q < P; ++q) {
        y0[q] = x0[q] * c[q] - x1[q] * s[q];
        y1[q] = x0[q] * s[q] + x1[q] * c[q];
      }
      store_f32<XT, P, kVector>(head + i0, y0);
      store_f32<XT, P, kVector>(head + a.half + i0, y1);
    }
  }
}

template <class XT, class Pos, bool kInterleaved, int P>
void launch(RopeArgs a, cudaStream_t s) {
  a.units_per_head = a.half / P;
  const int threads = 256;
  const int64_t units = a.tokens * a.heads * a.units_per_head;
  const int blocks = grid_blocks((units + threads - 1) / threads, 4096);
  launch_small_op(rope_kernel<XT, Pos, kInterleaved, P>, blocks, threads, 0, s, "rope kernel launch", a);
}

}  // namespace

void apply_rope(const Tensor& x, const Tensor& positions, const Tensor& cos, const Tensor& sin, bool interleaved,
                void* stream) {
  const char* op = "cuda::apply_rope";
  if (!start_op(op, x, x.numel())) return;
  RopeArgs a{};
  a.x = x.data_ptr();
  a.tokens = x.size(0);
  a.heads = x.dim() == 3 ? x.size(1) : 1;
  a.half = x.size(-1) / 2;
  a.token_stride = x.stride(0);
  a.head_stride = x.dim() == 3 ? x.stride(1) : 0;
  a.positions = positions.data_ptr();
  a.positions_stride = positions.stride(0);
  a.max_position = cos.size(0);
  a.cos = cos.data<float>();
  a.sin = sin.data<float>();
  a.cos_ld = cos.stride(0);
  a.sin_ld = sin.stride(0);
  // 16-byte accesses: x rows and table rows 16-byte aligned, and a whole number of 16-byte
  // words per unit (interleaved: 4 pairs = 8 elements and 4 table floats; rotate-half: 8 pairs).
  const int64_t pairs_per_unit = interleaved ? 4 : 8;
  const bool vec = a.half % pairs_per_unit == 0 && rows_aligned_16(x) && rows_aligned_16(cos) && rows_aligned_16(sin);
  const cudaStream_t s = as_stream(stream);
  visit_bf16_fp32(x.dtype(), op, [&](auto xt) {
    using XT = decltype(xt);
    auto with_positions = [&](auto pos_tag) {
      using Pos = decltype(pos_tag);
      if (interleaved) vec ? launch<XT, Pos, true, 4>(a, s) : launch<XT, Pos, true, 1>(a, s);
      else vec ? launch<XT, Pos, false, 8>(a, s) : launch<XT, Pos, false, 1>(a, s);
    };
    if (positions.dtype() == DType::kI32) with_positions(int32_t{});
    else with_positions(int64_t{});
  });
  LOCUS_CUDA_CHECK_LAUNCH("apply_rope kernel launch");
}

}  // namespace locus::cuda
