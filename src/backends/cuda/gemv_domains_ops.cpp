// Tensor-level entry points of the BF16 decode matrix-vector kernel's domain-aware form
// (bf16_gemv.h): the partitioned BF16 GEMM and GEMM + SwiGLU at decode M as one launch, where
// that is faster than the fork/join.
#include <functional>
#include <string>

#include "backends/cuda/bf16_gemv.h"
#include "backends/cuda/cublaslt_matmul.h"  // scratch_alloc
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"  // launch_swiglu
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/domain_table.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/path_choice.h"
#include "core/error.h"

namespace locus::cuda {
namespace {

// Off: the partitioned BF16 GEMMs always fork/join.
detail::EnvToggle g_domains_enabled("LOCUS_BF16_GEMV_DOMAINS", true);

bool on_device_rows(const Tensor& t, int device) {
  return t.defined() && t.device().is_cuda() && t.device().index == device && t.dim() == 2 && t.stride(1) == 1;
}

// What decides which path of the partitioned problem is faster: tokens, K, strides and types,
// the parts' rows and domains, and the domains' SMs (none without a table).
std::string problem_key(const detail::Bf16GemvDomainArgs& a, const int32_t* domain_sms) {
  const detail::Bf16GemvArgs& c = a.common;
  const int bias = c.bias == nullptr ? 0 : c.bias_f32 ? 2 : 1;
  std::string key = str("bf16_gemv_domains:", c.m, 'x', c.k, ':', c.x_ld, ',', c.y_ld, ':', c.y_f32, bias,
                        c.alpha != nullptr, ":d", a.num_domains);
  for (int i = 0; i < a.num_parts; ++i)
    key += str(':', a.parts[i].rows, '@', a.parts[i].domain, ',', a.parts[i].w_ld);
  for (int d = 0; domain_sms != nullptr && d < a.num_domains; ++d) key += str(":sm", domain_sms[d]);
  return key;
}

// The partitioned problem as launch arguments (the device made current); false where the kernel
// does not take it (then the fork/join runs, and reports what is wrong with the operands). With
// swiglu each shard is [gate rows; up rows] of its slice, two parts: gate row r makes column
// n0 + r and up row r column I + n0 + r of the fp32 [M, 2I] product (a.common.y is left for the
// caller to set). *key: the path choice's key (the problem's and the domains' SM counts).
bool domain_args(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y, bool swiglu,
                 const std::vector<DomainSlice>& slices, detail::Bf16GemvDomainArgs* a, std::string* key) {
  if (!detail::bf16_gemv_enabled() || !g_domains_enabled.on() || shards.size() != slices.size() ||
      !detail::gemv_domain_operands(x, y, bias))
    return false;
  const int dev = x.device().index;
  std::vector<int> domain_of;
  std::vector<void*> streams;
  const int per_shard = swiglu ? 2 : 1;
  if (!detail::assign_domains(slices, detail::kGemvMaxParts / per_shard, detail::kGemvMaxDomains, &domain_of,
                              &streams))
    return false;
  detail::Bf16GemvArgs& c = a->common;
  c.x = x.data_ptr();
  c.x_ld = x.stride(0);
  c.bias = bias.defined() ? bias.data_ptr() : nullptr;
  c.bias_f32 = bias.defined() && bias.dtype() == DType::kFP32;
  c.y = y.data_ptr();
  c.y_ld = y.stride(0);
  c.y_f32 = y.dtype() == DType::kFP32;
  c.m = x.size(0);
  c.k = x.size(1);
  a->num_parts = 0;
  for (size_t p = 0; p < slices.size(); ++p) {
    const Tensor& w = shards[p];
    const int64_t cols = slices[p].n1 - slices[p].n0;
    if (!on_device_rows(w, dev) || w.dtype() != DType::kBF16 || w.size(0) != per_shard * cols ||
        w.size(1) != x.size(1))
      return false;
    for (int h = 0; h < per_shard; ++h) {
      const void* rows = static_cast<const uint16_t*>(w.data_ptr()) + h * cols * w.stride(0);
      a->parts[a->num_parts++] = {rows, w.stride(0), cols, h * y.size(1) + slices[p].n0, domain_of[p]};
    }
  }
  use_device(dev);
  const int32_t* domain_sms = nullptr;
  if (streams.size() > 1) {
    const detail::DomainTables& t = detail::domain_tables(streams);
    a->num_domains = static_cast<int32_t>(streams.size());
    a->sm_domain = t.sm_domain;
    domain_sms = t.domain_sms;
  }
  *key = problem_key(*a, domain_sms);
  return detail::bf16_gemv_domains_eligible(*a);
}

}  // namespace

void set_bf16_gemv_domains_enabled(bool on) { g_domains_enabled.set(on); }

bool gemm_partitioned_fastest(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y,
                              const std::vector<DomainSlice>& slices, void* caller,
                              const std::function<void(void*)>& fork_join) {
  detail::Bf16GemvDomainArgs args;
  std::string key;
  if (!domain_args(x, shards, bias, y, false, slices, &args, &key)) return false;
  detail::run_fastest_path(key,
                           {[&](cudaStream_t s) { detail::launch_bf16_gemv_domains(args, s); },
                            [&](cudaStream_t s) { fork_join(s); }},
                           static_cast<cudaStream_t>(caller));
  return true;
}

bool gemm_swiglu_partitioned_fastest(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& y,
                                     const std::vector<DomainSlice>& slices, void* caller,
                                     const std::function<void(void*)>& fork_join) {
  detail::Bf16GemvDomainArgs args;
  std::string key;
  if (!domain_args(x, shards, Tensor(), y, true, slices, &args, &key)) return false;
  const int64_t m = x.size(0), inter = y.size(1);
  // fp32 gate/up sums in stream-ordered scratch, then SwiGLU rounds once into y (as the
  // unpartitioned cuda::gemm_swiglu does).
  auto launch = [&](cudaStream_t s) {
    float* gu = static_cast<float*>(detail::scratch_alloc(static_cast<size_t>(m * 2 * inter) * sizeof(float), s));
    detail::Bf16GemvDomainArgs a = args;
    a.common.y = gu;
    a.common.y_ld = 2 * inter;
    a.common.y_f32 = true;
    detail::launch_bf16_gemv_domains(a, s);
    detail::SwigluArgs sw{gu, gu + inter, 2 * inter, 2 * inter, true, y.data_ptr(), y.stride(0),
                          y.dtype() == DType::kFP32, m, inter};
    detail::launch_swiglu(sw, s);
    detail::scratch_free(gu, s);
  };
  detail::run_fastest_path(key + ":swiglu",
                           {launch, [&](cudaStream_t s) { fork_join(s); }}, static_cast<cudaStream_t>(caller));
  return true;
}

}  // namespace locus::cuda
