// Where an op runs. On CUDA `native` is a cudaStream_t; on the CPU it is a pointer to the
// cpu::ThreadPool to run on (nullptr = the process-wide pool). Core does not interpret it.
#pragma once
#include "core/dtype.h"

namespace locus {

struct Stream {
  Device device = Device::cpu();
  void* native = nullptr;
  static Stream cpu(void* pool = nullptr) { return {Device::cpu(), pool}; }
};

}  // namespace locus
