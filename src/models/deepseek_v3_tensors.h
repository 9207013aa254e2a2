// The checkpoint tensors a DeepSeek-V3 config implies, with their allowed dtypes and shapes, so
// the loader can say precisely which tensor is missing or mis-shaped before any weight is read.
// Names are HF's (ecosystem.md 3.2); NVFP4 Linears carry the ModelOpt siblings (1.4).
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "models/deepseek_v3_config.h"
#include "models/deepseek_v3_layer.h"

namespace locus::models {

struct ExpectedTensor {
  std::string name;
  std::vector<DType> dtypes;  // any of these
  Shape shape;
  bool scalar = false;        // 0-d or [1] both accepted (shape ignored)
  bool optional = false;      // may be absent (NVFP4 input_scale)
};

// How the routed experts of MoE layers are stored.
enum class ExpertLayout {
  kPerExpert,  // mlp.experts.{e}.{gate,up,down}_proj.* (DeepSeek, ModelOpt, transformers save_pretrained)
  kFused,      // mlp.experts.gate_up_proj [E, 2I, hidden], mlp.experts.down_proj [E, hidden, I] (BF16 only)
};

// Every tensor of the model (layers 0 .. num_hidden_layers-1). expert_layout(layer) picks the
// expert form per MoE layer (null: per expert everywhere).
std::vector<ExpectedTensor> deepseek_v3_expected_tensors(const DeepseekV3Config& cfg, const QuantPredicate& is_nvfp4,
                                                         const std::function<ExpertLayout(int64_t)>& expert_layout = {});

// "bf16 or fp32".
std::string describe_dtypes(const std::vector<DType>& dtypes);

}  // namespace locus::models
