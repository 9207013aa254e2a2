// The NVFP4 matrix-vector kernel (nvfp4_gemv.h) as one of the timed paths of an NVFP4 op, beside
// the op's streaming-kernel launch.
#include <atomic>

#include "backends/cuda/cuda_ops.h"  // nvfp4_global_scale_device
#include "backends/cuda/domain_table.h"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/path_choice.h"
#include "core/tensor.h"
#include "ops/nvfp4.h"

namespace locus::cuda::detail {

namespace {
std::atomic<bool> g_always{false};
std::atomic<Nvfp4PartitionedPath> g_partitioned{Nvfp4PartitionedPath::kTimed};
}  // namespace

Nvfp4GemvArgs nvfp4_gemv_args(const Tensor& x, const ops::Nvfp4Weight& w, const Tensor& bias, const Tensor& y,
                              bool swiglu) {
  Nvfp4GemvArgs a;
  a.x = x.data<uint16_t>();
  a.x_ld = x.stride(0);
  a.codes = w.packed.data<uint8_t>();
  a.scales = w.scales.data<uint16_t>();
  a.global_scale = nvfp4_global_scale_device(w);
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.bias_f32 = bias.defined() && bias.dtype() == DType::kFP32;
  a.swiglu = swiglu;
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.y_f32 = y.dtype() == DType::kFP32;
  a.m = x.size(0);
  a.n = y.size(1);
  a.k = x.size(1);
  return a;
}

bool nvfp4_gemv_domain_args(const Tensor& x, const std::vector<ops::Nvfp4Weight>& shards, const Tensor& bias,
                            const Tensor& y, bool swiglu, const std::vector<DomainSlice>& slices,
                            Nvfp4GemvDomainArgs* a) {
  std::vector<int> domain_of;
  std::vector<void*> streams;
  if (!gemv_domain_operands(x, y, bias) || shards.empty() || shards.size() != slices.size() ||
      !assign_domains(slices, kGemvMaxParts, kGemvMaxDomains, &domain_of, &streams))
    return false;
  a->common = nvfp4_gemv_args(x, shards[0], bias, y, swiglu);
  a->num_parts = static_cast<int32_t>(shards.size());
  for (size_t p = 0; p < shards.size(); ++p) {
    const ops::Nvfp4Weight& w = shards[p];
    const int64_t cols = slices[p].n1 - slices[p].n0;
    if (w.layout != ops::Nvfp4Layout::kCudaTiled || w.packed.device() != x.device() ||
        w.n != (swiglu ? 2 : 1) * cols || w.k != x.size(1) || slices[p].n0 < 0 || slices[p].n1 > y.size(1))
      return false;
    a->parts[p] = {w.packed.data<uint8_t>(), w.scales.data<uint16_t>(), nvfp4_global_scale_device(w), cols,
                   slices[p].n0, domain_of[p]};
  }
  if (streams.size() > 1) {
    const DomainTables& t = domain_tables(streams);
    a->num_domains = static_cast<int32_t>(streams.size());
    a->sm_domain = t.sm_domain;
    a->sm_rank = t.sm_rank;
    for (int d = 0; d < a->num_domains; ++d) a->domain_sms[d] = t.domain_sms[d];
  }
  return nvfp4_gemv_domains_eligible(*a);
}

void set_nvfp4_gemv_always(bool on) { g_always.store(on); }
bool nvfp4_gemv_always() { return g_always.load(); }

void set_nvfp4_partitioned_path(Nvfp4PartitionedPath path) { g_partitioned.store(path); }
Nvfp4PartitionedPath nvfp4_partitioned_path() { return g_partitioned.load(); }

void run_nvfp4_gemv_fastest(const Nvfp4GemvArgs& a, const PathCall& streaming, cudaStream_t stream) {
  if (g_always.load()) {
    launch_nvfp4_gemv(a, stream);
    return;
  }
  run_fastest_path(nvfp4_gemv_problem_key(a, stream),
                   {streaming, [&a](cudaStream_t s) { launch_nvfp4_gemv(a, s); }}, stream);
}

}  // namespace locus::cuda::detail
