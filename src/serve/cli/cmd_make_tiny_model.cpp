// `locus make-tiny-model DIR [--nvfp4] [--seed S] [--shape tiny|deepseek-v3] [--layers L] ...`:
// writes a small random DeepSeek-V3-shaped checkpoint in the Hugging Face / ModelOpt layout
// (models/tiny_model.h). `--shape` picks the widths to start from; each width flag given
// overrides its one field.
#include <iostream>
#include <map>
#include <memory>

#include "models/tiny_model.h"
#include "runtime/checkpoint.h"
#include "runtime/progress.h"
#include "serve/cli/command.h"

namespace {

using locus::models::TinyModelOptions;

// The width flags: each sets one field of the options, over the shape's value.
struct WidthFlag {
  const char* flag;
  const char* help;
  int64_t TinyModelOptions::*field;
};
const WidthFlag kWidthFlags[] = {
    {"--layers", "decoder layers (layer 0 dense, the rest MoE)", &TinyModelOptions::num_layers},
    {"--hidden-size", "hidden size", &TinyModelOptions::hidden_size},
    {"--heads", "attention heads", &TinyModelOptions::num_heads},
    {"--q-lora-rank", "query LoRA rank", &TinyModelOptions::q_lora_rank},
    {"--kv-lora-rank", "key/value LoRA rank (the latent the KV cache holds)", &TinyModelOptions::kv_lora_rank},
    {"--qk-nope-head-dim", "query/key head dim without rotary embedding", &TinyModelOptions::qk_nope_head_dim},
    {"--qk-rope-head-dim", "query/key head dim with rotary embedding", &TinyModelOptions::qk_rope_head_dim},
    {"--v-head-dim", "value head dim", &TinyModelOptions::v_head_dim},
    {"--intermediate-size", "dense MLP intermediate size", &TinyModelOptions::intermediate_size},
    {"--moe-intermediate-size", "expert intermediate size", &TinyModelOptions::moe_intermediate_size},
    {"--experts", "routed experts", &TinyModelOptions::n_routed_experts},
    {"--experts-per-token", "experts per token (top-k)", &TinyModelOptions::num_experts_per_tok},
    {"--n-group", "expert groups", &TinyModelOptions::n_group},
    {"--topk-group", "groups kept per token", &TinyModelOptions::topk_group},
    {"--shared-experts", "shared experts (0: none)", &TinyModelOptions::n_shared_experts},
};

std::function<int()> setup_make_tiny_model(CLI::App& app) {
  struct Opts {
    std::string dir;
    std::string shape = "tiny";
    bool nvfp4 = false;
    uint64_t seed = 0;
    int shards = TinyModelOptions{}.num_shards;
    std::map<std::string, int64_t> widths;  // the width flags given
  };
  auto o = std::make_shared<Opts>();
  app.add_option("dir", o->dir, "output directory (created if needed)")->required();
  app.add_option("--shape", o->shape,
                 "widths to start from: tiny (the default; a few MB) or deepseek-v3 "
                 "(DeepSeek-V3's own; about 1.2 GB per dense layer and 88 MB per expert "
                 "in BF16, so pair it with --experts)")
      ->check(CLI::IsMember({"tiny", "deepseek-v3"}));
  app.add_flag("--nvfp4", o->nvfp4, "ModelOpt NVFP4 MLP and expert linears");
  app.add_option("--seed", o->seed, "random seed (same seed, same files)");
  app.add_option("--shards", o->shards, "safetensors files (0: 2, or about 4 GiB each when larger)");
  for (const WidthFlag& f : kWidthFlags) app.add_option(f.flag, o->widths[f.flag], f.help);
  return [o, &app] {
    TinyModelOptions m = o->shape == "deepseek-v3" ? locus::models::deepseek_v3_widths()
                                                   : TinyModelOptions{};
    m.nvfp4 = o->nvfp4;
    m.seed = o->seed;
    m.num_shards = o->shards;
    for (const WidthFlag& f : kWidthFlags)
      if (app.count(f.flag) > 0) m.*f.field = o->widths[f.flag];
    locus::models::write_tiny_model(o->dir, m);
    auto ck = locus::runtime::Checkpoint::open(o->dir);
    std::cout << "wrote " << (m.nvfp4 ? "NVFP4" : "BF16") << " tiny DeepSeek-V3 model to "
              << o->dir << ": " << m.num_layers << " layers, " << ck.names().size()
              << " tensors in " << ck.num_shards() << " shards, "
              << locus::runtime::format_bytes(ck.total_tensor_bytes()) << "\n";
    return 0;
  };
}

}  // namespace

LOCUS_REGISTER_COMMAND("make-tiny-model", "write a small random DeepSeek-V3-shaped checkpoint (BF16 or NVFP4)",
                       setup_make_tiny_model);
