// Helpers for the model tests: the tiny checkpoint written once per process (BF16 and NVFP4 from
// the same seed), loading it with or without emulated locality domains, and the checkpoint's
// weights as doubles for the fp64 reference (NVFP4 weights dequantized here, independently of
// the ops: e2m1 table x e4m3 block scale x global scale).
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "core/float_convert.h"
#include "models/tiny_model.h"
#include "runtime/checkpoint.h"
#include "runtime/model_loader.h"
#include "models/deepseek_v3_reference.h"
#include "runtime/runtime_test_util.h"
#include "test_util.h"

namespace locus::testing {

// End-to-end BF16 budget (DESIGN.md section 7: logits within 2e-2 of a BF16 reference
// implementation); here the reference is exact fp64, so only Locus's own BF16 rounding counts.
inline constexpr double kBf16ModelTolerance = 2e-2;
// Weight scale for the reference comparisons: large enough that attention, MLP and experts each
// change the logits substantially (with HF's 0.02 the residual stream dominates and a wrong
// softmax scale would hide inside the tolerance).
inline constexpr double kRefInitStd = 0.05;

// The seed of this process's tiny models (fresh per run unless LOCUS_TEST_SEED is set).
inline uint64_t tiny_model_seed() {
  static const uint64_t seed = fresh_seed();
  return seed;
}

// Directory of the tiny model (2 layers: dense + MoE) written once per process. init_std scales
// the random weights: the default 0.02 (HF's) leaves attention and MLP outputs small next to the
// residual stream; the reference tests use larger weights so every block moves the logits.
inline const std::string& tiny_model_dir(bool nvfp4, double init_std = 0.02) {
  static std::map<std::pair<bool, double>, std::pair<std::unique_ptr<TempDir>, std::string>> dirs;
  auto& d = dirs[{nvfp4, init_std}];
  if (!d.first) {
    d.first = std::make_unique<TempDir>();
    models::TinyModelOptions o;
    o.seed = tiny_model_seed();
    o.nvfp4 = nvfp4;
    o.init_std = init_std;
    models::write_tiny_model(d.first->path(), o);
    d.second = d.first->path();
  }
  return d.second;
}

// Sets LOCUS_FAKE_LOCALITY_DOMAINS for a scope (restores the previous value).
class ScopedFakeDomains {
 public:
  explicit ScopedFakeDomains(int n) {
    if (const char* v = std::getenv("LOCUS_FAKE_LOCALITY_DOMAINS")) old_ = v, had_ = true;
    if (n > 0)
      ::setenv("LOCUS_FAKE_LOCALITY_DOMAINS", std::to_string(n).c_str(), 1);
    else
      ::unsetenv("LOCUS_FAKE_LOCALITY_DOMAINS");
  }
  ~ScopedFakeDomains() {
    if (had_)
      ::setenv("LOCUS_FAKE_LOCALITY_DOMAINS", old_.c_str(), 1);
    else
      ::unsetenv("LOCUS_FAKE_LOCALITY_DOMAINS");
  }

 private:
  std::string old_;
  bool had_ = false;
};

// backend "cpu" or "cuda" (device 0).
inline runtime::LlmArgs tiny_args(const std::string& dir, int domains, const std::string& backend = "cpu") {
  runtime::LlmArgs a;
  a.model = dir;
  a.backend = backend;
  a.max_seq_len = 256;
  a.kv_cache_budget_bytes = 64 << 20;
  if (domains > 0) {
    a.enable_locality_domains = true;
    a.locality_domains.emulate = domains;
  }
  return a;
}

// domains = 0: locality domains off; N > 0: on with N emulated domains.
inline runtime::LoadedModel load_model(const std::string& dir, int domains, const std::string& backend = "cpu") {
  ScopedFakeDomains env(domains);
  runtime::ModelLoaderOptions o;
  o.progress = false;
  o.log = nullptr;
  return runtime::ModelLoader(tiny_args(dir, domains, backend), o).load();
}

inline RefConfig ref_config(const models::DeepseekV3Config& c) {
  RefConfig r;
  r.vocab = c.vocab_size;
  r.hidden = c.hidden_size;
  r.layers = c.num_hidden_layers;
  r.heads = c.num_attention_heads;
  r.q_lora_rank = c.q_lora_rank.value_or(0);
  r.kv_lora_rank = c.kv_lora_rank;
  r.qk_nope = c.qk_nope_head_dim;
  r.qk_rope = c.qk_rope_head_dim;
  r.v_head = c.v_head_dim;
  r.intermediate = c.intermediate_size;
  r.moe_intermediate = c.moe_intermediate_size;
  r.n_routed = c.n_routed_experts;
  r.top_k = c.num_experts_per_tok;
  r.n_shared = c.n_shared_experts;
  r.n_group = c.n_group;
  r.topk_group = c.topk_group;
  r.first_k_dense = c.first_k_dense_replace;
  r.norm_topk_prob = c.norm_topk_prob;
  r.routed_scaling = c.routed_scaling_factor;
  r.eps = c.rms_norm_eps;
  r.rope_theta = c.rope_theta;
  if (c.rope_scaling) {
    r.yarn = true;
    r.factor = c.rope_scaling->factor;
    r.beta_fast = c.rope_scaling->beta_fast;
    r.beta_slow = c.rope_scaling->beta_slow;
    r.mscale = c.rope_scaling->mscale;
    r.mscale_all_dim = c.rope_scaling->mscale_all_dim;
    r.original_max_position = c.rope_scaling->original_max_position_embeddings;
  }
  return r;
}

// e2m1 code -> value (sign in bit 3).
inline double e2m1_value(uint8_t code) {
  static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8 ? -1.0 : 1.0) * mag[code & 7];
}

// Weights of a checkpoint as doubles, by name; "<p>.weight" of an NVFP4 Linear is dequantized.
inline RefWeights checkpoint_weights(std::shared_ptr<runtime::Checkpoint> ck) {
  return [ck](const std::string& name, int64_t numel) {
    std::vector<double> v;
    Tensor t = ck->get(name);
    const std::string base = name.size() > 7 ? name.substr(0, name.size() - 7) : "";  // strip ".weight"
    if (t.dtype() == DType::kU8 || t.dtype() == DType::kFP4E2M1x2) {
      Tensor s = ck->get(base + ".weight_scale");
      const double g = ck->get_scalar(base + ".weight_scale_2");
      const int64_t n = t.size(0), k = t.size(1) * 2;
      v.resize(static_cast<size_t>(n * k));
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const uint8_t byte = t.data<uint8_t>()[r * (k / 2) + c / 2];
          const uint8_t code = c % 2 == 0 ? (byte & 0xF) : (byte >> 4);
          const double scale = e4m3_to_f32(s.data<uint8_t>()[r * (k / 16) + c / 16]);
          v[r * k + c] = e2m1_value(code) * scale * g;
        }
    } else {
      v = to_doubles(t);
    }
    EXPECT_EQ(static_cast<int64_t>(v.size()), numel) << name;
    return v;
  };
}

inline std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& i : ids) i = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return ids;
}

// Random ids whose routing has no near-tie in the fp64 reference (see reference_forward): draws
// from seed, seed+1, ... until every kept/dropped routing gap is at least min_margin. BF16
// rounding (and the absorbed vs prefill attention forms) move the router's selection scores on
// the tiny model by more than once thought: flips were seen at a 1e-3 gap and, on 2026-12-03, at
// a 5.5e-3 gap (token 0 of LOCUS_TEST_SEED=11555674585079739971: its logits 100 % off, the other
// tokens within 1.2 %). 2e-2 leaves a margin of about 4x. About one draw in eight of 8 ids has it
// (1-18 draws over 12 seeds), but LOCUS_TEST_SEED=8871910713087775386 needed 91, more than the 64
// this allowed then; 256 make a miss vanishingly rare.
// Returns the ids and sets *ref to their reference logits.
inline std::vector<int32_t> ids_with_clear_routing(const RefConfig& c, const RefWeights& w, int64_t n, uint64_t seed,
                                                   std::vector<double>* ref, double min_margin = 2e-2) {
  constexpr int kDraws = 256;
  for (int attempt = 0; attempt < kDraws; ++attempt) {
    auto ids = random_ids(n, c.vocab, seed + static_cast<uint64_t>(attempt));
    double m = 0;
    *ref = reference_forward(c, w, ids, &m);
    if (m >= min_margin) return ids;
  }
  ADD_FAILURE() << "no token sequence with routing margins >= " << min_margin << " in " << kDraws << " draws";
  return {};
}

// Full-prefill logits of one sequence (all positions) on a fresh cache.
inline Tensor prefill_logits(models::DeepseekV3ForCausalLM& m, const std::vector<int32_t>& ids,
                             modules::MlaPath path = modules::MlaPath::kAuto) {
  auto cache = m.new_cache(static_cast<int64_t>(ids.size()) + 8);
  return m.forward({{ids, &cache}}, /*all_logits=*/true, path);
}

}  // namespace locus::testing
