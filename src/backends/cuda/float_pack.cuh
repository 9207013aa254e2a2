// Element formats for the small-op kernels: each tag names the stored type, loads it as fp32
// exactly and stores fp32 with one round-to-nearest-even (the conversions of core/float_convert.h,
// so results round exactly as the CPU backend's). Pack/load_f32/store_f32 move V consecutive
// elements with 16-byte accesses when the caller has checked the alignment.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "core/float_convert.h"

namespace locus::cuda::detail {

struct Bf16 {
  using Storage = uint16_t;
  static __device__ __forceinline__ float load(uint16_t b) { return bf16_bits_to_f32(b); }
  static __device__ __forceinline__ uint16_t store(float v) { return f32_to_bf16_bits(v); }
};
struct Fp16 {
  using Storage = uint16_t;
  static __device__ __forceinline__ float load(uint16_t b) { return f16_bits_to_f32(b); }
  static __device__ __forceinline__ uint16_t store(float v) { return f32_to_f16_bits(v); }
};
struct Fp32 {
  using Storage = float;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};

// V elements of storage type S as one aligned object: the compiler moves it with 16-byte
// vector accesses (two for a 32-byte pack).
template <class S, int V>
struct alignas(sizeof(S) * V < 16 ? sizeof(S) * V : 16) Pack {
  S v[V];
};

// The V elements at p as fp32. kVector: p is 16-byte aligned and V elements span a multiple of
// 16 bytes; otherwise V scalar loads.
template <class T, int V, bool kVector>
__device__ __forceinline__ void load_f32(const typename T::Storage* p, float (&out)[V]) {
  using S = typename T::Storage;
  if constexpr (kVector) {
    static_assert(sizeof(S) * V % 16 == 0, "vector packs span whole 16-byte words");
    const Pack<S, V> pk = *reinterpret_cast<const Pack<S, V>*>(p);
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = T::load(pk.v[e]);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) out[e] = T::load(p[e]);
  }
}

template <class T, int V, bool kVector>
__device__ __forceinline__ void store_f32(typename T::Storage* p, const float (&in)[V]) {
  using S = typename T::Storage;
  if constexpr (kVector) {
    static_assert(sizeof(S) * V % 16 == 0, "vector packs span whole 16-byte words");
    Pack<S, V> pk;
#pragma unroll
    for (int e = 0; e < V; ++e) pk.v[e] = T::store(in[e]);
    *reinterpret_cast<Pack<S, V>*>(p) = pk;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) p[e] = T::store(in[e]);
  }
}

// Copies V elements unchanged (stored bits), with 16-byte accesses when kVector.
template <class S, int V, bool kVector>
__device__ __forceinline__ void copy_elems(const S* src, S* dst) {
  if constexpr (kVector) {
    *reinterpret_cast<Pack<S, V>*>(dst) = *reinterpret_cast<const Pack<S, V>*>(src);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) dst[e] = src[e];
  }
}

// Calls fn(Tag{}) with the format tag of dtype t. Only the formats an op accepts are
// instantiated; the dispatchers in ops/ have validated t, so the throw is a last guard.
template <class Fn>
void visit_bf16_fp32(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::kBF16: return fn(Bf16{});
    case DType::kFP32: return fn(Fp32{});
    default: LOCUS_THROW(op, ": ", dtype_name(t), " is not supported on CUDA (bf16 or fp32)");
  }
}

template <class Fn>
void visit_float(DType t, const char* op, Fn&& fn) {
  switch (t) {
    case DType::kBF16: return fn(Bf16{});
    case DType::kFP16: return fn(Fp16{});
    case DType::kFP32: return fn(Fp32{});
    default: LOCUS_THROW(op, ": ", dtype_name(t), " is not supported on CUDA (bf16, fp16 or fp32)");
  }
}

}  // namespace locus::cuda::detail
