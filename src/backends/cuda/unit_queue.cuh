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

// How ahead() asks for a CTA's next unit (for_each_unit).
enum class AheadRequest {
  // Its own domain (the first that has not refused it) only: nothing in the block depends on the
  // answer, which is taken after the body, and a refusal is followed by the other domains there.
  // For CTAs that take many short blocks (the BF16 matrix-vector kernel's).
  kOneDomain,
  // Domain after domain until one hands a unit out: each request depends on the answer before, so
  // thread 0 (and its warp) waits for them inside the block, and a CTA whose domain has run out
  // learns it there instead of in a round trip after its last block. For CTAs that take few long
  // blocks (the NVFP4 matrix-vector kernel's). Thirty-seventh session, H100: the partitioned NVFP4
  // launch 0.3-0.9 us faster than with kOneDomain on the five larger benchmark shapes at 1 and 8
  // tokens, the same on the two smallest; the BF16 launch 3-7 us slower (likely the wait, in each
  // of its many short blocks).
  kUntilAnswered,
};

// Runs body(domain, unit, ahead) for each unit this CTA takes from the queue (own domain first);
// body must hold a CTA barrier (thread 0 publishes the next unit after it) and call ahead() once
// in every thread: there thread 0 asks for its next unit (as kRequest says), so that the
// counters' round trips overlap the body. A body calls it once its first weights are asked for
// (its block's after_first hook), so its warp's first loads are already in flight.
template <AheadRequest kRequest, class Plan, class Body>
__device__ __forceinline__ void for_each_unit(const Plan& pl, int num_domains, int home, Body body) {
  // Thread 0's queue state lives in shared memory: nothing of it stays in registers through the
  // body (the weight kernels' bodies need them all).
  __shared__ int s_domain, s_unit, s_ahead;   // s_ahead: kOneDomain, the domain asked (-1: none)
  __shared__ unsigned s_got, s_refused;       // s_got: kOneDomain, its counter's answer
  __shared__ int s_next_domain, s_next_unit;  // kUntilAnswered: the unit taken (domain -1: none)
  if (threadIdx.x == 0) {
    UnitQueue<Plan> q{pl, num_domains, home};
    q.first(&s_domain, &s_unit);
    s_refused = q.refused;
  }
  auto ahead = [&] {
    if (threadIdx.x != 0) return;
    UnitQueue<Plan> q{pl, num_domains, home, s_refused};
    if constexpr (kRequest == AheadRequest::kUntilAnswered) {
      q.take(&s_next_domain, &s_next_unit);
      s_refused = q.refused;
    } else {
      s_ahead = pl.counted ? q.next_domain() : -1;
      if (s_ahead >= 0) s_got = atomicAdd(pl.counters + s_ahead, 1u);
    }
  };
  while (true) {
    __syncthreads();  // the unit is published; the previous unit's shared memory is read
    const int domain = s_domain, unit = s_unit;
    if (domain < 0) break;
    body(domain, unit, ahead);
    if (threadIdx.x == 0) {
      if constexpr (kRequest == AheadRequest::kUntilAnswered) {
        s_domain = s_next_domain;
        s_unit = s_next_unit;
      } else {
        UnitQueue<Plan> q{pl, num_domains, home, s_refused};
        s_domain = -1;
        if (s_ahead >= 0 && q.accept(s_ahead, s_got, &s_unit)) s_domain = s_ahead;
        else q.take(&s_domain, &s_unit);
        s_refused = q.refused;
      }
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
