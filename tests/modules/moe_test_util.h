// MoE test helpers (CPU and CUDA suites): routing configs, and random MoE weights (router gate,
// correction bias, routed experts, shared experts) in the per-expert checkpoint names MoE::load
// accepts.
#pragma once
#include <vector>

#include "modules/moe.h"
#include "test_util.h"

namespace locus::testing {

inline ops::MoeRoutingConfig routing_config(int64_t E, int64_t k, int64_t groups, int64_t keep, float scale,
                                            ops::MoeScoring scoring = ops::MoeScoring::kSigmoid, bool norm = true) {
  ops::MoeRoutingConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.n_group = groups;
  c.topk_group = keep;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = scale;
  c.scoring = scoring;
  return c;
}

struct MoeWeights {
  Tensor gate, bias;
  std::vector<Tensor> g, u, d;  // per expert
  Tensor sg, su, sd;            // shared
  // gate ~ N(0, gate_std), bias ~ N(0, 0.1), expert and shared weights ~ N(0, expert_std).
  MoeWeights(const modules::MoeConfig& c, uint64_t seed, double gate_std = 1.0, double expert_std = 0.3) {
    const int64_t H = c.hidden_size, I = c.intermediate_size;
    gate = randn({c.num_experts, H}, DType::kBF16, seed, gate_std);
    bias = randn({c.num_experts}, DType::kFP32, seed + 1, 0.1);
    for (int64_t e = 0; e < c.num_experts; ++e) {
      g.push_back(randn({I, H}, DType::kBF16, seed + 10 + 3 * e, expert_std));
      u.push_back(randn({I, H}, DType::kBF16, seed + 11 + 3 * e, expert_std));
      d.push_back(randn({H, I}, DType::kBF16, seed + 12 + 3 * e, expert_std));
    }
    const int64_t Is = I * c.n_shared_experts;
    if (Is) {
      sg = randn({Is, H}, DType::kBF16, seed + 5, expert_std);
      su = randn({Is, H}, DType::kBF16, seed + 6, expert_std);
      sd = randn({H, Is}, DType::kBF16, seed + 7, expert_std);
    }
  }
  modules::WeightMap per_expert() const {
    modules::WeightMap m{{"gate.weight", gate}, {"gate.e_score_correction_bias", bias}};
    for (size_t e = 0; e < g.size(); ++e) {
      m[str("experts.", e, ".gate_proj.weight")] = g[e];
      m[str("experts.", e, ".up_proj.weight")] = u[e];
      m[str("experts.", e, ".down_proj.weight")] = d[e];
    }
    if (sg.defined()) {
      m["shared_experts.gate_proj.weight"] = sg;
      m["shared_experts.up_proj.weight"] = su;
      m["shared_experts.down_proj.weight"] = sd;
    }
    return m;
  }
};

}  // namespace locus::testing
