// `locus make-tiny-model DIR [--nvfp4] [--seed S] [--layers L] ...`: writes a small random
// DeepSeek-V3-shaped checkpoint in the Hugging Face / ModelOpt layout (models/tiny_model.h).
#include <iostream>
#include <memory>

#include "models/tiny_model.h"
#include "runtime/checkpoint.h"
#include "runtime/progress.h"
#include "serve/cli/command.h"

LOCUS_REGISTER_COMMAND("make-tiny-model", "write a small random DeepSeek-V3-shaped checkpoint (BF16 or NVFP4)",
                       [](CLI::App& app) {
                         struct Opts {
                           std::string dir;
                           locus::models::TinyModelOptions m;
                         };
                         auto o = std::make_shared<Opts>();
                         app.add_option("dir", o->dir, "output directory (created if needed)")->required();
                         app.add_flag("--nvfp4", o->m.nvfp4, "ModelOpt NVFP4 MLP and expert linears");
                         app.add_option("--seed", o->m.seed, "random seed (same seed, same files)");
                         app.add_option("--layers", o->m.num_layers, "decoder layers (layer 0 dense, the rest MoE)");
                         app.add_option("--hidden-size", o->m.hidden_size, "hidden size");
                         app.add_option("--heads", o->m.num_heads, "attention heads");
                         app.add_option("--intermediate-size", o->m.intermediate_size, "dense MLP intermediate size");
                         app.add_option("--moe-intermediate-size", o->m.moe_intermediate_size, "expert intermediate size");
                         app.add_option("--experts", o->m.n_routed_experts, "routed experts");
                         app.add_option("--experts-per-token", o->m.num_experts_per_tok, "experts per token (top-k)");
                         app.add_option("--n-group", o->m.n_group, "expert groups");
                         app.add_option("--topk-group", o->m.topk_group, "groups kept per token");
                         app.add_option("--shards", o->m.num_shards, "safetensors shards");
                         return [o] {
                           locus::models::write_tiny_model(o->dir, o->m);
                           auto ck = locus::runtime::Checkpoint::open(o->dir);
                           std::cout << "wrote " << (o->m.nvfp4 ? "NVFP4" : "BF16") << " tiny DeepSeek-V3 model to "
                                     << o->dir << ": " << o->m.num_layers << " layers, " << ck.names().size()
                                     << " tensors in " << ck.num_shards() << " shards, "
                                     << locus::runtime::format_bytes(ck.total_tensor_bytes()) << "\n";
                           return 0;
                         };
                       });
