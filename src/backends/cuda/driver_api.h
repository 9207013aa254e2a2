// Internal to the CUDA backend: the few driver-API entry points Locus uses, resolved at run time
// through cudaGetDriverEntryPointByVersion so that no binary links -lcuda (it then starts on a
// machine without a driver). Only types come from cuda.h.
#pragma once
#include <cuda.h>

namespace locus::cuda::detail {

struct DriverApi {
  decltype(&::cuDeviceGet) cuDeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute = nullptr;
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuDeviceGetDevResource) cuDeviceGetDevResource = nullptr;
  decltype(&::cuDevSmResourceSplitByCount) cuDevSmResourceSplitByCount = nullptr;
  decltype(&::cuDevResourceGenerateDesc) cuDevResourceGenerateDesc = nullptr;
  decltype(&::cuGreenCtxCreate) cuGreenCtxCreate = nullptr;
  decltype(&::cuGreenCtxDestroy) cuGreenCtxDestroy = nullptr;
  decltype(&::cuGreenCtxStreamCreate) cuGreenCtxStreamCreate = nullptr;
  decltype(&::cuStreamDestroy) cuStreamDestroy = nullptr;
  decltype(&::cuTensorMapEncodeTiled) cuTensorMapEncodeTiled = nullptr;  // nullptr before CUDA 12
  bool green_contexts = false;  // all green-context entry points resolved
};

// Resolves the entry points once; throws locus::Error when the runtime cannot reach a driver.
const DriverApi& driver();

// Throws locus::Error naming `what` and the driver's error name when r != CUDA_SUCCESS.
void check_cu(CUresult r, const char* what);

// Whether `device` has TMA (sm_90 or newer) and the driver gives the tensor-map entry point.
bool device_has_tma(int device);

}  // namespace locus::cuda::detail
