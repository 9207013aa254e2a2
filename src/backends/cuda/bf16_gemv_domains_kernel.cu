// The BF16 decode matrix-vector kernel's domain-aware form (bf16_gemv.h): a partitioned GEMM's
// shards in one launch. Persistent CTAs take blocks of rows (the one-weight kernel's blocks,
// bf16_gemv_device.cuh) from their SM's domain first, then from the other domains, through the
// per-domain counters of unit_queue.cuh; each block's outputs go straight into its shard's
// columns of y. So a partitioned decode GEMM costs no fork/join: no second launch, and no join
// behind the slower partition's last CTA.
#include <algorithm>

#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/bf16_gemv_device.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/dependent_launch.h"
#include "backends/cuda/gemv_domain_plan.h"
#include "backends/cuda/stream_gemm.h"         // kNoDomain
#include "backends/cuda/stream_gemm_launch.h"  // resident_ctas_per_sm
#include "backends/cuda/stream_scratch.h"
#include "backends/cuda/unit_queue.cuh"
#include "core/error.h"

namespace locus::cuda::detail {
namespace {

static_assert(kGemvMaxDomains <= 32, "UnitQueue keeps its refusals in a 32-bit mask");

// The rows of unit `unit` of `domain` (which has it), and which block of them it is.
struct UnitRows {
  GemvRows rows;
  int64_t block;
};
__device__ __forceinline__ UnitRows unit_rows(const Bf16GemvDomainArgs& a, const GemvDomainPlan& pl, int domain,
                                              int unit) {
  const GemvUnitPart u = gemv_unit_part(pl, domain, unit);
  const Bf16GemvPart& part = a.parts[u.part];
  return {{static_cast<const uint16_t*>(part.w), part.w_ld, part.rows, part.col0}, u.block};
}

template <int M, int R, int RW>
__global__ void __launch_bounds__(kGemvThreads)
    bf16_gemv_domains_kernel(const __grid_constant__ Bf16GemvDomainArgs a, const __grid_constant__ GemvDomainPlan pl) {
  __shared__ float partial[kGemvWarps][RW][M];
  launch_dependents();
  // Which rows a CTA takes is known only from the counters, which the previous kernel on this
  // stream may still be leaving at zero: nothing is read before it is done.
  wait_for_previous_grid();
  const int home = home_domain(a.sm_domain, a.num_domains, kNoDomain);
  for_each_unit<AheadRequest::kOneDomain>(pl, a.num_domains, home, [&](int domain, int unit, auto ahead) {
    const UnitRows u = unit_rows(a, pl, domain, unit);
    // The next unit is asked for once this block's first weights are.
    gemv_block<M, R, RW>(a.common, u.rows, u.block, partial, ahead);
  });
}

}  // namespace

bool bf16_gemv_domains_eligible(const Bf16GemvDomainArgs& a) {
  if (a.num_parts < 1 || a.num_parts > kGemvMaxParts || a.num_domains < 1 || a.num_domains > kGemvMaxDomains)
    return false;
  for (int i = 0; i < a.num_parts; ++i) {
    const Bf16GemvPart& p = a.parts[i];
    Bf16GemvArgs one = a.common;
    one.w = p.w;
    one.w_ld = p.w_ld;
    one.n = p.rows;
    if (p.domain < 0 || p.domain >= a.num_domains || p.col0 < 0 || !bf16_gemv_eligible(one)) return false;
  }
  return true;
}

void launch_bf16_gemv_domains(const Bf16GemvDomainArgs& a, cudaStream_t stream) {
  LOCUS_CHECK(bf16_gemv_domains_eligible(a), "launch_bf16_gemv_domains: the problem is not eligible");
  int device = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&device));
  const int sms = device_attribute(device, cudaDevAttrMultiProcessorCount);
  const int rw = bf16_gemv_rows_per_warp(a.common.m);
  int64_t rows = 0;
  for (int i = 0; i < a.num_parts; ++i) rows += a.parts[i].rows;
  const int slots = bf16_gemv_slots_per_cta((rows + rw - 1) / rw, a.common.k, sms);
  const int64_t block_rows = static_cast<int64_t>(slots) * rw;
  int32_t part_domain[kGemvMaxParts];
  int64_t part_units[kGemvMaxParts];
  for (int i = 0; i < a.num_parts; ++i) {
    part_domain[i] = a.parts[i].domain;
    part_units[i] = (a.parts[i].rows + block_rows - 1) / block_rows;
  }
  unsigned* counters = stream_scratch(stream, kGemvMaxDomains, 1).counters;
  cudaError_t err = cudaSuccess;
  dispatch_gemv_shape(a.common.m, rw, slots, [&]<int M, int R, int RW>() {
    const void* kernel = reinterpret_cast<const void*>(bf16_gemv_domains_kernel<M, R, RW>);
    const int per_sm = resident_ctas_per_sm(kernel, kernel, kGemvThreads, 0);
    LOCUS_CHECK(per_sm >= 1, "launch_bf16_gemv_domains: no CTA fits an SM");
    GemvDomainPlan pl;
    plan_gemv_domains(part_domain, part_units, a.num_parts, a.num_domains, counters, int64_t{per_sm} * sms, &pl);
    DependentLaunch launch(dim3(pl.total_ctas), dim3(kGemvThreads), 0, stream, small_op_overlap());
    err = cudaLaunchKernelEx(&launch.config, bf16_gemv_domains_kernel<M, R, RW>, a, pl);
  });
  LOCUS_CUDA_CHECK_NAMED(err, "bf16_gemv_domains_kernel launch failed");
}

}  // namespace locus::cuda::detail
