// Tensor-level entry points of the TMA-fed BMM (bmm_tma.h): the unpartitioned op and its
// single-launch locality-domain form.
#include <functional>
#include <string>

#include "backends/cuda/bmm_tma.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/domain_table.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/path_choice.h"
#include "core/error.h"

namespace locus::cuda {
namespace {

using detail::BmmTmaArgs;
using detail::BmmTmaPart;

// Off: cuBLASLt takes every BMM.
detail::EnvToggle g_enabled("LOCUS_BMM_TMA", true);

bool enabled() { return g_enabled.on(); }

// x = a [B, M, K] and y [B, M, N] (both with stride(2) == 1, as cuda::bmm checks).
BmmTmaArgs base_args(const Tensor& a, const Tensor& y) {
  BmmTmaArgs args;
  args.x = a.data<uint16_t>();
  args.x_head_stride = a.stride(0);
  args.x_row_stride = a.stride(1);
  args.y = y.data_ptr();
  args.y_head_stride = y.stride(0);
  args.y_row_stride = y.stride(1);
  args.y_f32 = y.dtype() == DType::kFP32;
  args.m = static_cast<int32_t>(a.size(1));
  args.k = static_cast<int32_t>(a.size(2));
  args.n = static_cast<int32_t>(y.size(2));
  return args;
}

// Part p: weights b [heads, K, N], row-major (stride(2) == 1: stored [K, N]) or a transposed view
// of [heads, N, K] (stride(1) == 1), for heads from h0 on. False when b is neither, or not laid out
// like the parts before it.
bool add_part(BmmTmaArgs* args, const Tensor& b, int64_t h0, int domain) {
  if (b.dtype() != DType::kBF16 || b.dim() != 3 || b.size(1) != args->k || b.size(2) != args->n) return false;
  const bool n_contiguous = b.stride(2) == 1;
  if (!n_contiguous && b.stride(1) != 1) return false;
  if (args->num_parts > 0 && n_contiguous != args->n_contiguous) return false;
  if (args->num_parts == detail::kBmmTmaMaxParts) return false;
  args->n_contiguous = n_contiguous;
  BmmTmaPart& p = args->parts[args->num_parts++];
  p.w = b.data_ptr();
  p.w_head_stride = b.stride(0);
  p.w_row_stride = n_contiguous ? b.stride(1) : b.stride(2);
  p.heads = static_cast<int32_t>(b.size(0));
  p.head0 = static_cast<int32_t>(h0);
  p.domain = domain;
  return true;
}

// The partitioned problem as launch arguments (the device made current); false when its shards
// are not laid out for the kernel. Whether the kernel takes it is try_launch_bmm_tma's to say.
bool domain_args(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                 const std::vector<DomainSlice>& slices, BmmTmaArgs* args) {
  if (!enabled() || b_shards.size() != slices.size()) return false;
  std::vector<int> domain_of;
  std::vector<void*> streams;
  if (!detail::assign_domains(slices, detail::kBmmTmaMaxParts, detail::kBmmTmaMaxDomains, &domain_of, &streams))
    return false;
  *args = base_args(a, y);
  for (size_t p = 0; p < slices.size(); ++p)
    if (!add_part(args, b_shards[p], slices[p].n0, domain_of[p])) return false;
  use_device(a.device().index);
  if (streams.size() > 1) {
    const detail::DomainTables& t = detail::domain_tables(streams);
    args->num_domains = static_cast<int32_t>(streams.size());
    args->sm_domain = t.sm_domain;
    args->sm_rank = t.sm_rank;
    for (int d = 0; d < args->num_domains; ++d) args->domain_sms[d] = t.domain_sms[d];
  }
  return true;
}

// What decides the partitioned BMM's speed: shapes, layouts, strides, dtypes, the parts' heads and
// domains, and the domains' SMs.
std::string problem_key(const BmmTmaArgs& args) {
  std::string key = str("bmm_domains:", args.m, 'x', args.n, 'x', args.k, ':', args.n_contiguous, args.y_f32, ':',
                        args.x_head_stride, ',', args.x_row_stride, ',', args.y_head_stride, ',', args.y_row_stride);
  for (int p = 0; p < args.num_parts; ++p) {
    const BmmTmaPart& part = args.parts[p];
    key += str(':', part.head0, '+', part.heads, '@', part.domain, ',', part.w_head_stride, ',', part.w_row_stride);
  }
  for (int d = 0; d < args.num_domains; ++d) key += str(":sm", args.domain_sms[d]);
  return key;
}

}  // namespace

void set_bmm_tma_enabled(bool on) { g_enabled.set(on); }

bool bmm_tma(const Tensor& a, const Tensor& b, const Tensor& y, void* stream) {
  if (!enabled()) return false;
  BmmTmaArgs args = base_args(a, y);
  if (!add_part(&args, b, 0, 0)) return false;
  use_device(a.device().index);
  return detail::try_launch_bmm_tma(args, static_cast<cudaStream_t>(stream));
}

bool bmm_tma_domains(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                     const std::vector<DomainSlice>& slices, void* caller) {
  BmmTmaArgs args;
  return domain_args(a, b_shards, y, slices, &args) && detail::try_launch_bmm_tma(args, static_cast<cudaStream_t>(caller));
}

bool bmm_partitioned_fastest(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                             const std::vector<DomainSlice>& slices, void* caller,
                             const std::function<void(void*)>& fork_join) {
  BmmTmaArgs args;
  if (!domain_args(a, b_shards, y, slices, &args) || !detail::bmm_tma_eligible(args)) return false;
  const auto stream = static_cast<cudaStream_t>(caller);
  detail::run_fastest_path(problem_key(args),
                           {[&](cudaStream_t s) { detail::launch_bmm_tma(args, s); },
                            [&](cudaStream_t s) { fork_join(s); }},
                           stream);
  return true;
}

}  // namespace locus::cuda
