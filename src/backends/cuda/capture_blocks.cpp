// The capture bookkeeping of capture_state.h: how many captures are in progress, the blocks the
// allocator handed out during them, and those freed since. A block freed during a capture may be
// handed out again within the same capture (to a request of the same size class, device and
// domain), as the cache would outside one: the graph replays the same order of uses, so a graph
// needs no more memory than its step's eager peak. After the capture nothing else gets them.
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/cuda/capture_state.h"

namespace locus::cuda::detail {
namespace {

struct Block {
  size_t size_class;
  int device, domain;
};

struct CaptureBlocks {
  std::mutex mu;
  std::unordered_map<void*, Block> live;            // handed out during the capture, not freed
  std::vector<std::pair<void*, Block>> freed;       // freed during it: the graph's to keep
};

std::atomic<int> g_captures{0};

CaptureBlocks& capture_blocks() {
  static auto* blocks = new CaptureBlocks();  // never destroyed, as the allocator hooks
  return *blocks;
}

}  // namespace

void capture_started() { ++g_captures; }

std::vector<void*> capture_ended() {
  CaptureBlocks& cb = capture_blocks();
  std::lock_guard<std::mutex> lock(cb.mu);
  std::vector<void*> held;
  if (--g_captures == 0) {
    for (const auto& f : cb.freed) held.push_back(f.first);
    cb.freed.clear();
    cb.live.clear();
  }
  return held;
}

bool capture_in_progress() { return g_captures.load() > 0; }

void* reuse_capture_block(size_t size_class, int device, int domain) {
  CaptureBlocks& cb = capture_blocks();
  std::lock_guard<std::mutex> lock(cb.mu);
  for (size_t i = cb.freed.size(); i-- > 0;) {  // the most recently freed first, as a stack
    const auto [p, b] = cb.freed[i];
    if (b.size_class != size_class || b.device != device || b.domain != domain) continue;
    cb.freed.erase(cb.freed.begin() + static_cast<std::ptrdiff_t>(i));
    cb.live.emplace(p, b);
    return p;
  }
  return nullptr;
}

void note_capture_allocation(void* p, size_t size_class, int device, int domain) {
  CaptureBlocks& cb = capture_blocks();
  std::lock_guard<std::mutex> lock(cb.mu);
  if (g_captures.load() > 0) cb.live.emplace(p, Block{size_class, device, domain});
}

bool keep_for_capture(void* p) {
  if (g_captures.load() == 0) return false;  // the sets are emptied when the last capture ends
  CaptureBlocks& cb = capture_blocks();
  std::lock_guard<std::mutex> lock(cb.mu);
  auto it = cb.live.find(p);
  if (it == cb.live.end()) return false;
  cb.freed.emplace_back(p, it->second);
  cb.live.erase(it);
  return true;
}

}  // namespace locus::cuda::detail
