// Rotary position embedding with optional YaRN scaling (DeepSeek-V3 / Hugging Face semantics).
#pragma once
#include "core/stream.h"
#include "core/tensor.h"

namespace locus::ops {

struct RopeConfig {
  int64_t dim = 64;          // rotary dims (qk_rope_head_dim)
  double theta = 10000.0;
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position = 4096;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

struct RopeTable {
  Tensor cos, sin;            // fp32 [max_positions, dim / 2], already multiplied by the YaRN cos/sin mscale
  // YaRN mscale(factor, mscale_all_dim) (1 when mscale_all_dim is 0 or YaRN is off). As in
  // transformers' DeepseekV3Attention the softmax scale is qk_head_dim^-0.5 * softmax_mscale^2.
  double softmax_mscale = 1;
  int64_t dim = 0;
};

RopeTable make_rope_table(const RopeConfig& cfg, int64_t max_positions);

// In place on x [T, H, dim] or [T, dim] (last dim unit stride; any other strides), positions
// i32/i64 [T] within the table; positions and table on x's device. fp32 math, one rounding per
// element. On the CPU a position outside the table throws naming it. On CUDA the positions are
// never read back to the host (that would synchronize every call): a token whose position is
// outside the table gets NaN in all its rotary elements (every head), and nothing outside the
// table is read.
// interleaved = true rotates pairs (2i, 2i+1) (DeepSeek MLA); false rotates (i, i + dim/2).
void apply_rope(const Tensor& x, const Tensor& positions, const RopeTable& table, bool interleaved,
                const Stream& stream = {});

}  // namespace locus::ops
