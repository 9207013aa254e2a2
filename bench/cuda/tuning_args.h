// The device benchmarks' kernel-knob options; fields left out keep their defaults:
//   --bmm-tuning S[,R[,P[,L[,C[,E[,B]]]]]]  the TMA BMM (BmmTmaTuning): units per head, ring
//                                      slots, dependent launch 1/0, L2 fetch bytes 0/128/256, CTAs
//                                      per SM unpartitioned, slots copied early, ring sized to
//                                      leave room for the next launch 1/0 (-1: where the launch
//                                      spans several domains);
//   --tuning U,W[,S[,P[,F[,T]]]]       the streaming GEMM (StreamGemmTuning): units per CTA, warps
//                                      per CTA, ring depth, dependent launch 1/0, KB asked of L2
//                                      before the previous kernel ends, feed (0 cp.async rings,
//                                      1 TMA producer).
#pragma once
#include <cstdio>
#include <string>

#include "backends/cuda/bmm_tma.h"
#include "backends/cuda/stream_gemm.h"

namespace locus::bench {

constexpr const char* kBmmTuningHelp =
    "S[,R[,P[,L[,C[,E[,B]]]]]] (units per head, ring slots, dependent launch 1/0, L2 fetch bytes 0/128/256, CTAs per "
    "SM unpartitioned, slots copied early, room for the next launch 1/0/-1 (-1: over several domains))";

// False (after saying why on stderr) when `arg` is not of that form.
inline bool parse_bmm_tuning(const std::string& arg, cuda::detail::BmmTmaTuning* t) {
  if (std::sscanf(arg.c_str(), "%d,%d,%d,%d,%d,%d,%d", &t->splits, &t->slots, &t->dependent_launch, &t->l2_promotion,
                  &t->ctas_per_sm, &t->early_copy, &t->beside_next) >= 1)
    return true;
  std::fprintf(stderr, "--bmm-tuning must be %s, got '%s'\n", kBmmTuningHelp, arg.c_str());
  return false;
}

constexpr const char* kStreamTuningHelp =
    "U,W[,S[,P[,F[,T]]]] (units per CTA, warps per CTA (TMA feed: consumer warps, 8 or 16), ring depth, dependent "
    "launch, KB prefetched early, feed 0 cp.async / 1 TMA)";

// False (after saying why on stderr) when `arg` is not of that form.
inline bool parse_stream_tuning(const std::string& arg, cuda::detail::StreamGemmTuning* t) {
  if (std::sscanf(arg.c_str(), "%d,%d,%d,%d,%d,%d", &t->units_per_cta, &t->warps, &t->stages, &t->dependent_launch,
                  &t->prefetch_kb, &t->feed) >= 2)
    return true;
  std::fprintf(stderr, "--tuning must be %s, got '%s'\n", kStreamTuningHelp, arg.c_str());
  return false;
}

}  // namespace locus::bench
