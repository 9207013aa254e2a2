// RMSNorm and embedding lookup on CUDA (cuda_small_ops.h): one block per row, fp32 math, one
// rounding on store, 16-byte accesses when every row is 16-byte aligned and H % 8 == 0.
#include <type_traits>

#include "backends/cuda/cuda_small_ops.h"
#include "backends/cuda/float_pack.cuh"
#include "backends/cuda/small_ops_launch.cuh"
#include "backends/cuda/strided_offsets.cuh"

namespace locus::cuda {
namespace {

using namespace detail;

constexpr int kVec = 8;  // elements per 16-byte access of bf16 (two accesses for fp32)

struct RmsnormArgs {
  const void* x;
  void* y;  // may be x itself: each element is read and then written by the same thread
  const void* w;
  const void* r = nullptr;  // add_rmsnorm: x += r (x's dtype) before the norm
  int64_t w_stride;
  OffsetCalc<3> rows;  // leading dimensions of x, y and r
  int64_t num_rows, h;
  float eps;
};

// Chunks of V elements a thread keeps in registers between the sum of squares and the scaling
// (h = 7168 at 8 elements a chunk is one chunk a thread); later chunks are read from x again.
constexpr int kKeptChunks = 2;

template <class XT, class WT, class YT, int V>
__global__ void rmsnorm_kernel(RmsnormArgs a) {
  small_op_start();
  constexpr bool kVector = V > 1;
  __shared__ float scratch[32];
  using XS = typename XT::Storage;
  using YS = typename YT::Storage;
  const auto* w = static_cast<const typename WT::Storage*>(a.w);
  const int64_t first = static_cast<int64_t>(threadIdx.x) * V, step = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t row = blockIdx.x; row < a.num_rows; row += gridDim.x) {
    int64_t off[3];
    a.rows.offsets(row, off);
    const XS* x = static_cast<const XS*>(a.x) + off[0];
    YS* y = static_cast<YS*>(a.y) + off[1];
    float kept[kKeptChunks][V];
    float ss = 0.f;
    int i = 0;
    for (int64_t c = first; c < a.h; c += step, ++i) {
      float v[V];
      load_f32<XT, V, kVector>(x + c, v);
      if (a.r != nullptr) {  // the residual sum, rounded to x's dtype as ops::add stores it, is what the norm reads
        float r[V];
        load_f32<XT, V, kVector>(static_cast<const XS*>(a.r) + off[2] + c, r);
#pragma unroll
        for (int e = 0; e < V; ++e) v[e] = XT::load(XT::store(v[e] + r[e]));
        store_f32<XT, V, kVector>(const_cast<XS*>(x) + c, v);
      }
#pragma unroll
      for (int e = 0; e < V; ++e) ss += v[e] * v[e];
#pragma unroll
      for (int k = 0; k < kKeptChunks; ++k)
        if (k == i)
#pragma unroll
          for (int e = 0; e < V; ++e) kept[k][e] = v[e];
    }
    // Every thread has passed its reads of x before any thread writes y (block_sum syncs).
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / static_cast<float>(a.h) + a.eps);
    i = 0;
    for (int64_t c = first; c < a.h; c += step, ++i) {
      float v[V], wv[V], out[V];
      if (i < kKeptChunks) {
#pragma unroll
        for (int k = 0; k < kKeptChunks; ++k)
          if (k == i)
#pragma unroll
            for (int e = 0; e < V; ++e) v[e] = kept[k][e];
      } else {
        load_f32<XT, V, kVector>(x + c, v);
      }
      if constexpr (kVector) {
        load_f32<WT, V, true>(w + c, wv);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) wv[e] = WT::load(w[(c + e) * a.w_stride]);
      }
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = v[e] * inv * wv[e];
      store_f32<YT, V, kVector>(y + c, out);
    }
  }
}

struct EmbeddingArgs {
  const void* table;
  int64_t table_ld, vocab;
  const void* ids;
  int64_t ids_stride;
  void* y;
  int64_t y_ld, tokens, h;
};

template <class TT, class YT, class Id, int V>
__global__ void embedding_kernel(EmbeddingArgs a) {
  small_op_start();
  constexpr bool kVector = V > 1;
  using TS = typename TT::Storage;
  using YS = typename YT::Storage;
  for (int64_t t = blockIdx.x; t < a.tokens; t += gridDim.x) {
    const int64_t id = static_cast<int64_t>(static_cast<const Id*>(a.ids)[t * a.ids_stride]);
    const bool ok = id >= 0 && id < a.vocab;  // a bad device-side id reads nothing and gives a NaN row
    const TS* src = static_cast<const TS*>(a.table) + (ok ? id : 0) * a.table_ld;
    YS* dst = static_cast<YS*>(a.y) + t * a.y_ld;
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * V; c < a.h; c += static_cast<int64_t>(blockDim.x) * V) {
      if constexpr (std::is_same_v<TT, YT>) {  // same format: the stored bits, as the CPU's memcpy
        if (ok) {
          copy_elems<TS, V, kVector>(src + c, dst + c);
          continue;
        }
      }
      float v[V];
      if (ok) {
        load_f32<TT, V, kVector>(src + c, v);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) v[e] = __int_as_float(0x7FC00000);
      }
      store_f32<YT, V, kVector>(dst + c, v);
    }
  }
}

}  // namespace

namespace {

// rmsnorm, and add_rmsnorm where `r` is given (else it is x).
void launch_rmsnorm(const char* op, const Tensor& x, const Tensor* r, const Tensor& weight, float eps, const Tensor& y,
                    void* stream) {
  if (!start_op(op, x, x.numel())) return;
  RmsnormArgs a{};
  a.x = x.data_ptr();
  a.y = y.data_ptr();
  a.w = weight.data_ptr();
  a.r = r ? r->data_ptr() : nullptr;
  a.w_stride = weight.stride(0);
  a.h = x.size(-1);
  a.num_rows = x.numel() / a.h;
  a.rows = make_offset_calc<3>(op, x.shape(), x.dim() - 1, {&x, &y, r ? r : &x});
  a.eps = eps;
  const bool vec = a.h % kVec == 0 && rows_aligned_16(x) && rows_aligned_16(y) && rows_aligned_16(weight) &&
                   (r == nullptr || rows_aligned_16(*r)) && (a.w_stride == 1 || a.h == 1);
  const int threads = block_threads((a.h + (vec ? kVec : 1) - 1) / (vec ? kVec : 1), 1024);
  const cudaStream_t s = as_stream(stream);
  visit_bf16_fp32(x.dtype(), op, [&](auto xt) {
    visit_bf16_fp32(weight.dtype(), op, [&](auto wt) {
      visit_bf16_fp32(y.dtype(), op, [&](auto yt) {
        using XT = decltype(xt);
        using WT = decltype(wt);
        using YT = decltype(yt);
        auto* kernel = vec ? rmsnorm_kernel<XT, WT, YT, kVec> : rmsnorm_kernel<XT, WT, YT, 1>;
        launch_small_op(kernel, grid_blocks(a.num_rows), threads, 0, s, "rmsnorm kernel launch", a);
      });
    });
  });
}

}  // namespace

void rmsnorm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, void* stream) {
  launch_rmsnorm("cuda::rmsnorm", x, nullptr, weight, eps, y, stream);
}

void add_rmsnorm(const Tensor& x, const Tensor& r, const Tensor& weight, float eps, const Tensor& y, void* stream) {
  launch_rmsnorm("cuda::add_rmsnorm", x, &r, weight, eps, y, stream);
}

void embedding(const Tensor& table, const Tensor& ids, const Tensor& y, void* stream) {
  const char* op = "cuda::embedding";
  if (!start_op(op, table, y.numel())) return;
  EmbeddingArgs a{};
  a.table = table.data_ptr();
  a.table_ld = table.stride(0);
  a.vocab = table.size(0);
  a.ids = ids.data_ptr();
  a.ids_stride = ids.stride(0);
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.tokens = y.size(0);
  a.h = y.size(1);
  const bool vec = a.h % kVec == 0 && rows_aligned_16(table) && rows_aligned_16(y);
  const int threads = block_threads((a.h + (vec ? kVec : 1) - 1) / (vec ? kVec : 1), 512);
  const cudaStream_t s = as_stream(stream);
  visit_float(table.dtype(), op, [&](auto tt) {
    visit_float(y.dtype(), op, [&](auto yt) {
      using TT = decltype(tt);
      using YT = decltype(yt);
      auto launch = [&](auto id_tag) {
        using Id = decltype(id_tag);
        auto* kernel = vec ? embedding_kernel<TT, YT, Id, kVec> : embedding_kernel<TT, YT, Id, 1>;
        launch_small_op(kernel, grid_blocks(a.tokens), threads, 0, s, "embedding kernel launch", a);
      };
      if (ids.dtype() == DType::kI32) launch(int32_t{});
      else launch(int64_t{});
    });
  });
  LOCUS_CUDA_CHECK_LAUNCH("embedding kernel launch");
}

}  // namespace locus::cuda
