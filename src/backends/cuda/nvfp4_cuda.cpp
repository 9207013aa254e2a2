// NVFP4 on CUDA: nvfp4_prepare (the load-time shuffle into kCudaTiled, nvfp4_layout.h), the
// in-place reload, and the checked entry points of the weight-only GEMM.
#include <cuda_runtime_api.h>

#include <vector>

#include "backends/cpu/thread_pool.h"
#include "backends/cuda/bf16_gemm.h"
#include "backends/cuda/cublaslt_matmul.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/nvfp4_shuffle.h"

namespace locus::cuda {
namespace {

using namespace detail;

Nvfp4HostTiled shuffle(const ops::Nvfp4Weight& w) { return nvfp4_shuffle_host(w, cpu::ThreadPool::global()); }

void upload(const Nvfp4HostTiled& h, const ops::Nvfp4Weight& dst) {
  LOCUS_CHECK(dst.scales.is_contiguous() && dst.scales.nbytes() == h.scales.size(),
              "nvfp4 upload: scale buffer has the wrong size");
  LOCUS_CHECK(dst.packed.is_contiguous() && dst.packed.nbytes() == h.packed.size(),
              "nvfp4 upload: destination buffer has the wrong size");
  LOCUS_CUDA_CHECK(cudaMemcpy(dst.packed.data_ptr(), h.packed.data(), h.packed.size(), cudaMemcpyHostToDevice));
  LOCUS_CUDA_CHECK(cudaMemcpy(dst.scales.data_ptr(), h.scales.data(), h.scales.size(), cudaMemcpyHostToDevice));
}

void check_tiled(const ops::Nvfp4Weight& w, const char* op) {
  LOCUS_CHECK(w.layout == ops::Nvfp4Layout::kCudaTiled, op, ": the weight must be prepared for CUDA (nvfp4_prepare)");
  LOCUS_CHECK(w.packed.defined() && w.packed.device().is_cuda() && w.scales.defined() && w.scales.device().is_cuda(),
              op, ": the prepared weight's tensors must be on a CUDA device");
  LOCUS_CHECK(w.packed.numel() == nvfp4_padded_rows(w.n) * nvfp4_padded_k(w.k) / 2 &&
                  w.scales.numel() == nvfp4_padded_rows(w.n) * nvfp4_padded_k(w.k) / 16 + kNvfp4GlobalScaleBytes,
              op, ": the prepared weight's buffers do not match N=", w.n, " K=", w.k);
}

void check_x(const Tensor& x, int64_t k, const char* op) {
  LOCUS_CHECK(x.defined() && x.device().is_cuda(), op, ": x must be on a CUDA device");
  LOCUS_CHECK(x.dtype() == DType::kBF16 && x.is_row_major_2d() && x.size(1) == k, op, ": x must be bf16 [M, ", k,
              "] with stride(1) == 1, got ", x.describe());
  LOCUS_CHECK(x.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0, op,
              ": x rows must be 16-byte aligned (row stride ", x.stride(0), " elements)");
}

void check_y(const Tensor& y, int64_t m, int64_t n, const Tensor& x, const char* op) {
  LOCUS_CHECK(y.defined() && y.device().is_cuda() && y.device() == x.device(), op,
              ": y must be on the same CUDA device as x");
  LOCUS_CHECK((y.dtype() == DType::kBF16 || y.dtype() == DType::kFP32) && y.dim() == 2 && y.stride(1) == 1 &&
                  y.size(0) == m && y.size(1) == n && y.stride(0) >= n,
              op, ": y must be bf16/fp32 [", m, ", ", n, "] with stride(1) == 1, got ", y.describe());
  // Never in place: the output must not overlap the activations.
  const auto* x0 = static_cast<const char*>(x.data_ptr());
  const auto* x1 = x0 + ((x.size(0) - 1) * x.stride(0) + x.size(1)) * 2;
  const auto* y0 = static_cast<const char*>(y.data_ptr());
  const auto* y1 = y0 + ((m - 1) * y.stride(0) + n) * dtype_size(y.dtype());
  LOCUS_CHECK(m == 0 || y1 <= x0 || x1 <= y0, op, ": y overlaps x (NVFP4 GEMM is never in place)");
}

// The weight dequantized into stream-ordered scratch (bf16 [n, k64], times 2^-16) for cuBLASLt, with
// alpha = global scale * 2^16 in device memory; the scratch goes back to the pool with the object.
struct DequantizedWeight {
  detail::Bf16Weight weight;
  void* scratch = nullptr;
  cudaStream_t stream;
  DequantizedWeight(const ops::Nvfp4Weight& w, cudaStream_t s) : stream(s) {
    const int64_t k64 = nvfp4_padded_k(w.k);
    const size_t bytes = static_cast<size_t>(w.n * k64) * 2;
    scratch = scratch_alloc(bytes + sizeof(float), s);  // the rows, then alpha
    auto* alpha = reinterpret_cast<float*>(static_cast<char*>(scratch) + bytes);
    launch_nvfp4_dequant(w.packed.data<uint8_t>(), w.scales.data<uint16_t>(), nvfp4_global_scale_device(w), w.n,
                         k64 / kNvfp4ChunkK, static_cast<uint16_t*>(scratch), k64, alpha, s);
    weight = {scratch, k64, w.n, alpha};
  }
  ~DequantizedWeight() { cudaFreeAsync(scratch, stream); }  // no throw from a destructor
  DequantizedWeight(const DequantizedWeight&) = delete;
  DequantizedWeight& operator=(const DequantizedWeight&) = delete;
};

std::vector<DomainSlice> whole(const ops::Nvfp4Weight& w, bool swiglu, void* stream) {
  return {DomainSlice{0, swiglu ? w.n / 2 : w.n, stream}};
}

// The weight-streaming kernel's launch of the product (stream_gemm.h, or the wgmma kernel where
// that is chosen); false when it does not take it.
bool streaming_gemm(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y, bool swiglu,
                    void* stream) {
  return nvfp4_gemm_domains(x, {w}, bias, y, swiglu, whole(w, swiglu, stream), stream);
}

// At decode M, the faster of the streaming kernel and the matrix-vector kernel (nvfp4_gemv.h),
// timed once per problem (path_choice.h); false, with nothing launched, where the matrix-vector
// kernel does not take the problem or LOCUS_NVFP4_GEMV=0.
bool decode_gemm(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y, bool swiglu,
                 void* stream) {
  const detail::Nvfp4GemvArgs g = detail::nvfp4_gemv_args(x, w, bias, y, swiglu);
  if (!detail::nvfp4_gemv_enabled() || !detail::nvfp4_gemv_eligible(g)) return false;
  // The streaming kernel takes every problem the matrix-vector kernel does (M <= 16, K % 16 == 0,
  // aligned rows; with SwiGLU up rows on a tile), so every path computes it.
  detail::run_nvfp4_gemv_fastest(
      g,
      [&](cudaStream_t st) {
        LOCUS_CHECK(streaming_gemm(x, w, bias, y, swiglu, st), "cuda::nvfp4_gemm: the streaming kernel refused M = ",
                    g.m);
      },
      static_cast<cudaStream_t>(stream));
  return true;
}

}  // namespace

const float* nvfp4_global_scale_device(const ops::Nvfp4Weight& tiled) {
  return reinterpret_cast<const float*>(tiled.scales.data<uint8_t>() + tiled.scales.numel() - kNvfp4GlobalScaleBytes);
}

ops::Nvfp4Weight nvfp4_prepare(const ops::Nvfp4Weight& linear_cpu, int device_index, int domain) {
  Nvfp4HostTiled h = shuffle(linear_cpu);
  ops::Nvfp4Weight out;
  out.n = linear_cpu.n;
  out.k = linear_cpu.k;
  out.global_scale = linear_cpu.global_scale;
  out.layout = ops::Nvfp4Layout::kCudaTiled;
  const Device dev = Device::cuda(device_index);
  out.packed = Tensor::empty({h.n64, h.k64 / 2}, DType::kU8, dev, domain);
  // One flat buffer: the scale array, then the global scale, so that copying `packed` and
  // `scales` of a freshly prepared weight into this one is a complete in-place reload.
  out.scales = Tensor::empty({static_cast<int64_t>(h.scales.size())}, DType::kU8, dev, domain);
  upload(h, out);
  return out;
}

void nvfp4_prepare_into(const ops::Nvfp4Weight& linear_cpu, const ops::Nvfp4Weight& tiled) {
  check_tiled(tiled, "nvfp4_prepare_into");
  LOCUS_CHECK(linear_cpu.n == tiled.n && linear_cpu.k == tiled.k, "nvfp4_prepare_into: new weight [", linear_cpu.n,
              ", ", linear_cpu.k, "] does not match the prepared one [", tiled.n, ", ", tiled.k, "]");
  upload(shuffle(linear_cpu), tiled);
}

ops::Nvfp4Weight nvfp4_clone(const ops::Nvfp4Weight& tiled, int domain) {
  check_tiled(tiled, "nvfp4_clone");
  ops::Nvfp4Weight out = tiled;
  const Device dev = tiled.packed.device();
  out.packed = Tensor::empty(tiled.packed.shape(), DType::kU8, dev, domain);
  const int64_t sbytes = tiled.scales.numel();
  out.scales = Tensor::empty({sbytes}, DType::kU8, dev, domain);
  use_device(dev.index);
  LOCUS_CUDA_CHECK(cudaMemcpy(out.packed.data_ptr(), tiled.packed.data_ptr(), tiled.packed.nbytes(), cudaMemcpyDeviceToDevice));
  LOCUS_CUDA_CHECK(cudaMemcpy(out.scales.data_ptr(), tiled.scales.data_ptr(), sbytes, cudaMemcpyDeviceToDevice));
  LOCUS_CUDA_CHECK(cudaDeviceSynchronize());
  return out;
}

void nvfp4_gemm(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y, void* stream) {
  check_tiled(w, "cuda::nvfp4_gemm");
  check_x(x, w.k, "cuda::nvfp4_gemm");
  check_y(y, x.size(0), w.n, x, "cuda::nvfp4_gemm");
  if (bias.defined()) {
    LOCUS_CHECK(bias.device() == x.device() && (bias.dtype() == DType::kBF16 || bias.dtype() == DType::kFP32) &&
                    bias.dim() == 1 && bias.size(0) == w.n && bias.stride(0) == 1,
                "cuda::nvfp4_gemm: bias must be a dense bf16/fp32 [", w.n, "] on the device, got ", bias.describe());
  }
  if (x.size(0) == 0) return;
  use_device(x.device().index);
  if (decode_gemm(x, w, bias, y, false, stream) || streaming_gemm(x, w, bias, y, false, stream)) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  DequantizedWeight dq(w, s);
  detail::bf16_gemm(x, dq.weight, bias, y, s);
}

void nvfp4_gemm_swiglu(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& y, void* stream) {
  check_tiled(w, "cuda::nvfp4_gemm_swiglu");
  LOCUS_CHECK(w.n % 2 == 0, "cuda::nvfp4_gemm_swiglu: the fused gate/up weight needs an even row count, got ", w.n);
  const int64_t inter = w.n / 2, m = x.size(0);
  check_x(x, w.k, "cuda::nvfp4_gemm_swiglu");
  check_y(y, m, inter, x, "cuda::nvfp4_gemm_swiglu");
  if (m == 0) return;
  use_device(x.device().index);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Fused (in either kernel) when the up rows start on a 16-row tile.
  if (decode_gemm(x, w, Tensor(), y, true, stream) || streaming_gemm(x, w, Tensor(), y, true, stream)) return;
  if (m <= kNvfp4StreamMaxM) {
    // Gate and up rows share a tile: fp32 [gate | up] products, then SwiGLU.
    float* gu = static_cast<float*>(scratch_alloc(static_cast<size_t>(m * w.n) * sizeof(float), s));
    Tensor gu_t = Tensor::from_blob(gu, {m, w.n}, DType::kFP32, x.device());
    LOCUS_CHECK(nvfp4_gemm_domains(x, {w}, Tensor(), gu_t, false, whole(w, false, stream), stream),
                "cuda::nvfp4_gemm_swiglu: the streaming kernel refused M = ", m);
    SwigluArgs sa{gu, gu + inter, w.n, w.n, true, y.data_ptr(), y.stride(0), y.dtype() == DType::kFP32, m, inter};
    launch_swiglu(sa, s);
    scratch_free(gu, s);
    return;
  }
  DequantizedWeight dq(w, s);
  detail::bf16_gemm_swiglu(x, dq.weight, y, s);
}

}  // namespace locus::cuda
