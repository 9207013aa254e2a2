// RoPE tables (plain and YaRN, Hugging Face DeepSeek-V3 semantics) and the apply_rope dispatcher.
#include "ops/rope.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/cpu_ops.h"
#include "core/tensor_checks.h"
#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_small_ops.h"
#endif

namespace locus::ops {
namespace {

// YaRN's magnitude correction: 0.1 * m * ln(scale) + 1 for scale > 1.
double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// The rotary dimension index at which a frequency completes `rotations` turns over `max_pos`.
double correction_dim(double rotations, int64_t dim, double base, int64_t max_pos) {
  return static_cast<double>(dim) * std::log(static_cast<double>(max_pos) / (rotations * 2.0 * M_PI)) /
         (2.0 * std::log(base));
}

void check_config(const RopeConfig& c, int64_t max_positions) {
  LOCUS_CHECK(c.dim > 0 && c.dim % 2 == 0, "rope: dim must be a positive even number, got ", c.dim);
  LOCUS_CHECK(max_positions > 0, "rope: max_positions must be positive, got ", max_positions);
  LOCUS_CHECK(std::isfinite(c.theta) && c.theta > 1.0, "rope: theta must be a finite number > 1, got ", c.theta);
  if (!c.yarn) return;
  LOCUS_CHECK(std::isfinite(c.factor) && c.factor > 0.0, "rope: yarn factor must be positive, got ", c.factor);
  LOCUS_CHECK(c.original_max_position > 0, "rope: yarn original_max_position must be positive, got ",
              c.original_max_position);
  LOCUS_CHECK(c.beta_fast > 0.0 && c.beta_slow > 0.0, "rope: yarn beta_fast and beta_slow must be positive, got ",
              c.beta_fast, " and ", c.beta_slow);
  LOCUS_CHECK(std::isfinite(c.mscale) && std::isfinite(c.mscale_all_dim), "rope: yarn mscale values must be finite");
}

}  // namespace

RopeTable make_rope_table(const RopeConfig& cfg, int64_t max_positions) {
  check_config(cfg, max_positions);
  const int64_t half = cfg.dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  double attention_factor = 1.0;
  RopeTable t;
  t.dim = cfg.dim;
  t.softmax_mscale = 1.0;
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0 / std::pow(cfg.theta, static_cast<double>(2 * i) / static_cast<double>(cfg.dim));
  if (cfg.yarn) {
    // transformers' _compute_yarn_parameters (truncate = true), evaluated in double.
    double low = std::floor(correction_dim(cfg.beta_fast, cfg.dim, cfg.theta, cfg.original_max_position));
    double high = std::ceil(correction_dim(cfg.beta_slow, cfg.dim, cfg.theta, cfg.original_max_position));
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(cfg.dim - 1));
    if (low == high) high += 0.001;  // as transformers does, to avoid a zero-width ramp
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = inv_freq[i], interpolation = inv_freq[i] / cfg.factor;
      // ramp = 0: high-frequency dims keep their frequency; ramp = 1: low-frequency dims are interpolated.
      inv_freq[i] = interpolation * ramp + extrapolation * (1.0 - ramp);
    }
    attention_factor = (cfg.mscale != 0.0 && cfg.mscale_all_dim != 0.0)
                           ? yarn_mscale(cfg.factor, cfg.mscale) / yarn_mscale(cfg.factor, cfg.mscale_all_dim)
                           : yarn_mscale(cfg.factor, 1.0);
    if (cfg.mscale_all_dim != 0.0) t.softmax_mscale = yarn_mscale(cfg.factor, cfg.mscale_all_dim);
  }
  t.cos = Tensor::empty({max_positions, half}, DType::kFP32);
  t.sin = Tensor::empty({max_positions, half}, DType::kFP32);
  float* c = t.cos.data<float>();
  float* s = t.sin.data<float>();
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      c[p * half + i] = static_cast<float>(std::cos(angle) * attention_factor);
      s[p * half + i] = static_cast<float>(std::sin(angle) * attention_factor);
    }
  return t;
}

void apply_rope(const Tensor& x, const Tensor& positions, const RopeTable& table, bool interleaved,
                const Stream& stream) {
  const char* op = "apply_rope";
  checks::defined(op, "x", x);
  LOCUS_CHECK(x.dim() == 2 || x.dim() == 3, op, ": x must be [T, H, dim] or [T, dim], got ", x.describe());
  checks::dtype(op, "x", x, {DType::kBF16, DType::kFP32});
  checks::unit_last_stride(op, "x", x);
  checks::rank(op, "positions", positions, 1);
  checks::dtype(op, "positions", positions, {DType::kI32, DType::kI64});
  LOCUS_CHECK(positions.size(0) == x.size(0), op, ": positions has ", positions.size(0), " entries but x has T=",
              x.size(0));
  checks::rank(op, "table.cos", table.cos, 2);
  checks::rank(op, "table.sin", table.sin, 2);
  checks::dtype(op, "table.cos", table.cos, {DType::kFP32});
  checks::dtype(op, "table.sin", table.sin, {DType::kFP32});
  LOCUS_CHECK(x.size(-1) == table.dim, op, ": x has rotary dim ", x.size(-1), " but the table was built for dim ",
              table.dim);
  LOCUS_CHECK(table.cos.size(1) == table.dim / 2 && table.sin.shape() == table.cos.shape(), op,
              ": table cos/sin have shapes ", table.cos.shape_str(), " and ", table.sin.shape_str(), ", expected [P, ",
              table.dim / 2, "]");
  checks::unit_last_stride(op, "table.cos", table.cos);
  checks::unit_last_stride(op, "table.sin", table.sin);
  checks::same_device(op, "positions", positions, "x", x);
  checks::same_device(op, "table.cos", table.cos, "x", x);
  checks::same_device(op, "table.sin", table.sin, "x", x);
  if (x.device().is_cpu()) {
    const int64_t max_pos = table.cos.size(0);
    for (int64_t t = 0; t < positions.size(0); ++t) {
      const int64_t p = cpu::load_index(positions, t);
      LOCUS_CHECK(p >= 0 && p < max_pos, op, ": positions[", t, "] = ", p, " is outside the table's ", max_pos,
                  " positions");
    }
    return cpu::apply_rope(x, positions, table, interleaved, cpu::ThreadPool::from_native(stream.native));
  }
  // Device positions are not read back (that would synchronize every call): the kernel turns the
  // rotary elements of a token whose position is outside the table into NaN.
#if defined(LOCUS_WITH_CUDA)
  cuda::apply_rope(x, positions, table.cos, table.sin, interleaved, stream.native);
#else
  LOCUS_THROW(op, ": tensors are on ", x.device().name(), " but this build has no CUDA backend");
#endif
}

}  // namespace locus::ops
