// An independent fp64 forward pass of DeepSeek-V3 for one sequence, written from the math in
// reference/ecosystem.md 3.3/3.4 and Hugging Face's DeepseekV3ForCausalLM (YaRN always applied,
// interleaved MLA rope, sigmoid router with bias-only selection and group-limited top-k). It uses
// no Locus op or module: weights come in as doubles through a getter, every product is a plain
// loop, nothing is rounded. Tests compare the model's logits with these.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "test_util.h"  // silu

namespace locus::testing {

struct RefConfig {
  int64_t vocab = 0, hidden = 0, layers = 0, heads = 0;
  int64_t q_lora_rank = 0;  // 0 = plain q_proj
  int64_t kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  int64_t intermediate = 0, moe_intermediate = 0;
  int64_t n_routed = 0, top_k = 0, n_shared = 0, n_group = 1, topk_group = 1, first_k_dense = 0;
  bool norm_topk_prob = true;
  double routed_scaling = 1.0, eps = 1e-6, rope_theta = 10000.0;
  // YaRN (yarn = false: plain rope)
  bool yarn = false;
  double factor = 1.0, beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
  int64_t original_max_position = 4096;
};

// Weight getter: returns the named tensor as doubles (row-major) and checks its element count.
using RefWeights = std::function<std::vector<double>(const std::string& name, int64_t numel)>;

namespace ref_detail {

using Vec = std::vector<double>;

inline Vec linear(const Vec& x, int64_t rows, int64_t in, const Vec& w, int64_t out) {
  Vec y(static_cast<size_t>(rows * out), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t k = 0; k < in; ++k) acc += x[r * in + k] * w[o * in + k];
      y[r * out + o] = acc;
    }
  return y;
}

inline Vec rmsnorm(const Vec& x, int64_t rows, int64_t dim, const Vec& w, double eps) {
  Vec y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += x[r * dim + i] * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = x[r * dim + i] * inv * w[i];
  }
  return y;
}

inline double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// Inverse frequencies and the cos/sin attention factor, as transformers' _compute_yarn_parameters.
inline void rope_params(const RefConfig& c, Vec* inv_freq, double* attention_factor) {
  const int64_t dim = c.qk_rope;
  inv_freq->assign(static_cast<size_t>(dim / 2), 0.0);
  *attention_factor = 1.0;
  for (int64_t i = 0; i < dim / 2; ++i) (*inv_freq)[i] = 1.0 / std::pow(c.rope_theta, 2.0 * i / dim);
  if (!c.yarn) return;
  *attention_factor = (c.mscale != 0 && c.mscale_all_dim != 0)
                          ? yarn_get_mscale(c.factor, c.mscale) / yarn_get_mscale(c.factor, c.mscale_all_dim)
                          : yarn_get_mscale(c.factor, 1.0);
  auto corr_dim = [&](double rot) {
    return dim * std::log(c.original_max_position / (rot * 2 * M_PI)) / (2 * std::log(c.rope_theta));
  };
  double low = std::max(std::floor(corr_dim(c.beta_fast)), 0.0);
  double high = std::min(std::ceil(corr_dim(c.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
    const double f = (*inv_freq)[i];
    (*inv_freq)[i] = f / c.factor * (1.0 - extrapolation) + f * extrapolation;
  }
}

// Interleaved rope in place on v[0, dim) at position pos.
inline void rope_interleaved(double* v, int64_t dim, double pos, const Vec& inv_freq, double af) {
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double a = pos * inv_freq[i];
    const double c = std::cos(a) * af, s = std::sin(a) * af;
    const double x0 = v[2 * i], x1 = v[2 * i + 1];
    v[2 * i] = x0 * c - x1 * s;
    v[2 * i + 1] = x1 * c + x0 * s;
  }
}

inline Vec swiglu_mlp(const Vec& x, int64_t rows, int64_t hidden, int64_t inter, const Vec& wg, const Vec& wu,
                      const Vec& wd) {
  Vec g = linear(x, rows, hidden, wg, inter), u = linear(x, rows, hidden, wu, inter);
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  return linear(g, rows, inter, wd, hidden);
}

}  // namespace ref_detail

// Logits [T, vocab] (row-major) for tokens at positions 0..T-1 of one sequence, causal attention.
// min_route_margin (optional) receives the smallest gap, over every token of every MoE layer,
// between the last kept and the first dropped score (groups and experts): routing is a
// discontinuous choice, so a test comparing a BF16 model with this exact forward is meaningful
// only when no choice is a near-tie that BF16 rounding could flip.
inline std::vector<double> reference_forward(const RefConfig& c, const RefWeights& W, const std::vector<int32_t>& ids,
                                             double* min_route_margin = nullptr) {
  if (min_route_margin) *min_route_margin = std::numeric_limits<double>::infinity();
  auto margin = [&](double gap) {
    if (min_route_margin) *min_route_margin = std::min(*min_route_margin, gap);
  };
  using namespace ref_detail;
  const int64_t T = static_cast<int64_t>(ids.size()), D = c.hidden, H = c.heads;
  const int64_t dqk = c.qk_nope + c.qk_rope;
  Vec inv_freq;
  double af = 1;
  rope_params(c, &inv_freq, &af);
  double scaling = 1.0 / std::sqrt(static_cast<double>(dqk));
  if (c.yarn && c.mscale_all_dim != 0) {
    const double m = yarn_get_mscale(c.factor, c.mscale_all_dim);
    scaling *= m * m;
  }

  Vec emb = W("model.embed_tokens.weight", c.vocab * D);
  Vec x(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) x[t * D + i] = emb[ids[t] * D + i];

  for (int64_t L = 0; L < c.layers; ++L) {
    const std::string p = "model.layers." + std::to_string(L) + ".";
    // ---- MLA ----
    Vec h = rmsnorm(x, T, D, W(p + "input_layernorm.weight", D), c.eps);
    Vec q;
    if (c.q_lora_rank > 0) {
      Vec qa = linear(h, T, D, W(p + "self_attn.q_a_proj.weight", c.q_lora_rank * D), c.q_lora_rank);
      qa = rmsnorm(qa, T, c.q_lora_rank, W(p + "self_attn.q_a_layernorm.weight", c.q_lora_rank), c.eps);
      q = linear(qa, T, c.q_lora_rank, W(p + "self_attn.q_b_proj.weight", H * dqk * c.q_lora_rank), H * dqk);
    } else {
      q = linear(h, T, D, W(p + "self_attn.q_proj.weight", H * dqk * D), H * dqk);
    }
    const int64_t dkv = c.kv_lora_rank + c.qk_rope;
    Vec kva = linear(h, T, D, W(p + "self_attn.kv_a_proj_with_mqa.weight", dkv * D), dkv);
    Vec ckv(static_cast<size_t>(T * c.kv_lora_rank)), kpe(static_cast<size_t>(T * c.qk_rope));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < c.kv_lora_rank; ++i) ckv[t * c.kv_lora_rank + i] = kva[t * dkv + i];
      for (int64_t i = 0; i < c.qk_rope; ++i) kpe[t * c.qk_rope + i] = kva[t * dkv + c.kv_lora_rank + i];
    }
    ckv = rmsnorm(ckv, T, c.kv_lora_rank, W(p + "self_attn.kv_a_layernorm.weight", c.kv_lora_rank), c.eps);
    const int64_t dkvb = c.qk_nope + c.v_head;
    Vec kvb = linear(ckv, T, c.kv_lora_rank, W(p + "self_attn.kv_b_proj.weight", H * dkvb * c.kv_lora_rank), H * dkvb);
    for (int64_t t = 0; t < T; ++t) {
      rope_interleaved(&kpe[t * c.qk_rope], c.qk_rope, static_cast<double>(t), inv_freq, af);
      for (int64_t hh = 0; hh < H; ++hh)
        rope_interleaved(&q[(t * H + hh) * dqk + c.qk_nope], c.qk_rope, static_cast<double>(t), inv_freq, af);
    }
    Vec attn(static_cast<size_t>(T * H * c.v_head), 0.0);
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t t = 0; t < T; ++t) {
        const double* qv = &q[(t * H + hh) * dqk];
        Vec s(static_cast<size_t>(t + 1));
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t u = 0; u <= t; ++u) {
          const double* kn = &kvb[(u * H + hh) * dkvb];
          double dot = 0;
          for (int64_t i = 0; i < c.qk_nope; ++i) dot += qv[i] * kn[i];
          for (int64_t i = 0; i < c.qk_rope; ++i) dot += qv[c.qk_nope + i] * kpe[u * c.qk_rope + i];
          s[u] = dot * scaling;
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (auto& v : s) sum += v = std::exp(v - mx);
        for (int64_t u = 0; u <= t; ++u) {
          const double* vv = &kvb[(u * H + hh) * dkvb + c.qk_nope];
          for (int64_t i = 0; i < c.v_head; ++i) attn[(t * H + hh) * c.v_head + i] += s[u] / sum * vv[i];
        }
      }
    Vec o = linear(attn, T, H * c.v_head, W(p + "self_attn.o_proj.weight", D * H * c.v_head), D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

    // ---- FFN ----
    Vec h2 = rmsnorm(x, T, D, W(p + "post_attention_layernorm.weight", D), c.eps);
    Vec f;
    if (L < c.first_k_dense) {
      const int64_t I = c.intermediate;
      f = swiglu_mlp(h2, T, D, I, W(p + "mlp.gate_proj.weight", I * D), W(p + "mlp.up_proj.weight", I * D),
                     W(p + "mlp.down_proj.weight", D * I));
    } else {
      const int64_t E = c.n_routed, I = c.moe_intermediate, Is = c.moe_intermediate * c.n_shared;
      f = swiglu_mlp(h2, T, D, Is, W(p + "mlp.shared_experts.gate_proj.weight", Is * D),
                     W(p + "mlp.shared_experts.up_proj.weight", Is * D),
                     W(p + "mlp.shared_experts.down_proj.weight", D * Is));
      Vec logits = linear(h2, T, D, W(p + "mlp.gate.weight", E * D), E);
      Vec bias = W(p + "mlp.gate.e_score_correction_bias", E);
      const int64_t per_group = E / c.n_group;
      for (int64_t t = 0; t < T; ++t) {
        Vec s(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) {
          s[e] = 1.0 / (1.0 + std::exp(-logits[t * E + e]));
          sel[e] = s[e] + bias[e];
        }
        // Group score: the sum of the two best selection scores in the group; keep topk_group groups.
        std::vector<double> gscore(static_cast<size_t>(c.n_group));
        for (int64_t g = 0; g < c.n_group; ++g) {
          Vec m(sel.begin() + g * per_group, sel.begin() + (g + 1) * per_group);
          std::sort(m.begin(), m.end(), std::greater<>());
          gscore[g] = m[0] + (per_group > 1 ? m[1] : 0.0);
        }
        std::vector<int64_t> gorder(static_cast<size_t>(c.n_group));
        std::iota(gorder.begin(), gorder.end(), 0);
        std::stable_sort(gorder.begin(), gorder.end(), [&](int64_t a, int64_t b) { return gscore[a] > gscore[b]; });
        if (c.topk_group < c.n_group) margin(gscore[gorder[c.topk_group - 1]] - gscore[gorder[c.topk_group]]);
        std::vector<bool> group_kept(static_cast<size_t>(c.n_group), false);
        for (int64_t i = 0; i < c.topk_group; ++i) group_kept[gorder[i]] = true;
        std::vector<int64_t> eorder;
        for (int64_t e = 0; e < E; ++e)
          if (group_kept[e / per_group]) eorder.push_back(e);
        std::stable_sort(eorder.begin(), eorder.end(), [&](int64_t a, int64_t b) { return sel[a] > sel[b]; });
        if (static_cast<int64_t>(eorder.size()) > c.top_k) margin(sel[eorder[c.top_k - 1]] - sel[eorder[c.top_k]]);
        eorder.resize(static_cast<size_t>(c.top_k));
        double wsum = 0;
        for (int64_t e : eorder) wsum += s[e];
        Vec row(h2.begin() + t * D, h2.begin() + (t + 1) * D);
        for (int64_t e : eorder) {
          const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
          Vec y = swiglu_mlp(row, 1, D, I, W(ep + "gate_proj.weight", I * D), W(ep + "up_proj.weight", I * D),
                             W(ep + "down_proj.weight", D * I));
          const double w = (c.norm_topk_prob ? s[e] / wsum : s[e]) * c.routed_scaling;
          for (int64_t i = 0; i < D; ++i) f[t * D + i] += w * y[i];
        }
      }
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += f[i];
  }
  Vec xn = rmsnorm(x, T, D, W("model.norm.weight", D), c.eps);
  return linear(xn, T, D, W("lm_head.weight", c.vocab * D), c.vocab);
}

}  // namespace locus::testing
