// The domains of a partitioned op (domain_table.h).
#include "backends/cuda/domain_table.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/persistent_alloc.h"
#include "backends/cuda/stream_gemm.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda::detail {

bool gemv_domain_operands(const Tensor& x, const Tensor& y, const Tensor& bias) {
  auto on_device_rows = [&](const Tensor& t) {
    return t.defined() && t.device().is_cuda() && t.device() == x.device() && t.dim() == 2 && t.stride(1) == 1;
  };
  auto bf16_or_fp32 = [](const Tensor& t) { return t.dtype() == DType::kBF16 || t.dtype() == DType::kFP32; };
  if (!on_device_rows(x) || x.dtype() != DType::kBF16 || !on_device_rows(y) || !bf16_or_fp32(y) ||
      y.size(0) != x.size(0))
    return false;
  return !bias.defined() || (bias.device() == x.device() && bias.dim() == 1 && bias.stride(0) == 1 &&
                             bias.size(0) == y.size(1) && bf16_or_fp32(bias));
}

bool assign_domains(const std::vector<DomainSlice>& slices, int max_parts, int max_domains, std::vector<int>* domain_of,
                    std::vector<void*>* streams) {
  for (const DomainSlice& s : slices) {
    int d = -1;
    for (size_t i = 0; i < streams->size(); ++i)
      if ((*streams)[i] == s.stream) d = static_cast<int>(i);
    if (d < 0) {
      d = static_cast<int>(streams->size());
      streams->push_back(s.stream);
    }
    domain_of->push_back(d);
  }
  return static_cast<int>(slices.size()) <= max_parts && static_cast<int>(streams->size()) <= max_domains;
}

const DomainTables& domain_tables(const std::vector<void*>& streams) {
  static std::mutex mu;
  static auto* all = new std::map<std::vector<uint64_t>, DomainTables>();
  int dev = 0;
  LOCUS_CUDA_CHECK(cudaGetDevice(&dev));
  // Keyed by device and registration serials, not stream handles (handles are reused).
  std::vector<uint64_t> key{static_cast<uint64_t>(dev)};
  for (void* s : streams) key.push_back(partition_stream_serial(s));
  std::lock_guard<std::mutex> lock(mu);
  auto it = all->find(key);
  if (it != all->end()) return it->second;
  // [0, 1024): SM id -> domain; [1024, 2048): SM id -> rank in its domain.
  std::vector<uint8_t> host(2048, kNoDomain);
  DomainTables t;
  bool any = false;
  for (size_t d = 0; d < streams.size() && d < 8; ++d) {
    for (int sm : partition_stream_smids(streams[d])) {
      if (sm >= 0 && sm < 1024 && host[sm] == kNoDomain && t.domain_sms[d] < 255) {
        host[sm] = static_cast<uint8_t>(d);
        host[1024 + sm] = static_cast<uint8_t>(t.domain_sms[d]++);
        any = true;
      }
    }
  }
  if (any) {
    const auto* dev_tables =
        static_cast<const uint8_t*>(persistent_device_alloc(host.size(), host.data(), "uploading the SM-to-domain tables"));
    t.sm_domain = dev_tables;
    t.sm_rank = dev_tables + 1024;
  } else {
    t = DomainTables{};
  }
  return (*all)[key] = t;
}

}  // namespace locus::cuda::detail
