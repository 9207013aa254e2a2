// Internal to the CUDA backend: long-lived device buffers (scratch, tables, constants) that may be
// first needed while a stream is being captured into a CUDA graph. The allocation and its
// initialization run in relaxed capture mode on a private stream, so they neither break nor join
// the capture. Such buffers are never freed (a captured graph may still use them).
#pragma once
#include <cstddef>

namespace locus::cuda::detail {

// A device buffer of `bytes` on the current device, filled from `init` (host memory, `bytes`
// long) or zeroed when `init` is nullptr. Throws a locus::Error naming `what` on failure.
void* persistent_device_alloc(size_t bytes, const void* init, const char* what);

}  // namespace locus::cuda::detail
