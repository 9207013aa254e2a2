// RMSNorm and Embedding: small weight owners with the same lifecycle as the other modules.
// They are never partitioned (their weights stay whole, outside any domain).
#pragma once
#include "modules/module.h"

namespace locus::modules {

// y = x / sqrt(mean(x^2) + eps) * weight. Piece: "weight" [hidden] (bf16 or fp32, kept as given).
class RMSNorm : public Module {
 public:
  RMSNorm(ModuleContext ctx, int64_t hidden_size, float eps);
  void load(const std::string& piece, const Tensor& t) override;
  std::vector<std::string> missing_pieces() const override;
  void transform() override;
  void localize() override;
  void reload(const WeightMap& weights) override;
  void check_reload(const WeightMap& weights) const override;
  void rebuild() override {}
  MemoryUsage memory() const override;

  // x [M, hidden] bf16/fp32 -> y same shape (bf16/fp32, may be a strided view).
  void forward(const Tensor& x, const Tensor& y, const Stream& stream = {}) const;
  // x += r (a residual sum, in place), then forward(x, y): ops::add_rmsnorm, one kernel on CUDA.
  void add_forward(const Tensor& x, const Tensor& r, const Tensor& y, const Stream& stream = {}) const;
  const Tensor& weight() const { return weight_; }
  int64_t hidden_size() const { return hidden_; }
  float eps() const { return eps_; }

 private:
  int64_t hidden_;
  float eps_;
  Tensor weight_;
};

// y[T, H] = table[ids[t]]. Piece: "weight" [vocab, hidden] bf16.
class Embedding : public Module {
 public:
  Embedding(ModuleContext ctx, int64_t vocab_size, int64_t hidden_size);
  void load(const std::string& piece, const Tensor& t) override;
  std::vector<std::string> missing_pieces() const override;
  void transform() override;
  void localize() override;
  void reload(const WeightMap& weights) override;
  void check_reload(const WeightMap& weights) const override;
  void rebuild() override {}
  MemoryUsage memory() const override;

  void forward(const Tensor& ids, const Tensor& y, const Stream& stream = {}) const;
  const Tensor& weight() const { return weight_; }

 private:
  int64_t vocab_, hidden_;
  Tensor weight_;
};

}  // namespace locus::modules
