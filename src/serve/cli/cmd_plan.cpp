// `locus plan`: the locality-domain plan of every layer type of a DeepSeek-V3-shaped model, with
// the reason for each unpartitioned one and the weight bytes per domain. Shapes come from flags
// (DeepSeek-V3 defaults) or from --model DIR (its config.json); explicit flags override the file.
#include <iostream>
#include <memory>
#include <optional>

#include "core/error.h"
#include "locality/model_plan.h"
#include "locality/planner.h"
#include "locality/topology.h"
#include "models/deepseek_v3_config.h"
#include "runtime/quant_config.h"
#include "serve/cli/command.h"

namespace {

using locus::locality::QuantKind;

struct PlanOptions {
  locus::locality::DeepseekShapes shapes;
  std::string quant = "bf16";
  std::string model_dir;
  std::string device = "cpu";
  bool enable = false;
  int domains = 0;  // 0: not given
  int num_partitions = 0;
  std::vector<std::string> excludes;
  std::vector<std::string> allowed_ops;  // empty: the policy's default (all)
  bool no_excludes = false;
  std::vector<int64_t> decode_batches{1};
  double bandwidth_gbs = 0;  // 0: not given
};

struct ShapeFlag {
  const char* name;
  int64_t locus::locality::DeepseekShapes::*field;
  const char* help;
};

const ShapeFlag kShapeFlags[] = {
    {"--hidden", &locus::locality::DeepseekShapes::hidden, "hidden size"},
    {"--intermediate", &locus::locality::DeepseekShapes::intermediate, "dense MLP intermediate size"},
    {"--moe-intermediate", &locus::locality::DeepseekShapes::moe_intermediate, "per-expert intermediate size"},
    {"--heads", &locus::locality::DeepseekShapes::heads, "attention heads"},
    {"--q-lora-rank", &locus::locality::DeepseekShapes::q_lora_rank, "q LoRA rank (0: plain q_proj)"},
    {"--kv-lora-rank", &locus::locality::DeepseekShapes::kv_lora_rank, "kv LoRA rank (latent size)"},
    {"--qk-nope", &locus::locality::DeepseekShapes::qk_nope, "qk_nope_head_dim"},
    {"--qk-rope", &locus::locality::DeepseekShapes::qk_rope, "qk_rope_head_dim"},
    {"--v-head", &locus::locality::DeepseekShapes::v_head, "v_head_dim"},
    {"--experts", &locus::locality::DeepseekShapes::experts, "routed experts (0: no MoE)"},
    {"--experts-per-token", &locus::locality::DeepseekShapes::experts_per_token, "routed experts per token (top-k)"},
    {"--shared-experts", &locus::locality::DeepseekShapes::shared_experts, "shared experts"},
    {"--vocab", &locus::locality::DeepseekShapes::vocab, "vocabulary size (lm_head rows)"},
    {"--layers", &locus::locality::DeepseekShapes::layers, "decoder layers"},
    {"--dense-layers", &locus::locality::DeepseekShapes::dense_layers, "leading dense layers (first_k_dense_replace)"},
};

locus::locality::DeepseekShapes shapes_from_config(const locus::models::DeepseekV3Config& c) {
  locus::locality::DeepseekShapes s;
  s.hidden = c.hidden_size;
  s.intermediate = c.intermediate_size;
  s.moe_intermediate = c.moe_intermediate_size;
  s.heads = c.num_attention_heads;
  s.q_lora_rank = c.q_lora_rank.value_or(0);
  s.kv_lora_rank = c.kv_lora_rank;
  s.qk_nope = c.qk_nope_head_dim;
  s.qk_rope = c.qk_rope_head_dim;
  s.v_head = c.v_head_dim;
  s.experts = c.n_routed_experts;
  s.experts_per_token = c.num_experts_per_tok;
  s.shared_experts = c.n_shared_experts;
  s.vocab = c.vocab_size;
  s.layers = c.num_hidden_layers;
  int64_t dense = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) dense += c.is_moe_layer(i) ? 0 : 1;
  s.dense_layers = dense;
  return s;
}

// --quant Q: the Linear layers in Q, except those ModelOpt's NVFP4 exports keep in BF16 (lm_head,
// attention, router gates), so that the plan and its decode floor match such a checkpoint.
std::function<QuantKind(const std::string&)> flag_quant_of(const std::string& name) {
  const QuantKind q = locus::locality::quant_kind_from_name(name);
  locus::runtime::QuantConfig bf16_kept;
  bf16_kept.exclude_modules = locus::runtime::deepseek_nvfp4_bf16_modules();
  return [q, bf16_kept](const std::string& m) { return bf16_kept.excluding_pattern(m).empty() ? q : QuantKind::kBF16; };
}

int run_plan(const PlanOptions& opt, const std::vector<CLI::Option*>& shape_opts, CLI::Option* quant_opt) {
  locus::locality::DeepseekShapes shapes = opt.shapes;
  std::function<QuantKind(const std::string&)> quant_of;
  if (!opt.model_dir.empty()) {
    const locus::models::DeepseekV3Config cfg = locus::models::load_deepseek_v3_config(opt.model_dir);
    shapes = shapes_from_config(cfg);
    for (size_t i = 0; i < shape_opts.size(); ++i) {  // explicit flags win over the file
      if (shape_opts[i]->count() > 0) shapes.*(kShapeFlags[i].field) = opt.shapes.*(kShapeFlags[i].field);
    }
    if (quant_opt->count() > 0) {
      quant_of = flag_quant_of(opt.quant);
    } else {
      auto qc = std::make_shared<locus::runtime::QuantConfig>(locus::runtime::load_quant_config(opt.model_dir));
      quant_of = [qc](const std::string& m) { return qc->is_quantized(m) ? QuantKind::kNVFP4 : QuantKind::kBF16; };
    }
    std::cout << "model: " << opt.model_dir << "\n";
  } else {
    quant_of = flag_quant_of(opt.quant);
  }

  locus::Device device = locus::Device::cpu();
  if (opt.device == "cuda") device = locus::Device::cuda(0);
  const locus::locality::Topology topo = locus::locality::resolve_topology(
      device, opt.domains > 0 ? std::optional<int>(opt.domains) : std::nullopt);
  locus::locality::LocalityDomainPolicy policy;
  policy.enabled = opt.enable;
  policy.num_partitions = opt.num_partitions;
  if (opt.no_excludes) policy.exclude_modules.clear();
  if (!opt.excludes.empty()) policy.exclude_modules = opt.excludes;
  if (!opt.allowed_ops.empty()) {
    policy.allowed_ops.clear();
    for (const std::string& op : opt.allowed_ops) policy.allowed_ops.insert(locus::locality::op_kind_from_name(op));
  }
  const locus::locality::Planner planner(policy, topo);
  const auto plans = locus::locality::plan_deepseek_model(shapes, planner, quant_of);
  std::cout << locus::locality::format_model_plan(plans, planner) << "\n"
            << locus::locality::format_decode_floor(plans, shapes, opt.decode_batches, opt.bandwidth_gbs);
  return 0;
}

std::function<int()> setup_plan(CLI::App& app) {
  auto opt = std::make_shared<PlanOptions>();
  auto shape_opts = std::make_shared<std::vector<CLI::Option*>>();
  for (const ShapeFlag& f : kShapeFlags) {
    shape_opts->push_back(app.add_option(f.name, opt->shapes.*(f.field), f.help)->capture_default_str());
  }
  CLI::Option* quant_opt = app.add_option("--quant", opt->quant, "weight quantization of the Linear layers")
                               ->check(CLI::IsMember({"bf16", "nvfp4", "fp8"}))
                               ->capture_default_str();
  app.add_option("--model", opt->model_dir, "model directory: shapes from its config.json (flags override)")
      ->check(CLI::ExistingDirectory);
  app.add_flag("--enable-locality-domains", opt->enable, "turn the locality-domain policy on");
  app.add_option("--domains", opt->domains, "emulated domain count (LOCUS_FAKE_LOCALITY_DOMAINS still wins)")
      ->check(CLI::Range(1, locus::locality::kMaxLocalityDomains));
  app.add_option("--num-partitions", opt->num_partitions, "policy num_partitions (0: the domain count)")
      ->check(CLI::Range(0, locus::locality::kMaxLocalityDomains));
  app.add_option("--exclude", opt->excludes, "module patterns kept whole (replaces the defaults)");
  app.add_flag("--no-excludes", opt->no_excludes, "exclude no module");
  app.add_option("--allowed-ops", opt->allowed_ops,
                 "op kinds that may be partitioned, comma separated (bf16_linear, nvfp4_linear, bf16_bmm, bf16_moe, nvfp4_moe)")
      ->delimiter(',');
  app.add_option("--decode-batch", opt->decode_batches, "batch sizes for the decode-step weight reads, comma separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--bandwidth-gbs", opt->bandwidth_gbs,
                 "memory bandwidth in GB/s: also print the decode floor (step time and tok/s at that rate)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", opt->device, "device whose topology to use")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  return [opt, shape_opts, quant_opt] { return run_plan(*opt, *shape_opts, quant_opt); };
}

}  // namespace

LOCUS_REGISTER_COMMAND("plan", "print the locality-domain plan of every layer type", setup_plan);
