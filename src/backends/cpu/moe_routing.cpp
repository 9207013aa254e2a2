// DeepSeek routing, token gather and weighted combine on the CPU, one token (row) per work item.
#include "backends/cpu/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/float_convert.h"

namespace locus::cpu {
namespace {

float read_f(const Tensor& t, int64_t off) {
  return t.dtype() == DType::kFP32 ? t.data<float>()[off] : bf16_bits_to_f32(t.data<uint16_t>()[off]);
}
void write_f(const Tensor& t, int64_t off, float v) {
  if (t.dtype() == DType::kFP32) t.data<float>()[off] = v;
  else t.data<uint16_t>()[off] = f32_to_bf16_bits(v);
}

// Indices of the k largest values (descending; ties: lower index first). NaN never wins.
void top_indices(const std::vector<float>& vals, int64_t k, std::vector<int64_t>* out) {
  std::vector<int64_t> idx(vals.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int64_t a, int64_t b) {
    const float va = vals[a], vb = vals[b];
    const bool na = std::isnan(va), nb = std::isnan(vb);
    if (na != nb) return nb;  // a number beats NaN
    if (!na && va != vb) return va > vb;
    return a < b;
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
  out->assign(idx.begin(), idx.begin() + k);
}

}  // namespace

void moe_route(const Tensor& logits, const Tensor& correction_bias, const ops::MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, ThreadPool& pool, const Tensor& forced_ids) {
  const int64_t T = logits.size(0), E = cfg.num_experts, K = cfg.top_k;
  if (forced_ids.defined()) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = forced_ids.data<int32_t>()[t * forced_ids.stride(0) + j];
        LOCUS_CHECK(e >= 0 && e < E, "moe_route: forced expert id ", e, " of token ", t, " is outside [0, ", E, ")");
      }
  }
  const int64_t G = cfg.n_group, group_size = E / G;
  pool.parallel_for(T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(E), sel(E), group_score(G);
    std::vector<int64_t> kept, chosen;
    for (int64_t t = begin; t < end; ++t) {
      const float* row = logits.data<float>() + t * logits.stride(0);
      if (cfg.scoring == ops::MoeScoring::kSigmoid) {
        for (int64_t e = 0; e < E; ++e) s[e] = 1.f / (1.f + std::exp(-row[e]));
      } else {
        float mx = -INFINITY;
        for (int64_t e = 0; e < E; ++e) mx = std::max(mx, row[e]);
        float sum = 0.f;
        for (int64_t e = 0; e < E; ++e) {
          s[e] = std::exp(row[e] - mx);
          sum += s[e];
        }
        for (int64_t e = 0; e < E; ++e) s[e] /= sum;
      }
      for (int64_t e = 0; e < E; ++e) {
        sel[e] = s[e] + (correction_bias.defined() ? correction_bias.data<float>()[e * correction_bias.stride(0)] : 0.f);
      }
      if (forced_ids.defined()) {
        const int32_t* f = forced_ids.data<int32_t>() + t * forced_ids.stride(0);
        chosen.assign(f, f + K);
      } else if (G > 1 && cfg.topk_group < G) {
        for (int64_t g = 0; g < G; ++g) {
          const float* p = sel.data() + g * group_size;
          if (cfg.scoring == ops::MoeScoring::kSigmoid) {
            // Sum of the two largest (one when the group has a single expert).
            float a = -INFINITY, b = -INFINITY;
            for (int64_t i = 0; i < group_size; ++i) {
              if (p[i] > a) { b = a; a = p[i]; }
              else if (p[i] > b) b = p[i];
            }
            group_score[g] = group_size >= 2 ? a + b : a;
          } else {
            group_score[g] = *std::max_element(p, p + group_size);
          }
        }
        top_indices(group_score, cfg.topk_group, &kept);
        std::vector<bool> keep(G, false);
        for (int64_t g : kept) keep[g] = true;
        for (int64_t e = 0; e < E; ++e) {
          if (!keep[e / group_size]) sel[e] = -std::numeric_limits<float>::infinity();
        }
      }
      if (!forced_ids.defined()) top_indices(sel, K, &chosen);
      float* w = weights.data<float>() + t * weights.stride(0);
      int32_t* id = ids.data<int32_t>() + t * ids.stride(0);
      float sum = 0.f;
      for (int64_t j = 0; j < K; ++j) sum += s[chosen[j]];
      const float denom = cfg.norm_topk_prob ? sum + 1e-20f : 1.f;
      for (int64_t j = 0; j < K; ++j) {
        id[j] = static_cast<int32_t>(chosen[j]);
        w[j] = s[chosen[j]] / denom * cfg.routed_scaling_factor;
      }
    }
  });
}

void moe_group(const Tensor& ids, int64_t num_experts, const Tensor& offsets, const Tensor& rows, const Tensor& slot) {
  const int64_t T = ids.size(0), K = ids.size(1), E = num_experts;
  auto id_at = [&](int64_t t, int64_t j) { return ids.data<int32_t>()[t * ids.stride(0) + j]; };
  int32_t* off = offsets.data<int32_t>();
  const int64_t os = offsets.stride(0);
  std::vector<int64_t> count(E + 1, 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) ++count[id_at(t, j) + 1];
  for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
  for (int64_t e = 0; e <= E; ++e) off[e * os] = static_cast<int32_t>(count[e]);
  // count[e] becomes the next free row of expert e; visiting t then j keeps that order per expert.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t r = count[id_at(t, j)]++;
      rows.data<int32_t>()[r * rows.stride(0)] = static_cast<int32_t>(t);
      slot.data<int32_t>()[t * slot.stride(0) + j * slot.stride(1)] = static_cast<int32_t>(r);
    }
}

void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, ThreadPool& pool) {
  const int64_t R = y.size(0), H = y.size(1);
  const size_t es = dtype_size(x.dtype());
  pool.parallel_for(R, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = rows.data<int32_t>()[i * rows.stride(0)];
      std::memcpy(static_cast<char*>(y.data_ptr()) + i * y.stride(0) * es,
                  static_cast<const char*>(x.data_ptr()) + r * x.stride(0) * es, H * es);
    }
  });
}

void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, ThreadPool& pool) {
  const int64_t T = y.size(0), H = y.size(1), K = slot.size(1);
  pool.parallel_for(T, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(H);
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t c = 0; c < H; ++c) acc[c] = shared.defined() ? read_f(shared, t * shared.stride(0) + c) : 0.f;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = slot.data<int32_t>()[t * slot.stride(0) + j * slot.stride(1)];
        if (r < 0) continue;
        const float w = weights.data<float>()[t * weights.stride(0) + j * weights.stride(1)];
        const int64_t base = r * expert_out.stride(0);
        for (int64_t c = 0; c < H; ++c) acc[c] += w * read_f(expert_out, base + c);
      }
      for (int64_t c = 0; c < H; ++c) write_f(y, t * y.stride(0) + c, acc[c]);
    }
  });
}

}  // namespace locus::cpu
