#include "modules/gated_mlp.h"

#include <algorithm>

namespace locus::modules {

using locality::WeightMode;

GatedMLP::GatedMLP(ModuleContext ctx, GatedMlpConfig cfg) : Module(std::move(ctx)), cfg_(cfg) {
  LOCUS_CHECK(cfg_.hidden_size >= 1 && cfg_.intermediate_size >= 1, "GatedMLP '", name(),
              "': hidden_size and intermediate_size must be positive, got ", cfg_.hidden_size, " and ",
              cfg_.intermediate_size);
  LinearConfig gu;
  gu.in_features = cfg_.hidden_size;
  gu.out_features = cfg_.intermediate_size;
  gu.quant = cfg_.quant;
  gu.mode = WeightMode::kFusedGateUp;
  gate_up_ = std::make_unique<Linear>(ctx_.child("gate_up_proj"), gu);
  LinearConfig dn;
  dn.in_features = cfg_.intermediate_size;
  dn.out_features = cfg_.hidden_size;
  dn.quant = cfg_.quant;
  down_ = std::make_unique<Linear>(ctx_.child("down_proj"), dn);
}

LifecycleState GatedMLP::state() const { return std::min(gate_up_->state(), down_->state()); }

// Maps a checkpoint name to the child Linear's piece: gate_proj.X -> gate.X, up_proj.X -> up.X
// (gate_up), gate_up_proj.X -> X (already fused), down_proj.X -> X (down).
std::string GatedMLP::map_piece(const std::string& piece, bool* to_down) {
  auto strip = [&](const char* prefix, std::string* rest) {
    const std::string p = prefix;
    if (piece.rfind(p, 0) != 0) return false;
    *rest = piece.substr(p.size());
    return true;
  };
  std::string rest;
  *to_down = false;
  if (strip("gate_proj.", &rest)) return "gate." + rest;
  if (strip("up_proj.", &rest)) return "up." + rest;
  if (strip("gate_up_proj.", &rest)) return rest;
  if (strip("down_proj.", &rest)) {
    *to_down = true;
    return rest;
  }
  return "";
}

void GatedMLP::load(const std::string& piece, const Tensor& t) {
  bool to_down = false;
  const std::string mapped = map_piece(piece, &to_down);
  LOCUS_CHECK(!mapped.empty(), "GatedMLP '", name(), "': unknown weight '", piece,
              "' (expected gate_proj.*, up_proj.*, gate_up_proj.* or down_proj.*)");
  (to_down ? *down_ : *gate_up_).load(mapped, t);
}

std::vector<std::string> GatedMLP::missing_pieces() const {
  std::vector<std::string> out;
  for (const std::string& m : gate_up_->missing_pieces()) {
    const bool gate = m.rfind("gate", 0) == 0;
    const size_t dot = m.find('.');
    out.push_back(std::string(gate ? "gate_proj." : "up_proj.") + (dot == std::string::npos ? "weight" : m.substr(dot + 1)));
  }
  for (const std::string& m : down_->missing_pieces()) out.push_back("down_proj." + m);
  return out;
}

void GatedMLP::transform() {
  gate_up_->transform();
  down_->transform();
}

void GatedMLP::localize() {
  gate_up_->localize();
  down_->localize();
}

void GatedMLP::split(const WeightMap& weights, WeightMap* gu, WeightMap* dn) const {
  for (const auto& [piece, t] : weights) {
    bool to_down = false;
    const std::string mapped = map_piece(piece, &to_down);
    LOCUS_CHECK(!mapped.empty(), "GatedMLP '", name(), "': unknown weight '", piece, "' in reload");
    (to_down ? *dn : *gu)[mapped] = t;
  }
}

void GatedMLP::check_reload(const WeightMap& weights) const {
  WeightMap gu, dn;
  split(weights, &gu, &dn);
  // Like MLA and MoE: a projection with no tensors in this reload keeps its weights.
  if (!gu.empty()) gate_up_->check_reload(gu);
  if (!dn.empty()) down_->check_reload(dn);
}

void GatedMLP::reload(const WeightMap& weights) {
  WeightMap gu, dn;
  split(weights, &gu, &dn);
  check_reload(weights);  // both validated before either is written
  if (!gu.empty()) gate_up_->reload(gu);
  if (!dn.empty()) down_->reload(dn);
}

void GatedMLP::rebuild() {
  gate_up_->rebuild();
  down_->rebuild();
}

MemoryUsage GatedMLP::memory() const {
  MemoryUsage m = gate_up_->memory();
  m += down_->memory();
  return m;
}

void GatedMLP::collect_plans(std::vector<PlanRecord>* out) const {
  gate_up_->collect_plans(out);
  down_->collect_plans(out);
}

bool GatedMLP::uses_fused_swiglu() const {
  return cfg_.fuse_swiglu && !gate_up_->per_half_scales() && !gate_up_->unfused_split();
}

void GatedMLP::forward(const Tensor& x, const Tensor& y, const Stream& stream) const {
  LOCUS_CHECK(x.dim() == 2 && x.size(1) == cfg_.hidden_size, "GatedMLP '", name(), "': x must be [M, ",
              cfg_.hidden_size, "], got ", x.describe());
  Tensor h = Tensor::empty({x.size(0), cfg_.intermediate_size}, DType::kBF16, x.device());
  if (uses_fused_swiglu()) gate_up_->forward(x, h, stream);
  else gate_up_->forward_unfused(x, h, stream);
  down_->forward(h, y, stream);
}

}  // namespace locus::modules
