#include "backends/cuda/persistent_alloc.h"

#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_check.h"

namespace locus::cuda::detail {

void* persistent_device_alloc(size_t bytes, const void* init, const char* what) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  LOCUS_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  void* p = nullptr;
  cudaStream_t side = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  if (err == cudaSuccess) {
    err = init ? cudaMemcpyAsync(p, init, bytes, cudaMemcpyHostToDevice, side) : cudaMemsetAsync(p, 0, bytes, side);
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(side);
  if (side) cudaStreamDestroy(side);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess && p) {
    cudaFree(p);
    p = nullptr;
  }
  LOCUS_CUDA_CHECK_NAMED(err, what);
  return p;
}

}  // namespace locus::cuda::detail
