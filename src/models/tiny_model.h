// A small random DeepSeek-V3-shaped checkpoint in the exact Hugging Face / ModelOpt layout, for
// the README demo and the tests (`locus make-tiny-model DIR [--nvfp4]`). The directory holds:
//   config.json (model_type deepseek_v3, architectures [DeepseekV3ForCausalLM], YaRN rope_scaling),
//   model-00001-of-00002.safetensors, model-00002-of-00002.safetensors, model.safetensors.index.json,
//   hf_quant_config.json (with --nvfp4; config.json also gets quantization_config),
//   tokenizer.json (byte-level BPE: 256 byte tokens, merges, <｜begin▁of▁sentence｜>,
//   <｜end▁of▁sentence｜>), tokenizer_config.json, generation_config.json.
// Weights: BF16 normal(0, init_std) for every matrix, norms 1.0, e_score_correction_bias fp32 small
// random. With nvfp4, the MLP and expert (routed and shared) linears are ModelOpt NVFP4 (weight U8
// [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2 F32 0-d, input_scale F32 0-d); attention,
// the router gate, embeddings and lm_head stay BF16 and are listed in exclude_modules.
// Same options and seed -> byte-identical files.
// Default shapes are aligned for the LD planner: every BF16 linear/BMM/MoE splits over 2 and 4
// domains; with NVFP4 (128-row scale blocks) every linear and the experts split over 2 domains.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "models/deepseek_v3_config.h"

namespace locus::models {

struct TinyModelOptions {
  uint64_t seed = 0;
  bool nvfp4 = false;
  int64_t num_layers = 2;          // layer 0 dense (first_k_dense_replace = 1), the rest MoE
  int64_t hidden_size = 256;
  int64_t num_heads = 4;
  int64_t q_lora_rank = 128;
  int64_t kv_lora_rank = 64;
  int64_t qk_nope_head_dim = 32;
  int64_t qk_rope_head_dim = 16;
  int64_t v_head_dim = 32;
  int64_t intermediate_size = 512;
  int64_t moe_intermediate_size = 256;  // 2 x 128 rows: NVFP4 experts split over 2 domains
  int64_t n_routed_experts = 8;
  int64_t num_experts_per_tok = 2;
  int64_t n_group = 2;
  int64_t topk_group = 1;
  int64_t n_shared_experts = 1;
  int64_t max_position_embeddings = 2048;
  double init_std = 0.02;
  int num_shards = 0;  // safetensors files; 0: tiny_model_shards's choice
};

// Shards of at most about this many bytes when the count is left to tiny_model_shards.
constexpr uint64_t kTinyModelShardBytes = uint64_t{4} << 30;

// The safetensors file count write_tiny_model uses: num_shards, or where that is 0, 2 (the tiny
// model's) or as many as keep each file near kTinyModelShardBytes, whichever is more. The writer
// holds one shard in memory at a time.
int tiny_model_shards(const TinyModelOptions& opts);

// DeepSeek-V3's own widths with the other options at their defaults (2 layers): hidden 7168, 128
// heads, q / kv LoRA ranks 1536 / 512, head dims 128 + 64 (q, k) and 128 (v), dense MLP 18432,
// 256 routed experts 2048 wide, 8 per token from 4 of 8 groups, 1 shared. For measuring at the
// real per-layer shapes with a few layers (`locus make-tiny-model --shape deepseek-v3`; fewer
// experts keep the per-token reads and shrink the file).
TinyModelOptions deepseek_v3_widths();

// The config.json the options produce (vocab_size = the tiny tokenizer's size).
DeepseekV3Config tiny_model_config(const TinyModelOptions& opts);

// One tensor the checkpoint holds: name, safetensors dtype and shape.
struct TinyTensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};
// Every tensor name/dtype/shape the checkpoint for `opts` holds, in file order (what tests check).
std::vector<TinyTensorSpec> tiny_model_tensor_specs(const TinyModelOptions& opts);

// Writes the directory (created if needed; existing files of the same names are overwritten),
// one shard at a time. Error naming the path on I/O failure or too little free disk space, or
// naming the option for invalid options (e.g. a dimension not a multiple of 16 with nvfp4).
void write_tiny_model(const std::string& dir, const TinyModelOptions& opts);

// The normal(0, std) values write_tiny_model draws for the tensor `name` (n of them): a function
// of (seed, name) only, whatever the thread count, and a prefix of any longer draw for that name.
std::vector<float> tiny_model_normal_values(uint64_t seed, const std::string& name, int64_t n, double std);

// The tiny byte-level tokenizer files, as JSON text.
std::string tiny_tokenizer_json();
std::string tiny_tokenizer_config_json();
int64_t tiny_tokenizer_vocab_size();

}  // namespace locus::models
