// MoE routing ops on CUDA (cuda_moe_ops.h): operands come validated from ops/moe_routing.cpp;
// this file checks the kernels' own limits, fills the launch arguments (moe_kernels.h) and
// launches on the caller's stream.
#include "backends/cuda/cuda_moe_ops.h"

#include <cuda_runtime_api.h>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/moe_kernels.h"

namespace locus::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

void set_device(const Tensor& t) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != t.device().index) LOCUS_CUDA_CHECK(cudaSetDevice(t.device().index));
}

}  // namespace

void moe_route(const Tensor& logits, const Tensor& correction_bias, const ops::MoeRoutingConfig& cfg,
               const Tensor& weights, const Tensor& ids, void* stream) {
  LOCUS_CHECK(cfg.num_experts <= detail::kRouteMaxExperts && cfg.top_k <= detail::kRouteMaxTopK &&
                  cfg.n_group <= detail::kRouteMaxGroups,
              "moe_route on CUDA supports num_experts <= ", detail::kRouteMaxExperts, ", top_k <= ",
              detail::kRouteMaxTopK, " and n_group <= ", detail::kRouteMaxGroups, "; got num_experts=",
              cfg.num_experts, ", top_k=", cfg.top_k, ", n_group=", cfg.n_group);
  detail::MoeRouteArgs a{};
  a.logits = logits.data<float>();
  a.logits_ld = logits.stride(0);
  a.bias = correction_bias.defined() ? correction_bias.data<float>() : nullptr;
  a.bias_stride = correction_bias.defined() ? correction_bias.stride(0) : 0;
  a.weights = weights.data<float>();
  a.weights_ld = weights.stride(0);
  a.ids = ids.data<int32_t>();
  a.ids_ld = ids.stride(0);
  a.tokens = logits.size(0);
  a.experts = static_cast<int>(cfg.num_experts);
  a.top_k = static_cast<int>(cfg.top_k);
  a.n_group = static_cast<int>(cfg.n_group);
  a.topk_group = static_cast<int>(cfg.topk_group);
  a.softmax = cfg.scoring == ops::MoeScoring::kSoftmax;
  a.norm_topk_prob = cfg.norm_topk_prob;
  a.routed_scaling_factor = cfg.routed_scaling_factor;
  set_device(logits);
  detail::launch_moe_route(a, as_stream(stream));
}

void moe_group(const Tensor& ids, int64_t num_experts, const Tensor& offsets, const Tensor& rows, const Tensor& slot,
               void* stream) {
  detail::MoeGroupArgs a{};
  a.ids = ids.data<int32_t>();
  a.ids_ld = ids.stride(0);
  a.tokens = ids.size(0);
  a.top_k = static_cast<int>(ids.size(1));
  a.experts = static_cast<int>(num_experts);
  a.offsets = offsets.data<int32_t>();
  a.rows = rows.data<int32_t>();
  a.slot = slot.data<int32_t>();
  a.slot_ld = slot.stride(0);
  set_device(ids);
  detail::launch_moe_group(a, as_stream(stream));
}

void moe_gather(const Tensor& x, const Tensor& rows, const Tensor& y, void* stream) {
  detail::MoeGatherArgs a{};
  a.x = x.data_ptr();
  a.x_ld = x.stride(0);
  a.x_rows = x.size(0);
  a.rows = rows.data<int32_t>();
  a.rows_stride = rows.stride(0);
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.n = y.size(0);
  a.cols = y.size(1);
  a.elem_bytes = static_cast<int>(dtype_size(x.dtype()));
  set_device(x);
  detail::launch_moe_gather(a, as_stream(stream));
}

void moe_combine(const Tensor& expert_out, const Tensor& slot, const Tensor& weights, const Tensor& shared,
                 const Tensor& y, void* stream) {
  detail::MoeCombineArgs a{};
  a.expert_out = expert_out.data_ptr();
  a.eo_ld = expert_out.stride(0);
  a.eo_rows = expert_out.size(0);
  a.eo_f32 = expert_out.dtype() == DType::kFP32;
  a.slot = slot.data<int32_t>();
  a.slot_s0 = slot.stride(0);
  a.slot_s1 = slot.stride(1);
  a.weights = weights.data<float>();
  a.w_s0 = weights.stride(0);
  a.w_s1 = weights.stride(1);
  a.shared = shared.defined() ? shared.data_ptr() : nullptr;
  a.shared_ld = shared.defined() ? shared.stride(0) : 0;
  a.shared_f32 = shared.defined() && shared.dtype() == DType::kFP32;
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.y_f32 = y.dtype() == DType::kFP32;
  a.tokens = y.size(0);
  a.hidden = y.size(1);
  a.top_k = static_cast<int>(slot.size(1));
  set_device(y);
  detail::launch_moe_combine(a, as_stream(stream));
}

void copy_to_host_ordered(const Tensor& src, const Tensor& dst, void* stream) {
  LOCUS_CHECK(src.device().is_cuda() && dst.device().is_cpu() && src.is_contiguous() && dst.is_contiguous() &&
                  src.nbytes() == dst.nbytes(),
              "copy_to_host_ordered: needs a contiguous CUDA source and a contiguous CPU destination of the same size, "
              "got ", src.describe(), " and ", dst.describe());
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LOCUS_CUDA_CHECK(cudaStreamIsCapturing(as_stream(stream), &capturing));
  LOCUS_CHECK(capturing == cudaStreamCaptureStatusNone,
              "reading ", src.describe(), " back to the host needs a synchronization, which a CUDA graph capture "
              "cannot contain (MoE on CUDA reads its expert offsets on the host: not capturable yet)");
  if (src.nbytes() == 0) return;
  set_device(src);
  LOCUS_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToHost,
                                   as_stream(stream)));
  LOCUS_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

}  // namespace locus::cuda
