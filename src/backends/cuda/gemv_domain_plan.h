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
