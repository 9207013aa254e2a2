// The CUDA backend's op implementations, called by the dispatchers in src/ops/ when the tensors
// live on a CUDA device. Same contracts as the ops/ headers; `stream` is a cudaStream_t
// (nullptr = the legacy default stream). Only compiled when LOCUS_WITH_CUDA is defined.
// No CUDA header is included here, so host code in other layers can include this file.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/nvfp4.h"

namespace locus::cuda {

// True when a CUDA device is usable (driver present, at least one GPU). Never throws.
bool device_available();

void gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, void* stream);
void gemm_swiglu(const Tensor& x, const Tensor& w_gate_up, const Tensor& y, void* stream);
void swiglu(const Tensor& gate_up, const Tensor& y, void* stream);
void bmm(const Tensor& a, const Tensor& b, const Tensor& y, void* stream);

// Shuffles a kLinear weight into the kernel's kCudaTiled layout (nvfp4_layout.h) on the device,
// tagged with `domain`. The fp32 global scale lives in device memory after the scale array.
ops::Nvfp4Weight nvfp4_prepare(const ops::Nvfp4Weight& linear_cpu, int device_index, int domain);
// In-place reload: rewrites a prepared weight's buffers (same device pointers, so captured
// graphs use the new values, global scale included). Shapes must match.
void nvfp4_prepare_into(const ops::Nvfp4Weight& linear_cpu, const ops::Nvfp4Weight& tiled);
// A device copy of a prepared (kCudaTiled) weight, global scale included, tagged with `domain`.
ops::Nvfp4Weight nvfp4_clone(const ops::Nvfp4Weight& tiled, int domain);
void nvfp4_gemm(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y, void* stream);
void nvfp4_gemm_swiglu(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& y, void* stream);

// Fork/join across streams with events (capture-safe: stream events, never green-context events).
// fork: every stream in `targets` waits for the work queued so far on `origin`.
// join: `origin` waits for the work queued so far on every stream in `targets`.
void fork_streams(void* origin, const std::vector<void*>& targets);
void join_streams(void* origin, const std::vector<void*>& targets);

}  // namespace locus::cuda
