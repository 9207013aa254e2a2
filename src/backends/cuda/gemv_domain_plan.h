// Internal to the CUDA backend: the launch plan of the matrix-vector kernels' domain-aware forms
// (bf16_gemv.h, nvfp4_gemv.h): a partitioned product's shards ("parts", each owned by a domain)
// cut into blocks ("units"), numbered per domain part after part, which persistent CTAs take from
// their SM's domain first through the per-domain counters of unit_queue.cuh.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

namespace locus::cuda::detail {

constexpr int kGemvMaxParts = 8;
constexpr int kGemvMaxDomains = 8;

// Per-launch constants computed on the host; the fields UnitQueue reads come first.
struct GemvDomainPlan {
  unsigned* counters;  // [kGemvMaxDomains], zero between launches
  int32_t units[kGemvMaxDomains];
  int32_t total_ctas, static_first, counted;
  int32_t part_domain[kGemvMaxParts];
  int32_t part_first_unit[kGemvMaxParts];  // the part's first unit among its domain's units
  int32_t part_units[kGemvMaxParts];
  // Units claimed by SM rank (unit_claims.cuh) instead of counted: two sets of claim words from
  // `claims`, claim_stride apart, each with a word per unit, domain after domain from
  // claim_base[d]; nullptr when the counters hand the units out. arrivals: the stream's arrival
  // words (arrival_words of them, at least the launch's CTAs).
  unsigned long long* claims;
  unsigned long long* arrivals;
  int32_t arrival_words, claim_stride;
  int32_t claim_base[kGemvMaxDomains];
  int32_t claim_words, slots_per_sm;
  int32_t domain_sms[kGemvMaxDomains];  // SMs a domain (a unit's SM: unit % domain_sms, its slot unit / domain_sms)
};

// Numbers the units of `num_parts` parts (part p: part_units[p] blocks, owned by part_domain[p])
// per domain and sizes the launch: at most `resident_ctas` CTAs, one per unit. Returns the units.
inline int64_t plan_gemv_domains(const int32_t* part_domain, const int64_t* part_units, int num_parts,
                                 int num_domains, unsigned* counters, int64_t resident_ctas, GemvDomainPlan* pl) {
  *pl = {};
  pl->counters = counters;
  int64_t units = 0;
  for (int p = 0; p < num_parts; ++p) {
    const int d = part_domain[p];
    pl->part_domain[p] = d;
    pl->part_units[p] = static_cast<int32_t>(part_units[p]);
    pl->part_first_unit[p] = pl->units[d];
    pl->units[d] += pl->part_units[p];
    units += part_units[p];
  }
  pl->total_ctas = static_cast<int32_t>(std::min(units, resident_ctas));
  pl->static_first = num_domains == 1 ? 1 : 0;  // then CTA b's first unit is unit b of domain 0
  pl->counted = num_domains > 1 || units > pl->total_ctas ? 1 : 0;
  return units;
}

// Switches `pl` (planned by plan_gemv_domains) to units claimed by SM rank, a launch of
// `slots_per_sm` CTAs on each of `sms` SMs, when every domain's units fit its SMs' slots (each
// domain with units has SMs, at most domain_sms[d] x slots_per_sm units). `words` (the stream's,
// stream_claim_scratch) holds `stride` arrival words, then two sets of `stride` claim words; the
// launch's CTAs and units must fit `stride`. Returns whether it did.
inline bool plan_gemv_claims(const int32_t* domain_sms, int num_domains, int slots_per_sm, int sms,
                             unsigned long long* words, int stride, GemvDomainPlan* pl) {
  if (words == nullptr || domain_sms == nullptr || slots_per_sm < 1 || int64_t{slots_per_sm} * sms > stride)
    return false;
  int32_t units = 0;
  for (int d = 0; d < num_domains; ++d) {
    if (pl->units[d] > 0 && (domain_sms[d] < 1 || pl->units[d] > int64_t{domain_sms[d]} * slots_per_sm)) return false;
    pl->claim_base[d] = units;
    pl->domain_sms[d] = domain_sms[d];
    units += pl->units[d];
  }
  if (units > stride) return false;
  pl->arrivals = words;
  pl->arrival_words = stride;
  pl->claims = words + stride;
  pl->claim_stride = stride;
  pl->claim_words = units;
  pl->slots_per_sm = slots_per_sm;
  pl->total_ctas = slots_per_sm * sms;
  pl->counted = 0;
  pl->static_first = 0;
  return true;
}

// The part that holds unit `unit` of `domain`, and which of its blocks that unit is.
struct GemvUnitPart {
  int part;
  int64_t block;
};
__host__ __device__ inline GemvUnitPart gemv_unit_part(const GemvDomainPlan& pl, int domain, int unit) {
  int p = 0;
  while (pl.part_domain[p] != domain || unit >= pl.part_first_unit[p] + pl.part_units[p]) ++p;
  return {p, unit - pl.part_first_unit[p]};
}

}  // namespace locus::cuda::detail
