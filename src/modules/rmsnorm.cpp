#include "modules/rmsnorm.h"

#include "ops/norm.h"

namespace locus::modules {
namespace {

// Validates `t` as a [shape...] bf16/fp32 tensor for piece `piece` of module `who`.
void check_weight(const std::string& who, const std::string& piece, const Tensor& t, const Shape& shape,
                  std::initializer_list<DType> dtypes) {
  bool ok = false;
  for (DType d : dtypes) ok |= t.defined() && t.dtype() == d;
  LOCUS_CHECK(ok && t.shape() == shape, who, ": piece '", piece, "' must be ", shape_to_string(shape), " (",
              dtypes.size() > 1 ? "bf16 or fp32" : "bf16", "), got ", t.defined() ? t.describe() : "undefined");
}

void check_reload_names(const std::string& who, const WeightMap& w) {
  for (const auto& [k, v] : w) LOCUS_CHECK(k == "weight", who, ": unknown weight '", k, "' in reload (expected weight)");
  LOCUS_CHECK(w.count("weight"), who, ": reload is missing 'weight' (the old weight is unchanged)");
}

}  // namespace

RMSNorm::RMSNorm(ModuleContext ctx, int64_t hidden_size, float eps)
    : Module(std::move(ctx)), hidden_(hidden_size), eps_(eps) {
  LOCUS_CHECK(hidden_ >= 1, "RMSNorm '", name(), "': hidden_size must be positive, got ", hidden_);
}

void RMSNorm::load(const std::string& piece, const Tensor& t) {
  const std::string who = "RMSNorm '" + name() + "'";
  LOCUS_CHECK(piece == "weight", who, ": unknown weight piece '", piece, "' (expected weight)");
  LOCUS_CHECK(state_ == LifecycleState::kEmpty || state_ == LifecycleState::kLoaded, who,
              ": load() after transform(); use reload()");
  check_weight(who, piece, t, {hidden_}, {DType::kBF16, DType::kFP32});
  weight_ = t.to(device());
  state_ = LifecycleState::kLoaded;
}

std::vector<std::string> RMSNorm::missing_pieces() const {
  return state_ == LifecycleState::kEmpty ? std::vector<std::string>{"weight"} : std::vector<std::string>{};
}

void RMSNorm::transform() {
  if (state_ >= LifecycleState::kTransformed) return;
  LOCUS_CHECK(state_ == LifecycleState::kLoaded, "RMSNorm '", name(), "': transform() before 'weight' was loaded");
  state_ = LifecycleState::kTransformed;
}

void RMSNorm::localize() {
  transform();
  state_ = LifecycleState::kLocalized;  // never partitioned: the weight stays whole
}

void RMSNorm::check_reload(const WeightMap& weights) const {
  const std::string who = "RMSNorm '" + name() + "'";
  check_reload_names(who, weights);
  const Tensor& t = weights.at("weight");
  if (!weight_.defined()) check_weight(who, "weight", t, {hidden_}, {DType::kBF16, DType::kFP32});
  else check_weight(who, "weight", t, {hidden_}, {weight_.dtype()});
}

void RMSNorm::reload(const WeightMap& weights) {
  check_reload(weights);
  const Tensor& t = weights.at("weight");
  if (!weight_.defined()) return load("weight", t);
  weight_.copy_(t);
}

MemoryUsage RMSNorm::memory() const {
  MemoryUsage m;
  m.add(weight_);
  return m;
}

void RMSNorm::forward(const Tensor& x, const Tensor& y, const Stream& stream) const {
  LOCUS_CHECK(weight_.defined(), "RMSNorm '", name(), "': forward() before 'weight' was loaded");
  ops::rmsnorm(x, weight_, eps_, y, stream);
}

void RMSNorm::add_forward(const Tensor& x, const Tensor& r, const Tensor& y, const Stream& stream) const {
  LOCUS_CHECK(weight_.defined(), "RMSNorm '", name(), "': forward() before 'weight' was loaded");
  ops::add_rmsnorm(x, r, weight_, eps_, y, stream);
}

Embedding::Embedding(ModuleContext ctx, int64_t vocab_size, int64_t hidden_size)
    : Module(std::move(ctx)), vocab_(vocab_size), hidden_(hidden_size) {
  LOCUS_CHECK(vocab_ >= 1 && hidden_ >= 1, "Embedding '", name(), "': vocab_size and hidden_size must be positive");
}

void Embedding::load(const std::string& piece, const Tensor& t) {
  const std::string who = "Embedding '" + name() + "'";
  LOCUS_CHECK(piece == "weight", who, ": unknown weight piece '", piece, "' (expected weight)");
  LOCUS_CHECK(state_ == LifecycleState::kEmpty || state_ == LifecycleState::kLoaded, who,
              ": load() after transform(); use reload()");
  check_weight(who, piece, t, {vocab_, hidden_}, {DType::kBF16});
  weight_ = t.to(device());
  state_ = LifecycleState::kLoaded;
}

std::vector<std::string> Embedding::missing_pieces() const {
  return state_ == LifecycleState::kEmpty ? std::vector<std::string>{"weight"} : std::vector<std::string>{};
}

void Embedding::transform() {
  if (state_ >= LifecycleState::kTransformed) return;
  LOCUS_CHECK(state_ == LifecycleState::kLoaded, "Embedding '", name(), "': transform() before 'weight' was loaded");
  state_ = LifecycleState::kTransformed;
}

void Embedding::localize() {
  transform();
  state_ = LifecycleState::kLocalized;
}

void Embedding::check_reload(const WeightMap& weights) const {
  const std::string who = "Embedding '" + name() + "'";
  check_reload_names(who, weights);
  check_weight(who, "weight", weights.at("weight"), {vocab_, hidden_}, {DType::kBF16});
}

void Embedding::reload(const WeightMap& weights) {
  check_reload(weights);
  const Tensor& t = weights.at("weight");
  if (!weight_.defined()) return load("weight", t);
  weight_.copy_(t);
}

MemoryUsage Embedding::memory() const {
  MemoryUsage m;
  m.add(weight_);
  return m;
}

void Embedding::forward(const Tensor& ids, const Tensor& y, const Stream& stream) const {
  LOCUS_CHECK(weight_.defined(), "Embedding '", name(), "': forward() before 'weight' was loaded");
  ops::embedding(weight_, ids, y, stream);
}

}  // namespace locus::modules
