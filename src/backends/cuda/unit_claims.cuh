// Internal to the CUDA backend (device code): the units of a domain-aware matrix-vector launch
// claimed by SM rank instead of handed out by counters (GemvDomainPlan::claims).
//
// Unit i of domain d is slot i / n_d of the domain's SM of rank i % n_d (n_d: the domain's SMs).
// A CTA claims a free slot of its SM that has a unit by writing its launch's tag into the unit's
// word (atomicExch: the unit is its own when the word held another tag). Tags differ from launch
// to launch on a stream, so the words are never reset, and a CTA may claim before the previous
// kernel ends: it knows its first unit, and asks for its weights, as early as the one-weight
// kernel does, with no counter's answer to wait for. The tag counts the stream's claiming
// launches: each launch adds one to every word of GemvDomainPlan::arrivals (CTA b to words b,
// b + grid, ...: no two CTAs on one word), so CTA b finds in word b the launches before its own.
// (%gridid would do without the words but repeats on every replay of a CUDA graph.) A CTA lets
// the next kernel launch once its arrival is counted, so the next launch counts after this one.
//
// A unit whose slot no CTA takes (its SM ran fewer of the launch's CTAs) is found by scans: in
// every block each warp reads its share of the words; if some were free, the CTA reads them all
// again after the block (by then the late CTAs of their slots have mostly claimed them) and takes
// the first still free (its own domain's first). A CTA that took no slot scans after its wait. A
// CTA stops after a scan that saw every word taken. Launches use two sets of claim words in turn
// (by their tag's parity), so the next launch's early claims do not touch this one's words; a
// launch two later can only start once the one between has started every CTA, and should it
// still change a word this launch reads, this launch takes that unit again: a block computed
// twice writes the same outputs, and every unit is computed at least once. That a launch has a
// CTA in every slot of every SM keeps this rare: the launch two later finds slots only as this
// one's CTAs leave. (With one CTA a unit instead, it found free slots while this launch ran,
// and the two took each other's units in turn: 4096 x 7168 at one token 9 -> 110 us a call in
// the forty-second session; every output still right.)
#pragma once
#include <cstdint>

#include "backends/cuda/grid_dependency.cuh"  // launch_dependents, wait_for_previous_grid
#include "backends/cuda/unit_queue.cuh"       // sm_id

namespace locus::cuda::detail {

// Warp 0 (converged): this launch's tag, from the arrival words (see above; 64-bit: never 0, the
// claim words' first value, and never repeated). Every lane's additions are done when it returns.
template <class Plan>
__device__ __forceinline__ unsigned long long arrive_for_tag(const Plan& pl) {
  const unsigned lane = threadIdx.x & 31, word = blockIdx.x + lane * gridDim.x;
  unsigned long long before = 0;
  for (unsigned w = word; w < static_cast<unsigned>(pl.arrival_words); w += 32 * gridDim.x) {
    const unsigned long long b = atomicAdd(pl.arrivals + w, 1ull);
    if (w == blockIdx.x) before = b;
  }
  __threadfence();  // the additions performed
  return __shfl_sync(~0u, before, 0) + 1ull;
}

// A scan's shared state: the first free word seen (in the CTA's order, own domain first) and
// whether any was.
struct ClaimScan {
  int best, seen;
  __device__ void reset() {
    best = 0x7fffffff;
    seen = 0;
  }
};

// Word order of a CTA whose home domain's words start at `start`: its own domain's first.
__device__ __forceinline__ int claim_word_at(int idx, int start, int words) {
  const int at = idx + start;
  return at < words ? at : at - words;
}

// The claim words of the launch with tag `tag`: one of two sets, by the tag's parity.
template <class Plan>
__device__ __forceinline__ unsigned long long* claim_words_of(const Plan& pl, unsigned long long tag) {
  return pl.claims + (tag & 1u) * static_cast<unsigned>(pl.claim_stride);
}

// Thread 0: claims a free slot with a unit on the CTA's SM (rank `rank` of `domain`), its grid
// slot's first (blockIdx.x / SMs: the launch has slots_per_sm CTAs an SM). False when none is free.
template <class Plan>
__device__ bool claim_own_slot(const Plan& pl, int domain, int rank, unsigned long long tag, int* unit) {
  const int n = pl.domain_sms[domain], slots = pl.slots_per_sm;
  const int per_slot = max(1, static_cast<int>(gridDim.x) / slots);
  const int hint = min(static_cast<int>(blockIdx.x) / per_slot, slots - 1);
  for (int t = 0; t < slots; ++t) {
    const int j = hint + t < slots ? hint + t : hint + t - slots;
    const int i = j * n + rank;
    if (i >= pl.units[domain]) continue;
    if (atomicExch(claim_words_of(pl, tag) + pl.claim_base[domain] + i, tag) != tag) {
      *unit = i;
      return true;
    }
  }
  return false;
}

// Every thread of the CTA (warps converged): each warp reads its share of the claim words and
// notes the first free one.
template <int kWarps, class Plan>
__device__ __forceinline__ void scan_claim_words(const Plan& pl, const unsigned long long* words, int start,
                                                 unsigned long long tag, ClaimScan& s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int w0 = warp * 32; w0 < pl.claim_words; w0 += kWarps * 32) {
    const int idx = w0 + lane;
    const bool is_free = idx < pl.claim_words && __ldcg(words + claim_word_at(idx, start, pl.claim_words)) != tag;
    const unsigned free_lanes = __ballot_sync(~0u, is_free);
    if (free_lanes != 0u && lane == 0) {
      atomicMin(&s.best, w0 + __ffs(free_lanes) - 1);
      s.seen = 1;
    }
  }
}

// The domain and unit of word `at`.
template <class Plan>
__device__ __forceinline__ void claim_word_unit(const Plan& pl, int num_domains, int at, int* domain, int* unit) {
  int d = 0;
  while (d + 1 < num_domains && at >= pl.claim_base[d + 1]) ++d;
  *domain = d;
  *unit = at - pl.claim_base[d];
}

// Runs body(domain, unit, ahead) for each unit this CTA claims (see the file comment). The body
// waits for the previous kernel before it reads anything that kernel writes, and calls ahead()
// (the scan) once in every thread, after its first weights are asked for. A CTA without a slot of
// its own waits, then scans, before its first unit. `home` and `rank`: the CTA's SM's domain (-1:
// none) and rank in it.
template <int kWarps, class Plan, class Body>
__device__ __forceinline__ void for_each_claimed_unit(const Plan& pl, int num_domains, int home, int rank, Body body) {
  // s_next 1: scan (again) before stopping (the CTA has no slot, a block's scan saw free words,
  // or a claim lost its word to another CTA); 0: stop once no unit is held.
  __shared__ int s_domain, s_unit, s_next;
  __shared__ unsigned long long s_tag;
  __shared__ ClaimScan s_scan;
  const int start = home >= 0 ? pl.claim_base[home] : 0;
  if (threadIdx.x < 32) {
    const unsigned long long tag = arrive_for_tag(pl);
    if (threadIdx.x == 0) {
      launch_dependents();  // this launch's arrivals are all counted once every CTA is here
      s_tag = tag;
      s_domain = home >= 0 && claim_own_slot(pl, home, rank, tag, &s_unit) ? home : -1;
      s_next = 1;  // without a slot: scan once
      s_scan.reset();
    }
  }
  __syncthreads();
  const unsigned long long tag = s_tag;
  unsigned long long* const words = claim_words_of(pl, tag);
  auto ahead = [&] { scan_claim_words<kWarps>(pl, words, start, tag, s_scan); };
  while (true) {
    __syncthreads();  // the unit and a reset scan are published; the previous block's shared memory is read
    const int domain = s_domain, unit = s_unit;
    const bool rescanned = s_next == 1 && domain < 0;  // a scan-only round
    if (domain >= 0) {
      body(domain, unit, ahead);
    } else if (rescanned) {
      wait_for_previous_grid();
      ahead();
    } else {
      break;
    }
    __syncthreads();  // the scan's notes
    if (threadIdx.x == 0) {
      s_domain = -1;
      s_next = 0;
      if (s_scan.seen && !rescanned) {
        s_next = 1;  // look again before taking another slot's unit
      } else if (s_scan.seen) {  // still free: take it; if it was taken meanwhile, scan again
        const int at = claim_word_at(s_scan.best, start, pl.claim_words);
        if (atomicExch(words + at, tag) != tag) claim_word_unit(pl, num_domains, at, &s_domain, &s_unit);
        else s_next = 1;
      }
      s_scan.reset();
    }
  }
}

}  // namespace locus::cuda::detail
