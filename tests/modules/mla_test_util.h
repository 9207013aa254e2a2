// Helpers for the MLA module tests (CPU and CUDA): a small config, random weights, building a
// module, running one sequence, and the fp64 reference of the whole block.
#pragma once
#include <memory>

#include "module_test_util.h"
#include "modules/mla.h"

namespace locus::testing {

using modules::MLA;
using modules::MlaConfig;
using modules::MlaKvCache;
using modules::MlaPath;
using modules::MlaSequence;

// End to end the output passes through about ten bf16 storage points (q_a, q, kv_a, the latent
// cache, the expanded k/v or the absorbed q/o latents, o, y), each adding a rounding of about
// 2^-9 / sqrt(3) relative (rms): sqrt(10) * 1.1e-3 = 3.6e-3 expected, bounded with some margin.
constexpr double kMlaTolerance = 1e-2;

inline MlaConfig small_cfg(int64_t q_lora) {
  MlaConfig c;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 16;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.rope.theta = 10000.0;
  c.rope.yarn = true;  // DeepSeek-style YaRN: the softmax scale carries mscale^2
  c.rope.factor = 4.0;
  c.rope.original_max_position = 16;
  c.rope.mscale = 1.0;
  c.rope.mscale_all_dim = 1.0;
  c.max_positions = 64;
  return c;
}

// Random weights: projections Normal(0, sd), norm weights near 1.
struct MlaWeights {
  modules::WeightMap map;
  MlaWeights(const MlaConfig& c, uint64_t seed, double sd = 0.2) {
    const int64_t H = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
    auto w = [&](const char* name, Shape s, double stddev) { map[name] = randn(s, DType::kBF16, seed++, stddev); };
    auto norm = [&](const char* name, int64_t n) {
      Tensor t = randn({n}, DType::kBF16, seed++, 0.1);
      for (int64_t i = 0; i < n; ++i) set(t, i, 1.0 + get(t, i));
      map[name] = t;
    };
    if (c.q_lora_rank) {
      w("q_a_proj.weight", {c.q_lora_rank, c.hidden_size}, sd);
      norm("q_a_layernorm.weight", c.q_lora_rank);
      w("q_b_proj.weight", {H * (dn + dr), c.q_lora_rank}, sd);
    } else {
      w("q_proj.weight", {H * (dn + dr), c.hidden_size}, sd);
    }
    w("kv_a_proj_with_mqa.weight", {c.kv_lora_rank + dr, c.hidden_size}, sd);
    norm("kv_a_layernorm.weight", c.kv_lora_rank);
    w("kv_b_proj.weight", {H * (dn + dv), c.kv_lora_rank}, sd);
    w("o_proj.weight", {c.hidden_size, H * dv}, sd);
  }
};

inline std::unique_ptr<MLA> build(const modules::ModuleContext& ctx, const MlaConfig& c, const MlaWeights& w) {
  auto m = std::make_unique<MLA>(ctx, c);
  for (const auto& [k, v] : w.map) m->load(k, v);
  m->transform();
  m->localize();
  return m;
}

// Positions start, start + 1, ... as i32 on `device`.
inline Tensor positions(int64_t start, int64_t n, Device device = Device::cpu()) {
  Tensor p = Tensor::empty({n}, DType::kI32);
  for (int64_t i = 0; i < n; ++i) p.data<int32_t>()[i] = static_cast<int32_t>(start + i);
  return device.is_cpu() ? p : p.to(device);
}

// Runs x (one sequence) through the module, appending to `cache`; y (poisoned first) lives on
// x's device.
inline Tensor run(MLA& m, MlaKvCache& cache, const Tensor& x, MlaPath path) {
  Tensor y = Tensor::empty({x.size(0), m.config().hidden_size}, DType::kBF16, x.device());
  y.fill_nan_();
  m.forward(x, positions(cache.length, x.size(0), x.device()), {{&cache, x.size(0)}}, y, path);
  return y;
}

inline MlaKvCache new_cache(const MlaConfig& c, int64_t cap = 32, Device device = Device::cpu()) {
  MlaKvCache k = MlaKvCache::allocate(cap, c.kv_lora_rank, c.qk_rope_head_dim, device);
  k.latent.fill_nan_();  // unwritten rows must never be read
  return k;
}

// ---- fp64 reference (positions 0..T-1, empty cache; `m` is a CPU module) ----
inline Mat rms(const Mat& x, const std::vector<double>& w, double eps) {
  Mat y = x;
  for (int64_t i = 0; i < x.rows; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < x.cols; ++j) ss += x.at(i, j) * x.at(i, j);
    const double inv = 1.0 / std::sqrt(ss / x.cols + eps);
    for (int64_t j = 0; j < x.cols; ++j) y.at(i, j) = x.at(i, j) * inv * w[j];
  }
  return y;
}

inline void rope_inplace(double* v, int64_t dim, int64_t pos, const modules::MLA& m) {
  const auto& t = m.rope_table();
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double c = t.cos.data<float>()[pos * t.cos.stride(0) + i], s = t.sin.data<float>()[pos * t.sin.stride(0) + i];
    const double a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
  }
}

inline Mat ref_mla(const MLA& m, const MlaWeights& w, const Tensor& x_t) {
  const MlaConfig& c = m.config();
  const int64_t T = x_t.size(0), H = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t dc = c.kv_lora_rank;
  auto W = [&](const char* n) { return Mat(w.map.at(n)); };
  auto V = [&](const char* n) { return to_doubles(w.map.at(n)); };
  Mat x(x_t);
  Mat q = c.q_lora_rank ? ref_linear(rms(ref_linear(x, W("q_a_proj.weight")), V("q_a_layernorm.weight"), c.rms_norm_eps),
                                     W("q_b_proj.weight"))
                        : ref_linear(x, W("q_proj.weight"));
  Mat kva = ref_linear(x, W("kv_a_proj_with_mqa.weight"));
  Mat ckv(T, dc), kpe(T, dr);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < dc; ++j) ckv.at(t, j) = kva.at(t, j);
    for (int64_t j = 0; j < dr; ++j) kpe.at(t, j) = kva.at(t, dc + j);
    rope_inplace(&kpe.at(t, 0), dr, t, m);
    for (int64_t h = 0; h < H; ++h) rope_inplace(&q.at(t, h * (dn + dr) + dn), dr, t, m);
  }
  ckv = rms(ckv, V("kv_a_layernorm.weight"), c.rms_norm_eps);
  Mat kvb = ref_linear(ckv, W("kv_b_proj.weight"));  // [T, H * (dn + dv)]
  Mat o(T, H * dv);
  const double scale = m.softmax_scale();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> sc(t + 1);
      double mx = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) {
        double d = 0;
        for (int64_t j = 0; j < dn; ++j) d += q.at(t, h * (dn + dr) + j) * kvb.at(s, h * (dn + dv) + j);
        for (int64_t j = 0; j < dr; ++j) d += q.at(t, h * (dn + dr) + dn + j) * kpe.at(s, j);
        sc[s] = d * scale;
        mx = std::max(mx, sc[s]);
      }
      double sum = 0;
      for (double& v : sc) sum += (v = std::exp(v - mx));
      for (int64_t j = 0; j < dv; ++j) {
        double acc = 0;
        for (int64_t s = 0; s <= t; ++s) acc += sc[s] * kvb.at(s, h * (dn + dv) + dn + j);
        o.at(t, h * dv + j) = acc / sum;
      }
    }
  return ref_linear(o, W("o_proj.weight"));
}

}  // namespace locus::testing
