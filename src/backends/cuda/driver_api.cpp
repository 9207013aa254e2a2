#include "backends/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "backends/cuda/cuda_check.h"

namespace locus::cuda::detail {
namespace {

template <typename Fn>
bool resolve(const char* name, Fn& out) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || !p) {
    cudaGetLastError();  // a failed lookup must not leave a sticky error behind
    out = nullptr;
    return false;
  }
  out = reinterpret_cast<Fn>(p);
  return true;
}

}  // namespace

const DriverApi& driver() {
  static std::once_flag once;
  static DriverApi api;
  static std::string failure;
  std::call_once(once, [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      failure = str("no usable CUDA driver: ", cudaGetErrorString(e));
      cudaGetLastError();
      return;
    }
    bool core = resolve("cuDeviceGet", api.cuDeviceGet) && resolve("cuDeviceGetAttribute", api.cuDeviceGetAttribute) &&
                resolve("cuGetErrorName", api.cuGetErrorName);
    if (!core) {
      failure = "the CUDA driver does not export cuDeviceGet/cuDeviceGetAttribute";
      return;
    }
    api.green_contexts = resolve("cuDeviceGetDevResource", api.cuDeviceGetDevResource) &&
                         resolve("cuDevSmResourceSplitByCount", api.cuDevSmResourceSplitByCount) &&
                         resolve("cuDevResourceGenerateDesc", api.cuDevResourceGenerateDesc) &&
                         resolve("cuGreenCtxCreate", api.cuGreenCtxCreate) &&
                         resolve("cuGreenCtxDestroy", api.cuGreenCtxDestroy) &&
                         resolve("cuGreenCtxStreamCreate", api.cuGreenCtxStreamCreate) &&
                         resolve("cuStreamDestroy", api.cuStreamDestroy);
    resolve("cuTensorMapEncodeTiled", api.cuTensorMapEncodeTiled);
  });
  if (!failure.empty()) LOCUS_THROW(failure);
  return api;
}

bool device_has_tma(int device) {
  return device_attribute(device, cudaDevAttrComputeCapabilityMajor) >= 9 && driver().cuTensorMapEncodeTiled != nullptr;
}

void check_cu(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "unknown CUresult";
  const DriverApi& d = driver();
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  LOCUS_THROW(what, " failed: ", name, " (CUresult ", static_cast<int>(r), ")");
}

}  // namespace locus::cuda::detail
