#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <vector>

#include "ops/host_readback.h"
#include "ops/softmax_topk.h"

namespace locus::runtime {

void SamplingParams::validate() const {
  LOCUS_CHECK(std::isfinite(temperature) && temperature >= 0.0,
              "sampling: temperature must be a finite value >= 0 (0 = greedy), got ", temperature);
  LOCUS_CHECK(top_k >= 0, "sampling: top_k must be >= 0 (0 = no limit), got ", top_k);
  LOCUS_CHECK(std::isfinite(top_p) && top_p > 0.0 && top_p <= 1.0, "sampling: top_p must lie in (0, 1], got ",
              top_p);
}

std::string SamplingParams::describe() const {
  if (greedy()) return "greedy";
  std::ostringstream os;
  os << "temperature=" << temperature << " top_k=" << top_k << " top_p=" << top_p << " seed=" << seed;
  return os.str();
}

int32_t argmax(const float* logits, int64_t vocab) {
  LOCUS_CHECK(vocab > 0, "argmax: empty logits (vocab = 0)");
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(logits[i])) continue;
    if (best < 0 || logits[i] > logits[best]) best = i;
  }
  LOCUS_CHECK(best >= 0, "argmax: every one of the ", vocab, " logits is NaN");
  return static_cast<int32_t>(best);
}

namespace {

void check_logits_rows(const Tensor& logits) {
  LOCUS_CHECK(logits.defined() && logits.dtype() == DType::kFP32 && logits.dim() == 2 && logits.size(1) > 0,
              "argmax_rows: logits must be fp32 [rows, vocab] with vocab > 0, got ",
              logits.defined() ? logits.describe() : std::string("an undefined tensor"));
}

}  // namespace

void queue_argmax_rows(const Tensor& logits, int32_t* ids, float* values, const Stream& stream) {
  check_logits_rows(logits);
  const int64_t rows = logits.size(0);
  ops::topk(logits, 1, Tensor::from_blob(values, {rows, 1}, DType::kFP32, logits.device()),
            Tensor::from_blob(ids, {rows, 1}, DType::kI32, logits.device()), stream);
}

std::vector<int32_t> argmax_tokens(const int32_t* ids, const float* values, int64_t rows, int64_t vocab) {
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    // topk lets a NaN win only where nothing else is left.
    LOCUS_CHECK(!std::isnan(values[r]), "argmax: every one of the ", vocab, " logits is NaN");
    out[static_cast<size_t>(r)] = ids[r];
  }
  return out;
}

std::vector<int32_t> argmax_rows(const Tensor& logits, const Stream& stream) {
  check_logits_rows(logits);
  // Indices and values in one buffer, so that one copy brings both back.
  const int64_t rows = logits.size(0);
  Tensor both = Tensor::empty({2 * rows}, DType::kI32, logits.device());
  auto* base = static_cast<int32_t*>(both.data_ptr());
  queue_argmax_rows(logits, base, reinterpret_cast<float*>(base + rows), stream);
  ops::HostReadback back(both, stream);
  const Tensor host = back.wait();
  const int32_t* ids = host.data<int32_t>();
  return argmax_tokens(ids, reinterpret_cast<const float*>(ids + rows), rows, logits.size(1));
}

Sampler::Sampler(SamplingParams params) : params_(params), rng_(params.seed) { params_.validate(); }

double Sampler::next_uniform() {
  // 53 random bits -> a double in [0, 1), exactly reproducible.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(const Tensor& logits) {
  LOCUS_CHECK(logits.defined() && logits.device().is_cpu() && logits.dtype() == DType::kFP32 &&
                  logits.dim() == 1 && logits.stride(0) == 1,
              "Sampler::sample: logits must be a CPU fp32 [vocab] tensor with unit stride, got ",
              logits.defined() ? logits.describe() : std::string("an undefined tensor"));
  return sample(logits.data<float>(), logits.size(0));
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.greedy()) return argmax(logits, vocab);
  LOCUS_CHECK(vocab > 0, "Sampler::sample: empty logits (vocab = 0)");

  // Candidates: the non-NaN tokens, most likely first (ties: lower index first).
  std::vector<int32_t> cand;
  cand.reserve(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isnan(logits[i])) cand.push_back(static_cast<int32_t>(i));
  LOCUS_CHECK(!cand.empty(), "Sampler::sample: every one of the ", vocab, " logits is NaN");
  auto more_likely = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const bool need_order = params_.top_k > 0 || params_.top_p < 1.0;
  if (params_.top_k > 0 && params_.top_k < static_cast<int64_t>(cand.size())) {
    std::partial_sort(cand.begin(), cand.begin() + params_.top_k, cand.end(), more_likely);
    cand.resize(static_cast<size_t>(params_.top_k));
  } else if (need_order) {
    std::sort(cand.begin(), cand.end(), more_likely);
  }

  // Softmax over the candidates at the given temperature, in double.
  float max_logit = logits[cand[0]];
  if (!need_order)
    for (int32_t c : cand) max_logit = std::max(max_logit, logits[c]);
  // All -inf, or a +inf logit: the distribution degenerates to the most likely token.
  if (std::isinf(max_logit)) return argmax(logits, vocab);
  std::vector<double> p(cand.size());
  double sum = 0;
  for (size_t i = 0; i < cand.size(); ++i) {
    p[i] = std::exp((static_cast<double>(logits[cand[i]]) - max_logit) / params_.temperature);
    sum += p[i];
  }
  size_t keep = cand.size();
  if (params_.top_p < 1.0) {
    // Smallest prefix whose mass reaches top_p (always at least the most likely token).
    double cum = 0;
    for (size_t i = 0; i < cand.size(); ++i) {
      cum += p[i] / sum;
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  const double target = next_uniform() * sum;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (target < cum) return cand[i];
  }
  return cand[keep - 1];  // rounding at the top end
}

}  // namespace locus::runtime
