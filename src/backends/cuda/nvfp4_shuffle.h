// Internal to the CUDA backend: the host side of nvfp4_prepare, a checkpoint's (kLinear) NVFP4
// weight re-laid into the kCudaTiled layout (nvfp4_layout.h) in host memory, ready to upload.
#pragma once
#include <cstdint>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "ops/nvfp4.h"

namespace locus::cuda::detail {

struct Nvfp4HostTiled {
  std::vector<uint8_t> packed;  // N64 * K64 / 2
  std::vector<uint8_t> scales;  // N64 * K64 / 16 + 16 (global scale at the end)
  int64_t n64 = 0, k64 = 0;
};

// The tiled bytes of `w` (on the CPU or copied there), its row tiles split over `pool` (the same
// bytes whatever the split). Throws, naming the row and block, on a scale that is not a finite
// non-negative e4m3 value, and on a malformed weight.
Nvfp4HostTiled nvfp4_shuffle_host(const ops::Nvfp4Weight& w, cpu::ThreadPool& pool);

}  // namespace locus::cuda::detail
