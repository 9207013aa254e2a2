// Causal split-score attention on the CPU: for each (token, head) pair, fp32 scores over the
// visible keys in key order, a max-subtracted softmax and the weighted sum of the values.
// Every pair is computed by one thread in a fixed order, so the result does not depend on the
// thread count.
#include "backends/cpu/attention.h"

#include <cmath>
#include <vector>

#include "core/float_convert.h"

namespace locus::cpu {
namespace {

// Reads n elements of a bf16 or fp32 row (unit stride) as floats.
void load_row(const Tensor& t, int64_t elem_offset, int64_t n, float* out) {
  if (t.dtype() == DType::kFP32) {
    const float* p = t.data<float>() + elem_offset;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const uint16_t* p = t.data<uint16_t>() + elem_offset;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(p[i]);
  }
}

// Element offset of row (i, h) of a [N, H, D] view; a one-head view ignores h.
int64_t row_offset(const Tensor& t, int64_t i, int64_t h) {
  const int64_t hh = t.size(1) == 1 ? 0 : h;
  return i * t.stride(0) + hh * t.stride(1);
}

}  // namespace

void mla_attention(const Tensor& q_a, const Tensor& q_b, const Tensor& k_a, const Tensor& k_b, const Tensor& v,
                   const Tensor& out, float scale, int64_t q_start, ThreadPool& pool) {
  const int64_t T = q_a.size(0), H = q_a.size(1), Da = q_a.size(2), Db = q_b.size(2), Dv = v.size(2);
  pool.parallel_for(T * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qa(Da), qb(Db), ka(Da), kb(Db), vv(Dv), acc(Dv), scores;
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t t = idx / H, h = idx % H;
      const int64_t visible = q_start + t + 1;
      load_row(q_a, row_offset(q_a, t, h), Da, qa.data());
      load_row(q_b, row_offset(q_b, t, h), Db, qb.data());
      scores.resize(visible);
      float mx = -INFINITY;
      for (int64_t s = 0; s < visible; ++s) {
        load_row(k_a, row_offset(k_a, s, h), Da, ka.data());
        load_row(k_b, row_offset(k_b, s, h), Db, kb.data());
        float dot = 0.f;
        for (int64_t d = 0; d < Da; ++d) dot += qa[d] * ka[d];
        float dot_b = 0.f;
        for (int64_t d = 0; d < Db; ++d) dot_b += qb[d] * kb[d];
        const float sc = (dot + dot_b) * scale;
        scores[s] = sc;
        if (sc > mx) mx = sc;
      }
      float sum = 0.f;
      for (int64_t s = 0; s < visible; ++s) {
        scores[s] = std::exp(scores[s] - mx);
        sum += scores[s];
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t s = 0; s < visible; ++s) {
        load_row(v, row_offset(v, s, h), Dv, vv.data());
        const float p = scores[s];
        for (int64_t d = 0; d < Dv; ++d) acc[d] += p * vv[d];
      }
      const float inv = 1.f / sum;
      const int64_t o = t * out.stride(0) + h * out.stride(1);
      if (out.dtype() == DType::kFP32) {
        float* po = out.data<float>() + o;
        for (int64_t d = 0; d < Dv; ++d) po[d] = acc[d] * inv;
      } else {
        uint16_t* po = out.data<uint16_t>() + o;
        for (int64_t d = 0; d < Dv; ++d) po[d] = f32_to_bf16_bits(acc[d] * inv);
      }
    }
  });
}

}  // namespace locus::cpu
