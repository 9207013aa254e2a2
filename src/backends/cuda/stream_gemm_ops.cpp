// Tensor-level entry points of the weight-streaming GEMM (stream_gemm.h): the unpartitioned
// skinny path and the single-launch locality-domain path of the partitioned ops.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/domain_table.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/nvfp4_gemv.h"
#include "backends/cuda/nvfp4_layout.h"
#include "backends/cuda/nvfp4_wgmma.h"
#include "backends/cuda/path_choice.h"
#include "backends/cuda/stream_gemm.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda {

namespace detail {

StreamGemmArgs stream_gemm_args(StreamWeight format, const Tensor& x, const Tensor& y, bool swiglu, const Tensor& bias) {
  StreamGemmArgs a;
  a.format = format;
  a.swiglu = swiglu;
  a.x = x.data<uint16_t>();
  a.x_ld = x.stride(0);
  a.m = static_cast<int32_t>(x.size(0));
  a.k = x.size(1);
  a.y = y.data_ptr();
  a.y_ld = y.stride(0);
  a.y_f32 = y.dtype() == DType::kFP32;
  a.bias_f32 = bias.defined() && bias.dtype() == DType::kFP32;
  return a;
}

}  // namespace detail

namespace {

using detail::StreamGemmArgs;
using detail::StreamGemmPart;
using detail::StreamWeight;
using detail::StreamWeightRef;

// Largest M the BF16 streaming kernel takes instead of cuBLASLt (LOCUS_STREAM_GEMM_BF16_MAX_M).
// 0 by default: on the H200 (2026-12-03, docs/benchmarks.md) it takes 1.1-3x cuBLASLt's time at
// M <= 16, and its single-launch partitioned form does not beat a fork/join of cuBLASLt calls, so
// cuBLASLt (partitioned: the fork/join) stays the default until the kernel is faster.
int bf16_max_m() {
  static const int m = detail::env_int("LOCUS_STREAM_GEMM_BF16_MAX_M", 0);
  return m;
}

// Several partition streams: their domains and SM table (one or none: every SM is domain 0).
void set_domains(StreamGemmArgs* a, const std::vector<void*>& streams) {
  if (streams.size() <= 1) return;
  a->num_domains = static_cast<int32_t>(streams.size());
  a->sm_domain = detail::sm_domain_table(streams);
}

// Whether the device runs the sm_90a wgmma code (a Hopper GPU; other GPUs get only portable PTX).
bool has_wgmma(int device) {
  return device_attribute(device, cudaDevAttrComputeCapabilityMajor) == 9 &&
         device_attribute(device, cudaDevAttrComputeCapabilityMinor) == 0;
}

const void* bias_at(const Tensor& bias, int64_t n0) {
  if (!bias.defined()) return nullptr;
  return static_cast<const char*>(bias.data_ptr()) + n0 * dtype_size(bias.dtype());
}

StreamGemmPart bf16_part(const Tensor& w, bool swiglu, const Tensor& bias, int64_t n0, int domain) {
  StreamGemmPart p;
  p.w = w.data_ptr();
  p.ldw = w.stride(0);
  p.rows = static_cast<int32_t>(swiglu ? w.size(0) / 2 : w.size(0));
  p.up_offset = swiglu ? p.rows : 0;
  p.bias = bias_at(bias, n0);
  p.y_offset = n0;
  p.domain = domain;
  return p;
}

// NVFP4 fused gate/up needs the up rows to start on a 16-row tile (else the caller unfuses).
bool nvfp4_part(const ops::Nvfp4Weight& w, bool swiglu, const Tensor& bias, int64_t n0, int domain, StreamGemmPart* p) {
  const int64_t rows = swiglu ? w.n / 2 : w.n;
  if (swiglu && (w.n % 2 != 0 || rows % detail::kNvfp4TileRows != 0)) return false;
  p->w = w.packed.data_ptr();
  p->scales = w.scales.data<uint16_t>();
  p->global_scale = nvfp4_global_scale_device(w);
  p->rows = static_cast<int32_t>(rows);
  p->up_offset = swiglu ? rows / detail::kNvfp4TileRows : 0;
  p->bias = bias_at(bias, n0);
  p->y_offset = n0;
  p->domain = domain;
  return true;
}

// Launches `a` over blocks of kStreamGemmMaxM rows of x (one launch when M <= 32).
void launch_row_blocks(StreamGemmArgs a, cudaStream_t stream) {
  const int32_t m = a.m;
  for (int32_t m0 = 0; m0 < m; m0 += detail::kStreamGemmMaxM) {
    StreamGemmArgs b = a;
    b.m = std::min<int32_t>(detail::kStreamGemmMaxM, m - m0);
    b.x = a.x + m0 * a.x_ld;
    b.y = static_cast<char*>(a.y) + m0 * a.y_ld * (a.y_f32 ? 4 : 2);
    detail::launch_stream_gemm(b, stream);
  }
}

// The streaming kernels' domains of the slices (domain_table.h).
bool assign_domains(const std::vector<DomainSlice>& slices, std::vector<int>* domain_of, std::vector<void*>* streams) {
  return detail::assign_domains(slices, detail::kStreamGemmMaxParts, detail::kStreamGemmMaxDomains, domain_of, streams);
}

// A BMM whose weights are per-head [N, K] rows (b a transposed view, stride(1) == 1): heads [h0, h1)
// of it as one batched part.
bool bmm_part(const Tensor& a, const Tensor& b, const Tensor& y, int64_t h0, int domain, StreamGemmPart* p) {
  if (b.dim() != 3 || b.stride(1) != 1 || b.size(1) != a.size(2)) return false;
  p->w = b.data_ptr();
  p->ldw = b.stride(2);
  p->rows = static_cast<int32_t>(b.size(2));
  p->batch = static_cast<int32_t>(b.size(0));
  p->w_batch_stride = b.stride(0);
  p->x = a.data<uint16_t>() + h0 * a.stride(0);
  p->x_batch_stride = a.stride(0);
  p->y_offset = h0 * y.stride(0);
  p->y_batch_stride = y.stride(0);
  p->domain = domain;
  return true;
}

StreamGemmArgs bmm_args(const Tensor& a, const Tensor& y) {
  StreamGemmArgs args;
  args.format = StreamWeight::kBF16;
  args.x = a.data<uint16_t>();
  args.m = static_cast<int32_t>(a.size(1));
  args.x_ld = args.m == 1 ? 0 : a.stride(1);  // one row: its stride is never used
  args.k = a.size(2);
  args.y = y.data_ptr();
  args.y_ld = args.m == 1 ? 0 : y.stride(1);
  args.y_f32 = y.dtype() == DType::kFP32;
  return args;
}

// Launches `a` on `stream` when the streaming kernel takes it (with row_blocks, M > 32 runs as
// blocks of 32 rows), over the domains of the partition `streams` (one or none: every SM is
// domain 0, no table needed). False, with nothing launched, when it does not.
bool launch_if_eligible(StreamGemmArgs a, const std::vector<void*>& streams, bool row_blocks, int device, void* stream) {
  StreamGemmArgs probe = a;
  if (row_blocks) probe.m = std::min<int32_t>(a.m, detail::kStreamGemmMaxM);
  if (!detail::stream_gemm_eligible(probe)) return false;
  use_device(device);
  set_domains(&a, streams);
  launch_row_blocks(a, static_cast<cudaStream_t>(stream));
  return true;
}

detail::EnvToggle g_row_block_launches("LOCUS_NVFP4_ROW_BLOCKS", true);

// Whether `w` is a prepared weight the streaming kernel takes for x [.., K] -> y [.., N].
bool row_block_weight_fits(const ops::Nvfp4Weight& w, const Tensor& x, const Tensor& y, bool swiglu) {
  return w.layout == ops::Nvfp4Layout::kCudaTiled && w.k == x.size(1) && (swiglu ? w.n / 2 : w.n) == y.size(1) &&
         (!swiglu || w.n % 2 == 0);
}

// One launch for the blocks `ids` (all with `m` rows): part j is block ids[j]'s weight, reading
// its rows of x and writing its rows of y. False, with nothing launched, where the kernel does
// not take them.
bool launch_row_blocks_together(const Tensor& x, const std::vector<ops::Nvfp4RowBlock>& blocks,
                                const std::vector<size_t>& ids, int64_t m, const Tensor& y, bool swiglu, void* stream) {
  StreamGemmArgs a = detail::stream_gemm_args(StreamWeight::kNVFP4, x.slice(0, 0, m), y.slice(0, 0, m), swiglu, Tensor());
  a.num_parts = static_cast<int32_t>(ids.size());
  for (size_t j = 0; j < ids.size(); ++j) {
    const ops::Nvfp4RowBlock& b = blocks[ids[j]];
    StreamGemmPart& p = a.parts[j];
    if (!nvfp4_part(*b.w, swiglu, Tensor(), 0, 0, &p)) return false;
    p.x = x.data<uint16_t>() + b.row0 * x.stride(0);
    p.y_offset = b.row0 * y.stride(0);  // its row 0 (the kernel adds row * y_ld + column)
  }
  return launch_if_eligible(a, {}, false, x.device().index, stream);
}

}  // namespace

bool nvfp4_row_block_launches() { return g_row_block_launches.on(); }

void set_nvfp4_row_block_launches(bool on) { g_row_block_launches.set(on); }

std::vector<size_t> nvfp4_gemm_row_blocks(const Tensor& x, const std::vector<ops::Nvfp4RowBlock>& blocks,
                                          const Tensor& y, bool swiglu, void* stream) {
  std::vector<size_t> each;                         // for the caller, one by one
  std::map<int64_t, std::vector<size_t>> by_rows;  // candidates for a shared launch, by row count
  // Operands the per-block ops would refuse go to them, for their errors.
  const bool operands_ok = x.device().is_cuda() && y.device() == x.device() && x.dtype() == DType::kBF16 &&
                           x.stride(1) == 1 && y.stride(1) == 1 &&
                           (y.dtype() == DType::kBF16 || y.dtype() == DType::kFP32);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const ops::Nvfp4RowBlock& b = blocks[i];
    if (b.rows == 0) continue;
    const bool together = nvfp4_row_block_launches() && operands_ok && b.rows <= detail::kStreamGemmMaxM &&
                          !detail::nvfp4_use_wgmma(b.rows, x.size(1)) && row_block_weight_fits(*b.w, x, y, swiglu);
    (together ? by_rows[b.rows] : each).push_back(i);
  }
  for (const auto& [m, ids] : by_rows) {
    for (size_t i0 = 0; i0 < ids.size(); i0 += detail::kStreamGemmMaxParts) {
      const std::vector<size_t> launch(ids.begin() + static_cast<std::ptrdiff_t>(i0),
                                       ids.begin() + static_cast<std::ptrdiff_t>(
                                                         std::min(ids.size(), i0 + detail::kStreamGemmMaxParts)));
      // One block alone gains nothing from sharing: the ordinary op runs it.
      if (launch.size() < 2 || !launch_row_blocks_together(x, blocks, launch, m, y, swiglu, stream))
        each.insert(each.end(), launch.begin(), launch.end());
    }
  }
  return each;
}

Tensor nvfp4_weight_table(const std::vector<const ops::Nvfp4Weight*>& weights) {
  LOCUS_CHECK(!weights.empty(), "nvfp4_weight_table: no weights");
  const Device dev = weights[0]->packed.device();
  Tensor host = Tensor::empty({static_cast<int64_t>(weights.size() * sizeof(StreamWeightRef))}, DType::kU8);
  auto* refs = reinterpret_cast<StreamWeightRef*>(host.data_ptr());
  for (size_t i = 0; i < weights.size(); ++i) {
    const ops::Nvfp4Weight& w = *weights[i];
    LOCUS_CHECK(w.layout == ops::Nvfp4Layout::kCudaTiled && w.packed.device() == dev, "nvfp4_weight_table: weight ",
                i, " is not prepared for ", dev.name());
    refs[i] = {w.packed.data_ptr(), w.scales.data<uint16_t>(), nvfp4_global_scale_device(w)};
  }
  return host.to(dev);
}

void nvfp4_gemm_indexed(const std::vector<ops::Nvfp4IndexedProduct>& products, bool swiglu, void* stream) {
  const char* op = "cuda::nvfp4_gemm_indexed";
  LOCUS_CHECK(!products.empty() && products.size() <= static_cast<size_t>(detail::kStreamGemmMaxParts), op, ": ",
              products.size(), " products (1..", detail::kStreamGemmMaxParts, " per launch)");
  const ops::Nvfp4IndexedProduct& first = products[0];
  const Tensor &x0 = first.x, &y0 = first.y;
  StreamGemmArgs a = detail::stream_gemm_args(StreamWeight::kNVFP4, x0.slice(0, 0, 1), y0.slice(0, 0, 1), swiglu, Tensor());
  a.num_parts = static_cast<int32_t>(products.size());
  std::vector<Tensor> tables;  // alive until the launch is queued
  // The same products for the matrix-vector kernel (nvfp4_gemv.h), timed against this launch.
  detail::Nvfp4GemvArgs g;
  g.swiglu = swiglu;
  g.y = y0.data_ptr();
  g.y_f32 = y0.dtype() == DType::kFP32;
  g.m = 1;
  g.n = y0.size(1);
  g.k = x0.size(1);
  g.num_indexed = static_cast<int32_t>(products.size());
  for (size_t i = 0; i < products.size(); ++i) {
    const ops::Nvfp4IndexedProduct& pr = products[i];
    const ops::Nvfp4Weight& w0 = *pr.set->weights()[0];
    LOCUS_CHECK(w0.layout == ops::Nvfp4Layout::kCudaTiled, op, ": the weights are not prepared for the GPU");
    LOCUS_CHECK(pr.x.stride(1) == 1 && pr.y.stride(1) == 1, op, ": x and y need unit column strides");
    const int64_t T = pr.x.size(0), k = pr.ids.size(1);
    LOCUS_CHECK(T * k <= std::numeric_limits<int32_t>::max() && pr.set->size() <= std::numeric_limits<int32_t>::max(),
                op, ": ", T * k, " rows or ", pr.set->size(), " weights are beyond the kernel's range");
    tables.push_back(pr.set->device_table());
    StreamGemmPart& p = a.parts[i];
    LOCUS_CHECK(nvfp4_part(w0, swiglu, Tensor(), 0, 0, &p), op, ": a fused gate/up weight of ", w0.n,
                " rows does not split into 16-row tiles");
    p.w = nullptr;  // each entry's weight comes from the table
    p.scales = nullptr;
    p.global_scale = nullptr;
    p.weight_table = static_cast<const StreamWeightRef*>(tables.back().data_ptr());
    p.weight_ids = pr.ids.data<int32_t>();
    p.weight_count = static_cast<int32_t>(pr.set->size());
    p.batch = static_cast<int32_t>(T * k);
    p.x = pr.x.data<uint16_t>();
    p.x_batch_stride = pr.x.stride(0);
    p.x_entry_div = static_cast<int32_t>(k);
    p.y_offset = static_cast<int64_t>((reinterpret_cast<uintptr_t>(pr.y.data_ptr()) -
                                       reinterpret_cast<uintptr_t>(y0.data_ptr())) / dtype_size(y0.dtype()));
    p.y_batch_stride = pr.y.stride(0);
    g.indexed[i] = {p.weight_table, p.weight_ids, p.weight_count, p.batch, p.x_entry_div, p.x, p.x_batch_stride,
                    p.y_offset, p.y_batch_stride};
  }
  auto streaming = [&](cudaStream_t s) {
    LOCUS_CHECK(launch_if_eligible(a, {}, false, x0.device().index, s), op, ": the streaming kernel does not take x ",
                x0.describe(), " (K % 16 == 0 and 16-byte aligned rows needed)");
  };
  if (detail::nvfp4_gemv_enabled() && detail::nvfp4_gemv_eligible(g)) {
    use_device(x0.device().index);
    detail::run_nvfp4_gemv_fastest(g, streaming, static_cast<cudaStream_t>(stream));
    return;
  }
  streaming(static_cast<cudaStream_t>(stream));
}

int stream_gemm_bf16_max_m() { return bf16_max_m(); }

bool stream_gemm(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, bool swiglu, void* stream) {
  StreamGemmArgs a = detail::stream_gemm_args(StreamWeight::kBF16, x, y, swiglu, bias);
  a.num_parts = 1;
  a.parts[0] = bf16_part(w, swiglu, bias, 0, 0);
  return launch_if_eligible(a, {}, false, x.device().index, stream);
}

bool gemm_domains(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y, bool swiglu,
                  const std::vector<DomainSlice>& slices, void* caller) {
  std::vector<int> domain_of;
  std::vector<void*> streams;
  if (!assign_domains(slices, &domain_of, &streams)) return false;
  StreamGemmArgs a = detail::stream_gemm_args(StreamWeight::kBF16, x, y, swiglu, bias);
  a.num_parts = static_cast<int32_t>(slices.size());
  for (size_t p = 0; p < slices.size(); ++p) a.parts[p] = bf16_part(shards[p], swiglu, bias, slices[p].n0, domain_of[p]);
  return launch_if_eligible(a, streams, false, x.device().index, caller);
}

bool stream_bmm(const Tensor& a, const Tensor& b, const Tensor& y, void* stream) {
  StreamGemmArgs args = bmm_args(a, y);
  args.num_parts = 1;
  if (!bmm_part(a, b, y, 0, 0, &args.parts[0])) return false;
  return launch_if_eligible(args, {}, false, a.device().index, stream);
}

bool bmm_domains(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                 const std::vector<DomainSlice>& slices, void* caller) {
  std::vector<int> domain_of;
  std::vector<void*> streams;
  if (!assign_domains(slices, &domain_of, &streams)) return false;
  StreamGemmArgs args = bmm_args(a, y);
  args.num_parts = static_cast<int32_t>(slices.size());
  for (size_t p = 0; p < slices.size(); ++p)
    if (!bmm_part(a, b_shards[p], y, slices[p].n0, domain_of[p], &args.parts[p])) return false;
  return launch_if_eligible(args, streams, false, a.device().index, caller);
}

bool nvfp4_gemm_partitioned_fastest(const Tensor& x, const std::vector<ops::Nvfp4Weight>& shards, const Tensor& bias,
                                    const Tensor& y, bool swiglu, const std::vector<DomainSlice>& slices, void* caller,
                                    const std::function<void(void*)>& fork_join) {
  if (!detail::nvfp4_gemv_enabled() || x.size(0) < 1 || x.size(0) > detail::kNvfp4GemvMaxM ||
      shards.size() != slices.size())
    return false;
  use_device(x.device().index);
  detail::Nvfp4GemvDomainArgs g;
  const bool gemv_launch = detail::nvfp4_gemv_domain_args(x, shards, bias, y, swiglu, slices, &g);
  const detail::PathCall streaming_launch = [&](cudaStream_t s) {
    // Where the one launch does not take the shards, this path is the fork/join too.
    if (!nvfp4_gemm_domains(x, shards, bias, y, swiglu, slices, s)) fork_join(s);
  };
  const detail::PathCall fork_join_path = [&](cudaStream_t s) { fork_join(s); };
  const detail::PathCall gemv_path = [&](cudaStream_t s) {
    if (gemv_launch) detail::launch_nvfp4_gemv_domains(g, s);
    else fork_join(s);
  };
  const auto caller_stream = static_cast<cudaStream_t>(caller);
  switch (detail::nvfp4_partitioned_path()) {
    case detail::Nvfp4PartitionedPath::kStreamingLaunch: streaming_launch(caller_stream); return true;
    case detail::Nvfp4PartitionedPath::kForkJoin: fork_join_path(caller_stream); return true;
    case detail::Nvfp4PartitionedPath::kMatrixVectorLaunch: gemv_path(caller_stream); return true;
    case detail::Nvfp4PartitionedPath::kTimed: break;
  }
  // What decides which path is faster: tokens, K, types, each shard's rows and its domain's SMs.
  const int bias_kind = !bias.defined() ? 0 : bias.dtype() == DType::kFP32 ? 2 : 1;
  std::string key = str("nvfp4_partitioned:", x.size(0), 'x', x.size(1), ':', x.stride(0), ',', y.stride(0), ':',
                        y.dtype() == DType::kFP32, bias_kind, swiglu, gemv_launch ? ":gemv" : "");
  for (size_t p = 0; p < shards.size(); ++p)
    key += str(':', shards[p].n, "@sm", detail::partition_stream_sm_count(slices[p].stream));
  std::vector<detail::PathCall> paths = {streaming_launch, fork_join_path};
  if (gemv_launch) paths.push_back(gemv_path);
  detail::run_fastest_path(key, paths, caller_stream);
  return true;
}

bool nvfp4_gemm_domains(const Tensor& x, const std::vector<ops::Nvfp4Weight>& shards, const Tensor& bias,
                        const Tensor& y, bool swiglu, const std::vector<DomainSlice>& slices, void* caller) {
  if (x.size(0) > kNvfp4StreamMaxM) return false;
  std::vector<int> domain_of;
  std::vector<void*> streams;
  if (!assign_domains(slices, &domain_of, &streams)) return false;
  StreamGemmArgs a = detail::stream_gemm_args(StreamWeight::kNVFP4, x, y, swiglu, bias);
  a.num_parts = static_cast<int32_t>(slices.size());
  for (size_t p = 0; p < slices.size(); ++p)
    if (!nvfp4_part(shards[p], swiglu, bias, slices[p].n0, domain_of[p], &a.parts[p])) return false;
  // Decode batches (nvfp4_use_wgmma): the wgmma kernel, where the GPU runs it.
  if (detail::nvfp4_use_wgmma(a.m, a.k) && detail::nvfp4_wgmma_eligible(a) && has_wgmma(x.device().index)) {
    use_device(x.device().index);
    set_domains(&a, streams);
    detail::launch_nvfp4_wgmma(a, static_cast<cudaStream_t>(caller));
    return true;
  }
  return launch_if_eligible(a, streams, true, x.device().index, caller);
}

}  // namespace locus::cuda
