// The locality plan of a whole DeepSeek-V3-shaped model: one entry per layer type (q_a, q_b,
// kv_a, the absorbed kv_b BMMs, o_proj, dense gate_up/down, router gate, routed experts, shared
// experts, lm_head) with its plan or reason and the weight bytes each domain holds. Used by
// `locus plan` and for start-up logs. Shapes are plain numbers so this layer does not depend on
// models/ (the CLI fills them from flags or config.json).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "locality/planner.h"

namespace locus::locality {

struct DeepseekShapes {  // DeepSeek-V3 defaults
  int64_t hidden = 7168;
  int64_t intermediate = 18432;     // dense MLP
  int64_t moe_intermediate = 2048;  // per expert
  int64_t heads = 128;
  int64_t q_lora_rank = 1536;       // 0: no q LoRA (plain q_proj, V2-Lite)
  int64_t kv_lora_rank = 512;
  int64_t qk_nope = 128;
  int64_t qk_rope = 64;
  int64_t v_head = 128;
  int64_t experts = 256;            // routed experts; 0: no MoE layers
  int64_t experts_per_token = 8;    // routed experts each token picks (top-k)
  int64_t shared_experts = 1;
  int64_t vocab = 129280;
  int64_t layers = 61;
  int64_t dense_layers = 3;         // layers with a dense MLP; the others are MoE
  void validate() const;            // Error naming the first non-positive or inconsistent field
};

struct LayerPlan {
  std::string layer_type;  // "q_a_proj", "experts", ...
  std::string module;      // a representative module name ("model.layers.0.self_attn.q_a_proj")
  std::string shape;       // "[1536, 7168]", "128 x [128, 512]", "256 x ([4096, 7168] + [7168, 2048])"
  QuantKind quant = QuantKind::kBF16;
  int64_t count = 0;       // how many of these the model has (layers using it)
  Plan plan;
  int64_t whole_bytes = 0;                // one instance's weight bytes
  std::vector<int64_t> domain_bytes;      // per domain when partitioned (one instance), else empty
};

// quant_of(module) gives the weight quantization of a Linear (bf16 or nvfp4); the absorbed BMM
// weights are always bf16.
std::vector<LayerPlan> plan_deepseek_model(const DeepseekShapes& shapes, const Planner& planner,
                                           const std::function<QuantKind(const std::string&)>& quant_of);

// Weight bytes of rows x k in `quant` (nvfp4: packed nibbles + one e4m3 scale per 16).
int64_t weight_bytes(int64_t rows, int64_t k, QuantKind quant);

// Weight bytes one decode step of `batch` tokens (one per sequence) reads, on average: every
// layer's whole weights, but of the routed experts only those the tokens pick, E (1 - (1 - k/E)^B)
// of E where each of the B tokens picks k of E experts uniformly and independently (a trained
// router is less even: its tokens share more experts, so a step reads less). The KV cache, the
// embedding rows and the norms are not counted.
double decode_step_weight_bytes(const std::vector<LayerPlan>& plans, const DeepseekShapes& shapes, int64_t batch);

// One line per batch size: the bytes a decode step reads and, with bandwidth_gbs > 0, the time
// reading them takes at that rate and the tokens/s that allows (the decode floor).
std::string format_decode_floor(const std::vector<LayerPlan>& plans, const DeepseekShapes& shapes,
                                const std::vector<int64_t>& batches, double bandwidth_gbs);

// Human-readable report: topology, policy, one block per layer type, and model totals per domain.
std::string format_model_plan(const std::vector<LayerPlan>& plans, const Planner& planner);

}  // namespace locus::locality
