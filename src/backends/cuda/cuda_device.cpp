// Device facts and green-context SM partitions (cuda_device.h), through the run-time resolved
// driver API (driver_api.h).
#include "backends/cuda/cuda_device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/cuda_ops.h"
#include "backends/cuda/driver_api.h"
#include "backends/cuda/stream_registry.h"

namespace locus::cuda {
namespace detail {
namespace {
std::mutex g_streams_mu;
struct PartitionStream {
  int sm_count = 0;
  std::vector<int> smids;
  uint64_t serial = 0;
};
uint64_t g_next_serial = 1;
std::map<void*, PartitionStream>& partition_streams() {
  static auto* m = new std::map<void*, PartitionStream>();
  return *m;
}
}  // namespace

void register_partition_stream(void* stream, int sm_count, std::vector<int> smids) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  partition_streams()[stream] = {sm_count, std::move(smids), g_next_serial++};
}
void unregister_partition_stream(void* stream) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  partition_streams().erase(stream);
}
int partition_stream_sm_count(void* stream) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  auto it = partition_streams().find(stream);
  return it == partition_streams().end() ? 0 : it->second.sm_count;
}
uint64_t partition_stream_serial(void* stream) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  auto it = partition_streams().find(stream);
  return it == partition_streams().end() ? 0 : it->second.serial;
}
std::vector<int> partition_stream_smids(void* stream) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  auto it = partition_streams().find(stream);
  return it == partition_streams().end() ? std::vector<int>() : it->second.smids;
}
}  // namespace detail

using detail::check_cu;
using detail::driver;

bool device_available() {
  static const bool available = [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return available;
}

static void check_device_index(int device_index) {
  LOCUS_CHECK(device_available(), "no CUDA device is available (no driver or no GPU)");
  int n = 0;
  LOCUS_CUDA_CHECK(cudaGetDeviceCount(&n));
  LOCUS_CHECK(device_index >= 0 && device_index < n, "CUDA device index ", device_index, " out of range (", n,
              " devices)");
}

static CUdevResource device_sm_resource(int device_index, CUdevice* dev_out) {
  const auto& d = driver();
  LOCUS_CHECK(d.green_contexts, "the CUDA driver has no green-context API (needs CUDA 12.5+ driver)");
  LOCUS_CUDA_CHECK(cudaSetDevice(device_index));
  LOCUS_CUDA_CHECK(cudaFree(nullptr));  // initialize the primary context first
  CUdevice dev;
  check_cu(d.cuDeviceGet(&dev, device_index), "cuDeviceGet");
  CUdevResource res{};
  check_cu(d.cuDeviceGetDevResource(dev, &res, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource(SM)");
  if (dev_out) *dev_out = dev;
  return res;
}

DeviceInfo query_device(int device_index) {
  check_device_index(device_index);
  cudaDeviceProp prop{};
  LOCUS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_index));
  DeviceInfo info;
  info.name = prop.name;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.locality_domain_count = 1;
  info.locality_domain_sm_count = 0;
#if CUDA_VERSION >= 13040
  // Built with CUDA 13.4+ headers: the attribute numbers come from them. An older driver answers
  // CUDA_ERROR_INVALID_VALUE, which means one domain.
  {
    const auto& d = driver();
    CUdevice dev;
    check_cu(d.cuDeviceGet(&dev, device_index), "cuDeviceGet");
    int count = 0, per = 0;
    if (d.cuDeviceGetAttribute(&count, CU_DEVICE_ATTRIBUTE_LOCALITY_DOMAIN_COUNT, dev) == CUDA_SUCCESS && count > 0) {
      info.locality_domain_count = count;
      if (d.cuDeviceGetAttribute(&per, CU_DEVICE_ATTRIBUTE_LOCALITY_DOMAIN_MULTIPROCESSOR_COUNT, dev) == CUDA_SUCCESS)
        info.locality_domain_sm_count = per;
    }
  }
#else
  // CUDA 13.0 headers do not define the locality-domain attributes; their numbers are not
  // guessed (third-party sources disagree), so a 13.0 build always reports one domain.
#endif
  if (driver().green_contexts) {
    CUdevResource res = device_sm_resource(device_index, nullptr);
    info.min_sm_partition = static_cast<int>(res.sm.minSmPartitionSize);
    info.sm_coscheduled_alignment = static_cast<int>(res.sm.smCoscheduledAlignment);
  }
  return info;
}

// Runs the probe kernel on `stream` and returns the SM ids it ran on.
static std::vector<int> probe_smids(cudaStream_t stream, int blocks) {
  unsigned* seen = nullptr;
  LOCUS_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&seen), 1024 * sizeof(unsigned)));
  std::vector<unsigned> host(1024, 0);
  try {
    LOCUS_CUDA_CHECK(cudaMemsetAsync(seen, 0, 1024 * sizeof(unsigned), stream));
    detail::launch_smid_probe(seen, blocks, stream);
    LOCUS_CUDA_CHECK(cudaMemcpyAsync(host.data(), seen, 1024 * sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
    LOCUS_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaFree(seen);
    throw;
  }
  LOCUS_CUDA_CHECK(cudaFree(seen));
  std::vector<int> ids;
  for (int i = 0; i < 1024; ++i)
    if (host[i]) ids.push_back(i);
  return ids;
}

std::vector<SmPartition> create_sm_partitions(int device_index, int count, SplitMode mode) {
  check_device_index(device_index);
  LOCUS_CHECK(count >= 1, "create_sm_partitions: partition count must be >= 1, got ", count);
  const auto& d = driver();
  CUdevice dev;
  CUdevResource input = device_sm_resource(device_index, &dev);
  const int total = static_cast<int>(input.sm.smCount);
  const unsigned flags =
      mode == SplitMode::kBackfill ? static_cast<unsigned>(CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) : 0u;
  // Group size: an even share rounded down to the split granularity (the driver rounds a
  // request up to it, which would leave fewer groups than asked for).
  int gran = mode == SplitMode::kBackfill
                 ? 2
                 : std::max<int>({static_cast<int>(input.sm.minSmPartitionSize),
                                  static_cast<int>(input.sm.smCoscheduledAlignment), 1});
  const int share = total / count / gran * gran;
  LOCUS_CHECK(share >= std::max<int>(gran, static_cast<int>(input.sm.minSmPartitionSize)),
              "cannot split ", total, " SMs into ", count, " partitions: each would get ", total / count,
              " SMs, below the split granularity of ", gran, " (min partition ", input.sm.minSmPartitionSize,
              ", ", mode == SplitMode::kBackfill ? "backfill" : "aligned", " mode)");
  std::vector<CUdevResource> groups(count);
  CUdevResource remaining{};
  unsigned nb = static_cast<unsigned>(count);
  check_cu(d.cuDevSmResourceSplitByCount(groups.data(), &nb, &input, &remaining, flags, static_cast<unsigned>(share)),
           "cuDevSmResourceSplitByCount");
  LOCUS_CHECK(nb == static_cast<unsigned>(count), "the driver split ", total, " SMs into only ", nb,
              " partitions of ", share, " SMs, not the ", count, " requested");

  std::vector<SmPartition> parts;
  try {
    for (int i = 0; i < count; ++i) {
      CUdevResourceDesc desc{};
      check_cu(d.cuDevResourceGenerateDesc(&desc, &groups[i], 1), "cuDevResourceGenerateDesc");
      CUgreenCtx g = nullptr;
      check_cu(d.cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
      SmPartition p;
      p.green_ctx = g;
      p.sm_count = static_cast<int>(groups[i].sm.smCount);
      parts.push_back(p);
      CUstream s = nullptr;
      check_cu(d.cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate");
      parts.back().stream = s;
      parts.back().smids = probe_smids(reinterpret_cast<cudaStream_t>(s), 8 * p.sm_count);
      detail::register_partition_stream(s, parts.back().sm_count, parts.back().smids);
    }
  } catch (...) {
    destroy_sm_partitions(parts);
    throw;
  }
  return parts;
}

void destroy_sm_partitions(std::vector<SmPartition>& parts) {
  if (parts.empty()) return;
  const auto& d = driver();
  for (auto& p : parts) {  // streams first, then their contexts
    if (p.stream) {
      detail::unregister_partition_stream(p.stream);
      d.cuStreamDestroy(static_cast<CUstream>(p.stream));
      p.stream = nullptr;
    }
  }
  for (auto& p : parts) {
    if (p.green_ctx) d.cuGreenCtxDestroy(static_cast<CUgreenCtx>(p.green_ctx));
    p.green_ctx = nullptr;
  }
  parts.clear();
}

}  // namespace locus::cuda
