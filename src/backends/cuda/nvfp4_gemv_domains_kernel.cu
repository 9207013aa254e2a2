// The NVFP4 decode matrix-vector kernel's domain-aware form (nvfp4_gemv.h): a partitioned NVFP4
// op's shards in one launch. Persistent CTAs take the one-weight kernel's blocks
// (nvfp4_gemv_device.cuh) from their SM's domain first, then from the other domains: claimed by
// SM rank (unit_claims.cuh) in the forms where that was measured faster, else through the
// per-domain counters of unit_queue.cuh; each block's outputs go straight into its shard's columns
// of y. So a partitioned decode product costs no fork/join: no launch per domain, and no join
// behind the slower domain's last CTA.
#include <algorithm>

#include "backends/cuda/cta_trace.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/gemv_domain_plan.h"
#include "backends/cuda/grid_dependency.cuh"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/nvfp4_gemv_device.cuh"
#include "backends/cuda/stream_gemm.h"         // kNoDomain
#include "backends/cuda/stream_gemm_launch.h"  // resident_ctas_per_sm
#include "backends/cuda/stream_scratch.h"  // stream_scratch, sm_count_for
#include "backends/cuda/unit_claims.cuh"
#include "backends/cuda/unit_queue.cuh"
#include "core/error.h"

namespace locus::cuda::detail {
namespace {

static_assert(kGemvMaxDomains <= 32, "UnitQueue keeps its refusals in a 32-bit mask");

// Off ("0"): the launch's CTAs always take their blocks from the counters.
EnvToggle g_claims{"LOCUS_NVFP4_GEMV_CLAIMS", true};

// The block forms whose CTAs claim their blocks by SM rank (unit_claims.cuh) where the blocks fit
// the CTA slots: one block of tokens (1-8), two tiles a warp, no SwiGLU. Thirty-ninth session,
// H100, partitioned op against counted blocks: 4096 x 7168 at 1 and 8 tokens 11.0 -> 9.0-9.1 us
// (0.74 -> 0.90-0.91 of unpartitioned), 32768 x 512 and 7168 x 2048 0.3 us faster, the other
// shapes of these forms within 0.2 us; the one-tile forms (3 CTAs an SM: 18432 x 7168, 24576 x
// 1536) were 0.2-0.5 us slower claimed and 16 tokens mixed (0.2 us faster to 0.3 us slower), so
// they keep the counters.
constexpr bool nvfp4_gemv_claimed_form(int mb, int tw, bool swiglu) { return mb == 1 && tw == 2 && !swiglu; }
template <int MB, int TW, bool SWIGLU>
constexpr bool kClaimedForm = nvfp4_gemv_claimed_form(MB, TW, SWIGLU);

template <int MB, int TW, int W, bool SWIGLU, bool CLAIMED>
__global__ void __launch_bounds__(kNvfp4GemvThreads, nvfp4_gemv_resident_ctas(MB, TW))
    nvfp4_gemv_domains_kernel(const __grid_constant__ Nvfp4GemvDomainArgs a, const __grid_constant__ GemvDomainPlan pl) {
  __shared__ Nvfp4GemvPartials<MB, TW> partial;
  const Nvfp4GemvArgs& c = a.common;
  __shared__ unsigned long long* s_trace;  // thread 0's timeline record (Nvfp4GemvArgs::trace)
  if (threadIdx.x == 0) s_trace = open_trace_record(c.trace, kGemvTraceWords);
  // One block of unit `unit` of `domain`; `after_first` runs once its first weights are asked for.
  auto run_block = [&](int domain, int unit, auto after_first) {
    if (threadIdx.x == 0) stamp_once(s_trace, kGemvTraceUnit);
    const GemvUnitPart u = gemv_unit_part(pl, domain, unit);
    const Nvfp4GemvPart& p = a.parts[u.part];
    const Nvfp4GemvProblem pr{p.codes, p.scales, p.global_scale, c.x, c.x_ld, static_cast<int>(c.m), p.n, p.col0, p.col0};
    nvfp4_gemv_block<MB, TW, W, SWIGLU, false>(c, pr, u.block, partial, after_first);
    if (threadIdx.x == 0) stamp(s_trace, kGemvTraceBody);
  };
  if constexpr (CLAIMED) {
    // The CTA's SM's slot is claimed and its weights asked for before the wait (unit_claims.cuh).
    const unsigned smid = sm_id();
    const int d = smid < 1024 ? a.sm_domain[smid] : kNoDomain;
    const int home = d < a.num_domains ? d : -1;
    const int rank = home >= 0 ? a.sm_rank[smid] : 0;
    for_each_claimed_unit<kNvfp4GemvWarps>(pl, a.num_domains, home < 0 || rank < pl.domain_sms[home] ? home : -1,
                                           rank, [&](int domain, int unit, auto ahead) {
                                             run_block(domain, unit, [&] {
                                               wait_for_previous_grid();
                                               if (threadIdx.x == 0) stamp_once(s_trace, kGemvTraceWaited);
                                               ahead();
                                             });
                                           });
  } else {
    launch_dependents();
    // Which blocks a CTA takes is known only from the counters, which the previous kernel on this
    // stream may still be leaving at zero: nothing is read before it is done.
    wait_for_previous_grid();
    if (threadIdx.x == 0) stamp(s_trace, kGemvTraceWaited);
    const int home = home_domain(a.sm_domain, a.num_domains, kNoDomain);
    // The next unit is asked for once this block's first weights are.
    for_each_unit<AheadRequest::kUntilAnswered>(pl, a.num_domains, home, run_block);
  }
  if (threadIdx.x == 0) {  // a CTA that took no block: its unit and body words are its exit
    stamp_once(s_trace, kGemvTraceWaited);
    stamp_once(s_trace, kGemvTraceUnit);
    stamp_once(s_trace, kGemvTraceBody);
    stamp(s_trace, kGemvTraceExit);
  }
}

// Part p as a product of its own (for the eligibility and block rules).
Nvfp4GemvArgs part_args(const Nvfp4GemvDomainArgs& a, int p) {
  Nvfp4GemvArgs one = a.common;
  one.codes = a.parts[p].codes;
  one.scales = a.parts[p].scales;
  one.global_scale = a.parts[p].global_scale;
  one.n = a.parts[p].n;
  one.num_indexed = 0;
  return one;
}

}  // namespace

bool nvfp4_gemv_domains_eligible(const Nvfp4GemvDomainArgs& a) {
  if (a.num_parts < 1 || a.num_parts > kGemvMaxParts || a.num_domains < 1 || a.num_domains > kGemvMaxDomains ||
      a.common.num_indexed != 0)
    return false;
  for (int i = 0; i < a.num_parts; ++i) {
    const Nvfp4GemvPart& p = a.parts[i];
    if (p.domain < 0 || p.domain >= a.num_domains || p.col0 < 0 || !nvfp4_gemv_eligible(part_args(a, i))) return false;
  }
  return true;
}

Nvfp4GemvShape nvfp4_gemv_domains_shape(const Nvfp4GemvDomainArgs& a, int sms) {
  Nvfp4GemvArgs all = a.common;
  all.n = 0;
  for (int i = 0; i < a.num_parts; ++i) all.n += a.parts[i].n;
  all.num_indexed = 0;
  return nvfp4_gemv_shape(all, sms, /*allow_lean=*/false);
}

void set_nvfp4_gemv_claims(int on) { g_claims.set_or_reset(on); }

void launch_nvfp4_gemv_domains(const Nvfp4GemvDomainArgs& a, cudaStream_t stream, bool* claims) {
  LOCUS_CHECK(nvfp4_gemv_domains_eligible(a), "launch_nvfp4_gemv_domains: the problem is not eligible");
  const int sms = sm_count_for(stream);
  const Nvfp4GemvShape shape = nvfp4_gemv_domains_shape(a, sms);
  int32_t part_domain[kGemvMaxParts];
  int64_t part_units[kGemvMaxParts];
  for (int i = 0; i < a.num_parts; ++i) {
    part_domain[i] = a.parts[i].domain;
    part_units[i] = nvfp4_gemv_blocks(part_args(a, i), shape);
  }
  // A launch that may claim takes the counters and the claim words in one lookup (the claim words
  // are allocated at a stream's first such launch); the others take the counters only.
  const bool may_claim = g_claims.on() && a.sm_domain != nullptr && a.sm_rank != nullptr &&
                         nvfp4_gemv_claimed_form(nvfp4_gemv_token_blocks(a.common), shape.tiles_per_warp,
                                                 a.common.swiglu);
  const StreamScratch scratch =
      may_claim ? stream_claim_scratch(stream, kGemvMaxDomains, sms) : stream_scratch(stream, kGemvMaxDomains, 0);
  unsigned* counters = scratch.counters;
  cudaError_t err = cudaSuccess;
  dispatch_nvfp4_gemv_shape(
      nvfp4_gemv_token_blocks(a.common), shape.tiles_per_warp, shape.warps_per_slot, a.common.swiglu, false,
      [&]<int MB, int TW, int W, bool SW, bool LEAN>() {
        if constexpr (LEAN) return;  // not dispatched: the domain-aware kernel has no lean form
        auto ctas_per_sm = [](const void* kernel) {
          const int per_sm = resident_ctas_per_sm(kernel, kernel, kNvfp4GemvThreads, 0);
          LOCUS_CHECK(per_sm >= 1, "launch_nvfp4_gemv_domains: no CTA fits an SM");
          return per_sm;
        };
        const int per_sm = ctas_per_sm(reinterpret_cast<const void*>(nvfp4_gemv_domains_kernel<MB, TW, W, SW, false>));
        GemvDomainPlan pl;
        plan_gemv_domains(part_domain, part_units, a.num_parts, a.num_domains, counters, int64_t{per_sm} * sms, &pl);
        DependentLaunch launch(dim3(pl.total_ctas), dim3(kNvfp4GemvThreads), 0, stream, small_op_overlap());
        if constexpr (kClaimedForm<MB, TW, SW>) {
          const auto claimed = nvfp4_gemv_domains_kernel<MB, TW, W, SW, true>;
          if (may_claim &&
              plan_gemv_claims(a.domain_sms, a.num_domains, ctas_per_sm(reinterpret_cast<const void*>(claimed)), sms,
                               scratch.claim_words, kClaimWordsPerSm * sms, &pl)) {
            launch.config.gridDim = dim3(pl.total_ctas);
            err = cudaLaunchKernelEx(&launch.config, claimed, a, pl);
            if (claims != nullptr) *claims = true;
            return;
          }
        }
        err = cudaLaunchKernelEx(&launch.config, nvfp4_gemv_domains_kernel<MB, TW, W, SW, false>, a, pl);
        if (claims != nullptr) *claims = false;
      });
  LOCUS_CUDA_CHECK_NAMED(err, "nvfp4_gemv_domains_kernel launch failed");
}

}  // namespace locus::cuda::detail
