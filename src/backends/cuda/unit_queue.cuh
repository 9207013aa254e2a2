// Internal to the CUDA backend (device code): how a persistent CTA of the weight kernels gets its
// work units (per-domain counters, own domain first, then the others'), and the programmatic
// dependent launch controls that let it start while the previous kernel drains.
#pragma once
#include <cstdint>

#include "backends/cuda/grid_dependency.cuh"  // launch_dependents, wait_for_previous_grid
#include "backends/cuda/stream_gemm_rules.h"  // stream_k_unit_of, stream_k_range

namespace locus::cuda::detail {

// Thread 0's source of units: each domain's counter hands out the domain's units in order (after
// the first total_ctas when they were taken statically). A CTA stops once every domain has
// refused it, so in a launch each counter is added to exactly (the units it hands out) +
// total_ctas times, and whoever makes that last addition resets the counter for the next launch:
// no count of departing CTAs at the end. `Plan` is a kernel's launch plan with the fields
// counters, units[], total_ctas, static_first and counted.
template <class Plan>
struct UnitQueue {
  const Plan& pl;
  int num_domains, home;
  unsigned refused = 0;  // bit d: domain d has refused this CTA
  // The first domain, own first, that has not refused this CTA; -1 when none is left.
  __device__ int next_domain() const {
    for (int i = 0; i < num_domains; ++i) {
      const int d = home + i < num_domains ? home + i : home + i - num_domains;
      if (!((refused >> d) & 1u)) return d;
    }
    return -1;
  }
  // Takes the counter value `v` that domain d's counter returned: the unit, or its refusal.
  __device__ bool accept(int d, unsigned v, int* unit) {
    const unsigned statically = pl.static_first ? static_cast<unsigned>(pl.total_ctas) : 0u;
    const unsigned handed = static_cast<unsigned>(pl.units[d]) - statically;
    if (v == handed + static_cast<unsigned>(pl.total_ctas) - 1u) pl.counters[d] = 0;  // the launch's last addition
    if (v < handed) {
      *unit = static_cast<int>(v + statically);
      return true;
    }
    refused |= 1u << d;
    return false;
  }
  // The CTA's first unit: with static_first, unit blockIdx.x of domain 0 without an atomic (a few
  // hundred CTAs adding to one counter at once serialize for about a microsecond); else the
  // counters' first answer.
  __device__ void first(int* domain, int* unit) {
    if (!pl.static_first) return take(domain, unit);
    *domain = 0;
    *unit = static_cast<int>(blockIdx.x);
  }
  // Asks the domains in order until one hands out a unit; domain -1 when none does.
  __device__ void take(int* domain, int* unit) {
    *domain = -1;
    if (!pl.counted) return;
    for (int d; (d = next_domain()) >= 0;)
      if (accept(d, atomicAdd(pl.counters + d, 1u), unit)) {
        *domain = d;
        return;
      }
  }
};

// Runs body(domain, unit, ahead) for each unit this CTA takes from the queue (own domain first);
// body must hold a CTA barrier (thread 0 publishes the next unit after it) and call ahead() once
// in every thread: there thread 0 takes its next unit, asking domain after domain until one hands
// one out, so that the counters' round trips, refusals included, overlap the body. A body calls
// it once its first weights are asked for (its block's after_first hook): thread 0 stalls on each
// answer there, and its warp's first loads are then already in flight. (Asking only its own
// domain there and the others after the body cost each CTA a round trip after its last block: in
// the thirty-seventh session's A/B the partitioned NVFP4 launch ran 0.3-0.9 us faster this way
// on the five larger benchmark shapes at 1 and 8 tokens, the same on the two smallest.)
template <class Plan, class Body>
__device__ __forceinline__ void for_each_unit(const Plan& pl, int num_domains, int home, Body body) {
  // Thread 0's queue state lives in shared memory: nothing of it stays in registers through the
  // body (the weight kernels' bodies need them all).
  __shared__ int s_domain, s_unit, s_next_domain, s_next_unit;
  __shared__ unsigned s_refused;
  if (threadIdx.x == 0) {
    UnitQueue<Plan> q{pl, num_domains, home};
    q.first(&s_domain, &s_unit);
    s_refused = q.refused;
  }
  auto ahead = [&] {
    if (threadIdx.x != 0) return;
    UnitQueue<Plan> q{pl, num_domains, home, s_refused};
    q.take(&s_next_domain, &s_next_unit);
    s_refused = q.refused;
  };
  while (true) {
    __syncthreads();  // the unit is published; the previous unit's shared memory is read
    const int domain = s_domain, unit = s_unit;
    if (domain < 0) break;
    body(domain, unit, ahead);
    if (threadIdx.x == 0) {
      s_domain = s_next_domain;
      s_unit = s_next_unit;
    }
  }
}

// The id of the SM this CTA runs on (%smid).
__device__ __forceinline__ unsigned sm_id() {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  return smid;
}

// The home domain of the SM this CTA runs on: its entry in the %smid -> domain table (nullptr:
// every SM is domain 0); an SM outside every domain spreads over them by its id.
__device__ __forceinline__ int home_domain(const uint8_t* sm_domain, int num_domains, uint8_t no_domain) {
  if (sm_domain == nullptr) return 0;
  const unsigned smid = sm_id();
  const uint8_t d = smid < 1024 ? sm_domain[smid] : no_domain;
  return d < num_domains ? d : static_cast<int>(smid % num_domains);
}

}  // namespace locus::cuda::detail
