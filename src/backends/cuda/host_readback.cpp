// HostReadback: pinned blocks and their events, kept in a pool and reused, since pinning host
// memory costs far more than the copies it serves (expert offsets, a step's logits or tokens).
#include "backends/cuda/host_readback.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/env_settings.h"
#include "backends/cuda/host_upload.h"

namespace locus::cuda {

struct HostReadback::Slot {
  void* host = nullptr;
  void* device_view = nullptr;  // `host`'s mapped address on the device (unified addressing), or null
  size_t bytes = 0;
  int device = -1;
  cudaEvent_t done = nullptr;  // recorded on the copy's stream after the copy
};

namespace {

using Slot = HostReadback::Slot;

class SlotPool {
 public:
  Slot* acquire(size_t bytes, int device) {
    {
      // The smallest free block that fits, so that small copies (offsets) leave the large blocks
      // (logits rows) to the copies that need them.
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i]->device == device && free_[i]->bytes >= bytes &&
            (best == free_.size() || free_[i]->bytes < free_[best]->bytes))
          best = i;
      }
      if (best < free_.size()) {
        Slot* s = free_[best];
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
        return s;
      }
    }
    auto* s = new Slot();
    s->bytes = std::max<size_t>(bytes, 4096);
    s->device = device;
    cudaError_t err = cudaHostAlloc(&s->host, s->bytes, cudaHostAllocMapped);
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    cudaPointerAttributes attr{};
    if (err == cudaSuccess && cudaPointerGetAttributes(&attr, s->host) == cudaSuccess)
      s->device_view = attr.devicePointer;
    cudaGetLastError();  // a failed attribute query leaves the copy engine to this block
    if (err != cudaSuccess) {
      if (s->host) cudaFreeHost(s->host);
      delete s;
      LOCUS_CUDA_CHECK_NAMED(err, "allocating a pinned block for a device-to-host copy");
    }
    return s;
  }
  void release(Slot* s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<Slot*> free_;
};

SlotPool& pool() {
  static auto* p = new SlotPool();  // never destroyed: blocks may be in use during static teardown
  return *p;
}

// Copies of at most this many bytes run as a kernel writing the block through its mapped address
// (copy_by_kernel): a copy-engine transfer queued after a kernel starts 5-7 us after it, and the
// next kernel 2-3 us after the transfer (H100 trace of a decode step's tokens, docs/benchmarks.md).
// Larger ones (a step's logits) keep the copy engine's bandwidth. LOCUS_READBACK_KERNEL=0 sends
// every copy to the copy engine.
constexpr size_t kKernelCopyMaxBytes = 64 << 10;

// The copy into `slot`, then its event.
void queue_copy(const Slot& slot, const void* src, size_t bytes, cudaStream_t stream, const std::string& what) {
  static detail::EnvToggle kernel_copies("LOCUS_READBACK_KERNEL", /*default_on=*/true);
  if (bytes <= kKernelCopyMaxBytes && slot.device_view != nullptr && kernel_copies.on())
    copy_by_kernel(src, slot.device_view, bytes, stream);
  else
    LOCUS_CUDA_CHECK_NAMED(cudaMemcpyAsync(slot.host, src, bytes, cudaMemcpyDeviceToHost, stream),
                           "queueing the copy of " + what + " to the host");
  LOCUS_CUDA_CHECK_NAMED(cudaEventRecord(slot.done, stream), "queueing the copy of " + what + " to the host");
}

}  // namespace

HostReadback::HostReadback(const Tensor& src, void* stream) {
  LOCUS_CHECK(src.device().is_cuda() && src.is_contiguous(), "HostReadback: needs a contiguous CUDA tensor, got ",
              src.describe());
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LOCUS_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  LOCUS_CHECK(capturing == cudaStreamCaptureStatusNone, "reading ", src.describe(),
              " back to the host needs a synchronization, which a CUDA graph capture cannot contain");
  if (src.nbytes() == 0) return;
  use_device(src.device().index);
  slot_ = pool().acquire(src.nbytes(), src.device().index);
  try {
    queue_copy(*slot_, src.data_ptr(), src.nbytes(), s, src.describe());
  } catch (...) {
    release();
    throw;
  }
}

HostReadback::~HostReadback() { release(); }

HostReadback::HostReadback(HostReadback&& other) noexcept : slot_(std::exchange(other.slot_, nullptr)) {}

const void* HostReadback::wait() {
  if (slot_ == nullptr) return nullptr;
  LOCUS_CUDA_CHECK_NAMED(cudaEventSynchronize(slot_->done), "waiting for a device-to-host copy");
  return slot_->host;
}

void HostReadback::release() noexcept {
  if (slot_ == nullptr) return;
  // A copy in flight still writes the block: wait for it before another copy may use it.
  cudaEventSynchronize(slot_->done);
  pool().release(std::exchange(slot_, nullptr));
}

}  // namespace locus::cuda
