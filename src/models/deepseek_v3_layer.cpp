#include "models/deepseek_v3_layer.h"

#include "core/host_profile.h"
#include "ops/norm.h"

namespace locus::models {
namespace {

using locality::QuantKind;

ops::RopeConfig rope_config(const DeepseekV3Config& cfg) {
  ops::RopeConfig r;
  r.dim = cfg.qk_rope_head_dim;
  r.theta = cfg.rope_theta;
  if (cfg.rope_scaling) {
    const RopeScaling& s = *cfg.rope_scaling;
    r.yarn = true;
    r.factor = s.factor;
    r.original_max_position = s.original_max_position_embeddings;
    r.beta_fast = s.beta_fast;
    r.beta_slow = s.beta_slow;
    r.mscale = s.mscale;
    r.mscale_all_dim = s.mscale_all_dim;
  }
  return r;
}

// One quant kind for a group of Linears that run as one unit (gate/up/down of an MLP, all routed
// experts): mixing BF16 and NVFP4 inside it is an Error naming both modules.
QuantKind group_quant(const std::vector<std::string>& linears, const QuantPredicate& is_nvfp4) {
  if (!is_nvfp4) return QuantKind::kBF16;
  const bool first = is_nvfp4(linears.front());
  for (const auto& m : linears)
    LOCUS_CHECK(is_nvfp4(m) == first, "quantization config mixes formats inside one MLP: ", linears.front(), " is ",
                first ? "NVFP4" : "BF16", " but ", m, " is ", first ? "BF16" : "NVFP4",
                " (Locus needs gate, up and down of an MLP and all routed experts of a layer in one format)");
  return first ? QuantKind::kNVFP4 : QuantKind::kBF16;
}

}  // namespace

DecoderLayer::DecoderLayer(modules::ModuleContext ctx, const DeepseekV3Config& cfg, int64_t index,
                           int64_t max_positions, const QuantPredicate& is_nvfp4)
    : Module(std::move(ctx)), index_(index) {
  const float eps = static_cast<float>(cfg.rms_norm_eps);
  input_layernorm_ = std::make_unique<modules::RMSNorm>(ctx_.child("input_layernorm"), cfg.hidden_size, eps);
  post_attention_layernorm_ =
      std::make_unique<modules::RMSNorm>(ctx_.child("post_attention_layernorm"), cfg.hidden_size, eps);

  modules::MlaConfig mc;
  mc.hidden_size = cfg.hidden_size;
  mc.num_heads = cfg.num_attention_heads;
  mc.q_lora_rank = cfg.q_lora_rank.value_or(0);
  mc.kv_lora_rank = cfg.kv_lora_rank;
  mc.qk_nope_head_dim = cfg.qk_nope_head_dim;
  mc.qk_rope_head_dim = cfg.qk_rope_head_dim;
  mc.v_head_dim = cfg.v_head_dim;
  mc.rms_norm_eps = eps;
  mc.rope = rope_config(cfg);
  mc.max_positions = max_positions;
  if (is_nvfp4) {
    const std::string a = ctx_.name + ".self_attn.";
    for (const char* p : {"q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"})
      LOCUS_CHECK(!is_nvfp4(a + p), "the quantization config quantizes ", a, p,
                  " but Locus runs MLA in BF16 only (ModelOpt excludes *self_attn*: add the module to exclude_modules)");
  }
  attn_ = std::make_unique<modules::MLA>(ctx_.child("self_attn"), mc);

  const std::string m = ctx_.name + ".mlp.";
  if (cfg.is_moe_layer(index)) {
    modules::MoeConfig oc;
    oc.hidden_size = cfg.hidden_size;
    oc.intermediate_size = cfg.moe_intermediate_size;
    oc.num_experts = cfg.n_routed_experts;
    oc.top_k = cfg.num_experts_per_tok;
    oc.n_group = cfg.topk_method == "greedy" ? 1 : cfg.n_group;
    oc.topk_group = cfg.topk_method == "greedy" ? 1 : cfg.topk_group;
    oc.norm_topk_prob = cfg.norm_topk_prob;
    oc.routed_scaling_factor = static_cast<float>(cfg.routed_scaling_factor);
    oc.scoring = cfg.scoring_func == "softmax" ? ops::MoeScoring::kSoftmax : ops::MoeScoring::kSigmoid;
    oc.correction_bias = cfg.topk_method == "noaux_tc";
    oc.n_shared_experts = cfg.n_shared_experts;
    // Expert 0 stands for all routed experts (checking 3 x 256 names per layer against every
    // exclude pattern is slow); an expert stored in another format fails its dtype check at load.
    oc.expert_quant = group_quant({m + "experts.0.gate_proj", m + "experts.0.up_proj", m + "experts.0.down_proj"},
                                  is_nvfp4);
    if (cfg.n_shared_experts > 0)
      oc.shared_quant = group_quant(
          {m + "shared_experts.gate_proj", m + "shared_experts.up_proj", m + "shared_experts.down_proj"}, is_nvfp4);
    if (is_nvfp4)
      LOCUS_CHECK(!is_nvfp4(m + "gate"), "the quantization config quantizes the router ", m,
                  "gate, which Locus keeps in BF16 (add it to exclude_modules)");
    moe_ = std::make_unique<modules::MoE>(ctx_.child("mlp"), oc);
  } else {
    modules::GatedMlpConfig gc;
    gc.hidden_size = cfg.hidden_size;
    gc.intermediate_size = cfg.intermediate_size;
    gc.quant = group_quant({m + "gate_proj", m + "up_proj", m + "down_proj"}, is_nvfp4);
    mlp_ = std::make_unique<modules::GatedMLP>(ctx_.child("mlp"), gc);
  }
}

std::vector<modules::Module*> DecoderLayer::children() const {
  std::vector<modules::Module*> c = {input_layernorm_.get(), attn_.get(), post_attention_layernorm_.get()};
  c.push_back(moe_ ? static_cast<modules::Module*>(moe_.get()) : mlp_.get());
  return c;
}

modules::Module& DecoderLayer::route(const std::string& piece, std::string* rest) const {
  const auto dot = piece.find('.');
  const std::string head = piece.substr(0, dot);
  *rest = dot == std::string::npos ? std::string() : piece.substr(dot + 1);
  if (head == "input_layernorm") return *input_layernorm_;
  if (head == "post_attention_layernorm") return *post_attention_layernorm_;
  if (head == "self_attn") return *attn_;
  if (head == "mlp") return moe_ ? static_cast<modules::Module&>(*moe_) : *mlp_;
  LOCUS_THROW("unknown tensor ", ctx_.name, ".", piece, " (a decoder layer has input_layernorm, self_attn, ",
              "post_attention_layernorm and mlp)");
}

LifecycleState DecoderLayer::state() const {
  // The least advanced child decides (a layer is LOCALIZED only when every child is).
  LifecycleState s = LifecycleState::kLocalized;
  for (auto* c : children()) s = std::min(s, c->state());
  return s;
}

void DecoderLayer::load(const std::string& piece, const Tensor& t) {
  std::string rest;
  modules::Module& m = route(piece, &rest);
  m.load(rest, t);
}

std::vector<std::string> DecoderLayer::missing_pieces() const {
  std::vector<std::string> out;
  for (auto* c : children()) {
    const std::string prefix = c->name().substr(ctx_.name.size() + 1);
    for (const auto& p : c->missing_pieces()) out.push_back(prefix + "." + p);
  }
  return out;
}

void DecoderLayer::transform() {
  for (auto* c : children()) c->transform();
}
void DecoderLayer::localize() {
  for (auto* c : children()) c->localize();
}
void DecoderLayer::rebuild() {
  for (auto* c : children()) c->rebuild();
}

modules::ChildWeights DecoderLayer::split_by_child(const modules::WeightMap& weights) const {
  modules::ChildWeights per_child;
  for (const auto& [piece, t] : weights) {
    std::string rest;
    per_child[&route(piece, &rest)][rest] = t;
  }
  return per_child;
}

void DecoderLayer::check_reload(const modules::WeightMap& weights) const {
  modules::check_children(split_by_child(weights));
}
void DecoderLayer::reload(const modules::WeightMap& weights) { modules::reload_children(split_by_child(weights)); }

modules::MemoryUsage DecoderLayer::memory() const {
  modules::MemoryUsage m;
  for (auto* c : children()) m += c->memory();
  return m;
}

void DecoderLayer::collect_plans(std::vector<modules::PlanRecord>* out) const {
  for (auto* c : children()) c->collect_plans(out);
}

void DecoderLayer::forward(const Tensor& x, const Tensor& positions, const std::vector<modules::MlaSequence>& seqs,
                           const Tensor& h, const Tensor& a, bool pending_a, modules::MlaPath path,
                           const Stream& stream) {
  forward_around(x, h, a, pending_a, stream, [&] { attn_->forward(h, positions, seqs, a, path, stream); });
}

void DecoderLayer::forward_table(const Tensor& x, const ops::KvTable& table, const Tensor& h, const Tensor& a,
                                 bool pending_a, const Stream& stream) {
  forward_around(x, h, a, pending_a, stream, [&] { attn_->forward_table(h, table, a, stream); });
}

void DecoderLayer::forward_around(const Tensor& x, const Tensor& h, const Tensor& a, bool pending_a,
                                  const Stream& stream, const std::function<void()>& attend) {
  {
    HostProfileScope profile("norms and residuals");
    if (pending_a) input_layernorm_->add_forward(x, a, h, stream);  // the previous layer's output first
    else input_layernorm_->forward(x, h, stream);
  }
  {
    HostProfileScope profile("mla");
    attend();
  }
  {
    HostProfileScope profile("norms and residuals");
    post_attention_layernorm_->add_forward(x, a, h, stream);  // x += a, h = norm(x): one kernel
  }
  if (moe_) {
    HostProfileScope profile("moe");
    moe_->forward(h, a, stream);
  } else {
    HostProfileScope profile("dense mlp");
    mlp_->forward(h, a, stream);
  }
}

}  // namespace locus::models
