#include "models/deepseek_v3_tensors.h"

namespace locus::models {
namespace {

const std::vector<DType> kFloat = {DType::kBF16, DType::kFP32};

struct Builder {
  std::vector<ExpectedTensor> out;
  const QuantPredicate& is_nvfp4;

  void add(std::string name, std::vector<DType> dtypes, Shape shape) {
    out.push_back({std::move(name), std::move(dtypes), std::move(shape)});
  }
  // A Linear [n, k] named `p` (without ".weight"); nvfp4 decides its ModelOpt siblings.
  void linear(const std::string& p, int64_t n, int64_t k, bool nvfp4) {
    if (!nvfp4) {
      add(p + ".weight", kFloat, {n, k});
      return;
    }
    add(p + ".weight", {DType::kU8, DType::kFP4E2M1x2}, {n, k / 2});
    add(p + ".weight_scale", {DType::kFP8E4M3}, {n, k / 16});
    out.push_back({p + ".weight_scale_2", {DType::kFP32}, {}, true, false});
    out.push_back({p + ".input_scale", {DType::kFP32}, {}, true, true});
  }
  bool q(const std::string& p) const { return is_nvfp4 && is_nvfp4(p); }
  // `like` names the MLP whose quantization decides (routed experts all follow expert 0, as
  // DecoderLayer does; matching 3 x 256 names per layer against every pattern is slow).
  void mlp(const std::string& p, int64_t hidden, int64_t inter, const std::string& like = "") {
    const std::string& d = like.empty() ? p : like;
    linear(p + ".gate_proj", inter, hidden, q(d + ".gate_proj"));
    linear(p + ".up_proj", inter, hidden, q(d + ".up_proj"));
    linear(p + ".down_proj", hidden, inter, q(d + ".down_proj"));
  }
};

}  // namespace

std::string describe_dtypes(const std::vector<DType>& dtypes) {
  std::string s;
  for (size_t i = 0; i < dtypes.size(); ++i) s += (i ? " or " : "") + std::string(dtype_name(dtypes[i]));
  return s;
}

std::vector<ExpectedTensor> deepseek_v3_expected_tensors(const DeepseekV3Config& c, const QuantPredicate& is_nvfp4,
                                                         const std::function<ExpertLayout(int64_t)>& expert_layout) {
  Builder b{{}, is_nvfp4};
  const int64_t D = c.hidden_size;
  b.add("model.embed_tokens.weight", kFloat, {c.vocab_size, D});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = str("model.layers.", l, ".");
    b.add(p + "input_layernorm.weight", kFloat, {D});
    b.add(p + "post_attention_layernorm.weight", kFloat, {D});
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank) {
      b.linear(a + "q_a_proj", *c.q_lora_rank, D, false);
      b.add(a + "q_a_layernorm.weight", kFloat, {*c.q_lora_rank});
      b.linear(a + "q_b_proj", c.q_out_features(), *c.q_lora_rank, false);
    } else {
      b.linear(a + "q_proj", c.q_out_features(), D, false);
    }
    b.linear(a + "kv_a_proj_with_mqa", c.kv_a_out_features(), D, false);
    b.add(a + "kv_a_layernorm.weight", kFloat, {c.kv_lora_rank});
    b.linear(a + "kv_b_proj", c.kv_b_out_features(), c.kv_lora_rank, false);
    b.linear(a + "o_proj", D, c.o_in_features(), false);
    const std::string m = p + "mlp";
    if (!c.is_moe_layer(l)) {
      b.mlp(m, D, c.intermediate_size);
      continue;
    }
    b.linear(m + ".gate", c.n_routed_experts, D, false);
    if (c.topk_method == "noaux_tc") b.add(m + ".gate.e_score_correction_bias", kFloat, {c.n_routed_experts});
    const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
    if (expert_layout && expert_layout(l) == ExpertLayout::kFused) {
      b.add(m + ".experts.gate_up_proj", kFloat, {E, 2 * I, D});
      b.add(m + ".experts.down_proj", kFloat, {E, D, I});
    } else {
      for (int64_t e = 0; e < E; ++e) b.mlp(str(m, ".experts.", e), D, I, m + ".experts.0");
    }
    if (c.n_shared_experts > 0) b.mlp(m + ".shared_experts", D, c.shared_intermediate_size());
  }
  b.add("model.norm.weight", kFloat, {D});
  if (!c.tie_word_embeddings) b.add("lm_head.weight", kFloat, {c.vocab_size, D});
  return b.out;
}

}  // namespace locus::models
