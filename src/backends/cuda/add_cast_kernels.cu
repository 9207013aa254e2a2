// Element-wise add and cast on CUDA (cuda_small_ops.h) for any shapes and strides: the
// dimensions are merged where every operand allows (strided_offsets.cuh); when the innermost
// merged dimension is dense in every operand, rows are 16-byte aligned and its length is a
// multiple of 8, each thread moves 8 elements with 16-byte accesses.
#include "backends/cuda/cuda_small_ops.h"
#include "backends/cuda/float_pack.cuh"
#include "backends/cuda/small_ops_launch.cuh"
#include "backends/cuda/strided_offsets.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

constexpr int kVec = 8;

// y = a + b (kAdd) or y = a, over [outer dims..., inner]; operand order a, b, y.
struct ElementwiseArgs {
  const void* a;
  const void* b;
  void* y;  // may be exactly a or b: each element is read and then written by the same thread
  OffsetCalc<3> outer;
  int64_t inner_stride[3];
  int64_t packs_per_row, total_packs;
};

template <class AT, class BT, class YT, bool kAdd, int V>
__global__ void elementwise_kernel(ElementwiseArgs p) {
  small_op_start();
  constexpr bool kVector = V > 1;
  const auto* a = static_cast<const typename AT::Storage*>(p.a);
  const auto* b = static_cast<const typename BT::Storage*>(p.b);
  auto* y = static_cast<typename YT::Storage*>(p.y);
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < p.total_packs;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = p.outer.nd == 0 ? 0 : u / p.packs_per_row;
    const int64_t c = (u - row * p.packs_per_row) * V;  // V > 1 only when the inner strides are 1
    int64_t off[3];
    p.outer.offsets(row, off);
    float av[V], out[V];
    load_f32<AT, V, kVector>(a + off[0] + c * p.inner_stride[0], av);
    if constexpr (kAdd) {
      float bv[V];
      load_f32<BT, V, kVector>(b + off[1] + c * p.inner_stride[1], bv);
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = av[e] + bv[e];
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = av[e];
    }
    store_f32<YT, V, kVector>(y + off[2] + c * p.inner_stride[2], out);
  }
}

// The launch layout of y = f(a, b) (b is a for cast); sets *vec when 16-byte packs apply.
ElementwiseArgs layout(const char* op, const Tensor& a, const Tensor& b, const Tensor& y, bool* vec) {
  ElementwiseArgs p{};
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.y = y.data_ptr();
  OffsetCalc<3> all = make_offset_calc<3>(op, y.shape(), y.dim(), {&a, &b, &y});
  int64_t inner = 1;
  for (int o = 0; o < 3; ++o) p.inner_stride[o] = 1;
  if (all.nd > 0) {
    inner = all.size[all.nd - 1];
    for (int o = 0; o < 3; ++o) p.inner_stride[o] = all.stride[o][all.nd - 1];
  }
  p.outer = all;
  p.outer.nd = all.nd > 0 ? all.nd - 1 : 0;
  *vec = inner % kVec == 0;
  const Tensor* ops[3] = {&a, &b, &y};
  for (int o = 0; o < 3; ++o) {
    const int64_t es = static_cast<int64_t>(dtype_size(ops[o]->dtype()));
    *vec = *vec && p.inner_stride[o] == 1 && reinterpret_cast<uintptr_t>(ops[o]->data_ptr()) % 16 == 0;
    for (int d = 0; d < p.outer.nd; ++d) *vec = *vec && (p.outer.stride[o][d] * es) % 16 == 0;
  }
  p.packs_per_row = *vec ? inner / kVec : inner;
  p.total_packs = y.numel() / inner * p.packs_per_row;
  return p;
}

template <class AT, class BT, class YT, bool kAdd>
void launch(const ElementwiseArgs& p, bool vec, cudaStream_t s) {
  const int threads = 256;
  const int blocks = grid_blocks((p.total_packs + threads - 1) / threads, 4096);
  auto* kernel = vec ? elementwise_kernel<AT, BT, YT, kAdd, kVec> : elementwise_kernel<AT, BT, YT, kAdd, 1>;
  launch_small_op(kernel, blocks, threads, 0, s, "elementwise kernel launch", p);
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& y, void* stream) {
  const char* op = "cuda::add";
  if (!start_op(op, a, y.numel())) return;
  bool vec = false;
  const ElementwiseArgs p = layout(op, a, b, y, &vec);
  visit_bf16_fp32(a.dtype(), op, [&](auto at) {
    visit_bf16_fp32(b.dtype(), op, [&](auto bt) {
      visit_bf16_fp32(y.dtype(), op, [&](auto yt) {
        launch<decltype(at), decltype(bt), decltype(yt), true>(p, vec, as_stream(stream));
      });
    });
  });
  LOCUS_CUDA_CHECK_LAUNCH("add kernel launch");
}

void cast(const Tensor& x, const Tensor& y, void* stream) {
  const char* op = "cuda::cast";
  if (!start_op(op, x, y.numel())) return;
  bool vec = false;
  const ElementwiseArgs p = layout(op, x, x, y, &vec);
  visit_float(x.dtype(), op, [&](auto xt) {
    visit_float(y.dtype(), op, [&](auto yt) {
      launch<decltype(xt), decltype(xt), decltype(yt), false>(p, vec, as_stream(stream));
    });
  });
  LOCUS_CUDA_CHECK_LAUNCH("cast kernel launch");
}

}  // namespace locus::cuda
