// Internal to the CUDA backend (device code): the BF16 decode matrix-vector kernel's (bf16_gemv.h)
// streaming weight load and output epilogue.
#pragma once
#include <cstdint>

#include "backends/cuda/bf16_gemv.h"
#include "core/float_convert.h"

namespace locus::cuda::detail {

// A weight vector: read once, so it bypasses L1 (the activations, reused by every row, stay there).
__device__ __forceinline__ uint4 gemv_load_streamed(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Writes token t's output of weight row `row`, the product's sum s: y = alpha s (+ bias), rounded
// once to y's type.
__device__ __forceinline__ void gemv_store_output(const Bf16GemvArgs& a, int64_t t, int64_t row, float s) {
  if (a.alpha != nullptr) s *= *a.alpha;
  if (a.bias != nullptr)
    s += a.bias_f32 ? static_cast<const float*>(a.bias)[row]
                    : bf16_bits_to_f32(static_cast<const uint16_t*>(a.bias)[row]);
  if (a.y_f32)
    static_cast<float*>(a.y)[t * a.y_ld + row] = s;
  else
    static_cast<uint16_t*>(a.y)[t * a.y_ld + row] = f32_to_bf16_bits(s);
}

}  // namespace locus::cuda::detail
