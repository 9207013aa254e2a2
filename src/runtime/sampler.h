// Token sampler over one row of fp32 logits: greedy, temperature, top-k and top-p (nucleus),
// seeded. The random stream is std::mt19937_64 turned into uniform doubles by a fixed formula
// (not std::uniform_real_distribution, whose output differs between standard libraries), so the
// same seed gives the same tokens everywhere.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"

namespace locus::runtime {

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy (argmax); > 0 divides the logits before the softmax
  int64_t top_k = 0;         // 0 = no limit; 1 = greedy
  double top_p = 1.0;        // keep the smallest set of most likely tokens whose mass >= top_p, in (0, 1]
  uint64_t seed = 0;

  bool greedy() const { return temperature == 0.0 || top_k == 1; }
  // Throws an Error naming the bad field (negative temperature, top_p outside (0, 1], ...).
  void validate() const;
  std::string describe() const;  // "greedy" or "temperature=0.7 top_k=50 top_p=0.9 seed=1"
};

// Index of the largest logit; ties pick the lower index; NaN never wins. Throws when every
// logit is NaN or vocab is 0.
int32_t argmax(const float* logits, int64_t vocab);

// argmax() of every row of fp32 logits [rows, vocab] on any device, found where the logits lie
// (ops::topk with k = 1), so that only the winners' indices and values come back to the host: a
// greedy decode step then copies a few bytes per sequence instead of its whole logits row. The
// same tokens as argmax() row by row, and the same error for a row that is all NaN.
std::vector<int32_t> argmax_rows(const Tensor& logits, const Stream& stream = {});
// argmax_rows in two halves, for callers that keep the winners on the device (DecodeGraphs):
// queues the top-1 of each row of `logits` into `ids` and `values` (rows elements each, memory
// of the logits' device); then, from their host copies, the tokens and the same error for a row
// that is all NaN.
void queue_argmax_rows(const Tensor& logits, int32_t* ids, float* values, const Stream& stream = {});
std::vector<int32_t> argmax_tokens(const int32_t* ids, const float* values, int64_t rows, int64_t vocab);

class Sampler {
 public:
  explicit Sampler(SamplingParams params);  // validates params
  const SamplingParams& params() const { return params_; }

  // Draws one token id from logits[0, vocab). NaN logits are treated as impossible tokens.
  int32_t sample(const float* logits, int64_t vocab);
  // logits: a CPU fp32 tensor of shape [vocab] (unit stride).
  int32_t sample(const Tensor& logits);

 private:
  double next_uniform();  // in [0, 1)

  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace locus::runtime
