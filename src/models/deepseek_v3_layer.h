// One DeepSeek-V3 decoder layer (HF DeepseekV3DecoderLayer), pre-norm residual:
//   h = x + self_attn(input_layernorm(x));  y = h + mlp(post_attention_layernorm(h))
// mlp is a dense GatedMLP for layers < first_k_dense_replace (HF is_moe_layer rule), else an MoE
// with shared experts. Module names are the HF prefixes: "model.layers.L.self_attn", ".mlp", ...
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/deepseek_v3_config.h"
#include "modules/gated_mlp.h"
#include "modules/mla.h"
#include "modules/moe.h"
#include "modules/rmsnorm.h"

namespace locus::models {

using modules::LifecycleState;

// Decides per Linear (full module name without ".weight") whether its checkpoint weights are
// ModelOpt NVFP4. Null = everything BF16.
using QuantPredicate = std::function<bool(const std::string& linear_module)>;

class DecoderLayer : public modules::Module {
 public:
  // ctx.name is "model.layers.<index>"; max_positions sizes the RoPE table.
  DecoderLayer(modules::ModuleContext ctx, const DeepseekV3Config& cfg, int64_t index, int64_t max_positions,
               const QuantPredicate& is_nvfp4);

  int64_t index() const { return index_; }
  bool is_moe() const { return moe_ != nullptr; }
  LifecycleState state() const override;

  // piece: relative to the layer ("self_attn.q_a_proj.weight", "mlp.experts.3.up_proj.weight", ...).
  void load(const std::string& piece, const Tensor& t) override;
  std::vector<std::string> missing_pieces() const override;
  void transform() override;
  void localize() override;
  void reload(const modules::WeightMap& weights) override;  // all-or-nothing: every child checked first
  void check_reload(const modules::WeightMap& weights) const override;
  void rebuild() override;
  modules::MemoryUsage memory() const override;
  void collect_plans(std::vector<modules::PlanRecord>* out) const override;

  // x bf16 [T, hidden] is the residual stream, updated in place, except that each layer leaves its
  // own output (its MLP's or MoE's) in `a` for the caller to add: the next layer, called with
  // pending_a, adds it together with its first norm (ops::add_rmsnorm, one kernel), and after the
  // last layer the model adds it. h is bf16 [T, hidden] scratch. seqs/positions as for
  // modules::MLA::forward (this layer's caches).
  void forward(const Tensor& x, const Tensor& positions, const std::vector<modules::MlaSequence>& seqs,
               const Tensor& h, const Tensor& a, bool pending_a, modules::MlaPath path, const Stream& stream = {});
  // The same with one new token per sequence and this layer's caches in a device table
  // (modules::MLA::forward_table): what a decode step captured in a CUDA graph runs.
  void forward_table(const Tensor& x, const ops::KvTable& table, const Tensor& h, const Tensor& a, bool pending_a,
                     const Stream& stream = {});

  modules::MLA& self_attn() { return *attn_; }
  modules::GatedMLP* dense_mlp() { return mlp_.get(); }
  modules::MoE* moe() { return moe_.get(); }

 private:
  std::vector<modules::Module*> children() const;
  // The layer around its attention: (the pending residual and) norm, attend(h -> a), residual and
  // norm, MLP or MoE into a.
  void forward_around(const Tensor& x, const Tensor& h, const Tensor& a, bool pending_a, const Stream& stream,
                      const std::function<void()>& attend);
  // Splits "self_attn.x.weight" into the child and its relative piece; Error naming the piece.
  modules::Module& route(const std::string& piece, std::string* rest) const;
  modules::ChildWeights split_by_child(const modules::WeightMap& weights) const;

  int64_t index_;
  std::unique_ptr<modules::RMSNorm> input_layernorm_, post_attention_layernorm_;
  std::unique_ptr<modules::MLA> attn_;
  std::unique_ptr<modules::GatedMLP> mlp_;
  std::unique_ptr<modules::MoE> moe_;
};

}  // namespace locus::models
