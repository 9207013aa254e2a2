// Device facts and SM partitions from the CUDA driver, for the locality layer. The driver API
// is reached through cudaGetDriverEntryPoint / cuGetProcAddress at run time (never -lcuda), so
// a binary built with CUDA 13.0 starts without a driver and uses the CUDA 13.4 locality-domain
// attributes when a newer driver has them. No CUDA header is included here.
#pragma once
#include <string>
#include <vector>

namespace locus::cuda {

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int l2_bytes = 0;
  int cc_major = 0, cc_minor = 0;
  // From cudaDevAttrLocalityDomainCount / ...MultiprocessorCount when the driver has them
  // (CUDA 13.4+); 1 and 0 otherwise.
  int locality_domain_count = 1;
  int locality_domain_sm_count = 0;
  int min_sm_partition = 0;       // green-context SM split granularity
  int sm_coscheduled_alignment = 0;
};

// Throws locus::Error when no device/driver is available.
DeviceInfo query_device(int device_index);

// One green-context SM partition with its own non-blocking stream.
struct SmPartition {
  void* green_ctx = nullptr;  // CUgreenCtx
  void* stream = nullptr;     // cudaStream_t (a CUstream created in the green context)
  int sm_count = 0;
  std::vector<int> smids;     // SM ids observed by a probe kernel on this stream
};

enum class SplitMode {
  kAligned,   // default co-scheduling (H200: 2 x 64 SMs, 4 left over)
  kBackfill,  // CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING (H200: 2 x 66, none left over)
};

// Splits the device's SMs into `count` equal partitions (emulated domains; the real per-domain
// split where the driver supports it). Throws a clear Error when `count` partitions cannot be
// formed. Created once at start-up (about 1 ms each); destroy with destroy_sm_partitions.
std::vector<SmPartition> create_sm_partitions(int device_index, int count, SplitMode mode);
void destroy_sm_partitions(std::vector<SmPartition>& parts);

}  // namespace locus::cuda
