// Helpers for the module tests: locality setups over emulated CPU domains and fp64 references.
#pragma once
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "locality/domain_place.h"
#include "locality/planner.h"
#include "modules/module.h"
#include "ops/nvfp4.h"
#include "test_util.h"

namespace locus::testing {

// domains == 0: locality off (no planner, no runtime). Otherwise an enabled policy over a CPU
// topology of `domains` emulated domains (one worker thread each).
struct LdSetup {
  std::shared_ptr<const locality::Planner> planner;
  std::shared_ptr<const locality::LocalityRuntime> runtime;
  modules::ModuleContext ctx(const std::string& name, bool strict = false) const {
    modules::ModuleContext c;
    c.planner = planner;
    c.runtime = runtime;
    c.name = name;
    c.require_locality = strict;
    return c;
  }
};

inline LdSetup make_ld(int domains, const std::function<void(locality::LocalityDomainPolicy&)>& tweak = {}) {
  LdSetup s;
  if (domains == 0) return s;
  locality::Topology topo = locality::cpu_topology(domains, domains, "test");
  locality::LocalityDomainPolicy policy;
  policy.enabled = true;
  if (tweak) tweak(policy);
  s.planner = std::make_shared<locality::Planner>(policy, topo);
  s.runtime = locality::shared_locality_runtime(topo);
  return s;
}

// Row-major double matrix.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(static_cast<size_t>(r * c), 0.0) {}
  explicit Mat(const Tensor& t) : rows(t.size(0)), cols(t.size(1)), v(to_doubles(t)) {}
  double& at(int64_t r, int64_t c) { return v[r * cols + c]; }
  double at(int64_t r, int64_t c) const { return v[r * cols + c]; }
  Mat rows_range(int64_t r0, int64_t r1) const {
    Mat m(r1 - r0, cols);
    std::copy(v.begin() + r0 * cols, v.begin() + r1 * cols, m.v.begin());
    return m;
  }
};

// y = x w^T (+ bias)
inline Mat ref_linear(const Mat& x, const Mat& w, const std::vector<double>& bias = {}) {
  Mat y(x.rows, w.rows);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t j = 0; j < w.rows; ++j) {
      double s = bias.empty() ? 0.0 : bias[j];
      for (int64_t k = 0; k < x.cols; ++k) s += x.at(i, k) * w.at(j, k);
      y.at(i, j) = s;
    }
  return y;
}

// silu(x g^T) * (x u^T)
inline Mat ref_swiglu(const Mat& x, const Mat& gate, const Mat& up) {
  Mat g = ref_linear(x, gate), u = ref_linear(x, up);
  for (size_t i = 0; i < g.v.size(); ++i) g.v[i] = silu(g.v[i]) * u.v[i];
  return g;
}

// Rounds every value to bf16 (for references of intermediates the module stores in bf16).
inline Mat round_bf16(Mat m) {
  for (double& d : m.v) d = bf16_bits_to_f32(f32_to_bf16_bits(static_cast<float>(d)));
  return m;
}

inline Tensor fp32_scalar(float v) {
  Tensor t = Tensor::empty({}, DType::kFP32);
  t.data<float>()[0] = v;
  return t;
}

// Loads an NVFP4 weight into `m` as the ModelOpt pieces "<prefix>weight", "<prefix>weight_scale",
// "<prefix>weight_scale_2".
template <typename M>
void load_nvfp4(M& m, const std::string& prefix, const ops::Nvfp4Weight& w) {
  m.load(prefix + "weight", w.packed);
  m.load(prefix + "weight_scale", w.scales);
  m.load(prefix + "weight_scale_2", fp32_scalar(w.global_scale));
}

}  // namespace locus::testing
