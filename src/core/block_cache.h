// BlockCache: keeps freed device blocks in size classes, per (device index, locality domain), and
// hands them out again, so that a backend pays for its raw allocator (cudaMalloc, and cudaFree,
// which synchronizes the device) only on a miss. Backend-neutral: the raw allocate / free come in
// as callbacks (the CUDA DeviceHooks use it; tests drive it with malloc).
//
// Reuse is immediate: a freed block can be handed out by the next allocate of its class, even
// while work queued before the free may still use it. That is only safe under the backend's
// ordering rule (CUDA: see cuda_hooks.cpp). Blocks never move between domains: a domain's blocks
// stay in that domain's memory.
//
// Size classes: up to 1 MiB, steps of a quarter of the power of two below the size (512 B at
// least): 512, 1024, 1536, 2048, 2560, ... 1 MiB; above 1 MiB, multiples of 2 MiB. A request is
// served by the smallest cached block of its class or up to 25% larger (best fit).
//
// Out of memory: the raw allocate returns nullptr; the cache then frees every cached block of the
// device (all domains) and retries once; a second failure is an Error naming the size, the device,
// the domain and what the cache held.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/device_hooks.h"

namespace locus {

class BlockCache {
 public:
  struct Backend {
    std::string device_kind = "device";  // "cuda": error messages name cuda:<index>
    // Raw allocation of exactly `bytes` (a class size). nullptr when the device is out of memory;
    // throws an Error on any other failure.
    std::function<void*(size_t bytes, int device_index, int domain)> allocate;
    std::function<void(void* ptr, int device_index)> free;
    // Called before cached blocks of a device are freed (CUDA: waits for the device so that no
    // queued work still uses them). Returns false when they cannot be freed now; they stay cached.
    std::function<bool(int device_index)> prepare_release;
  };

  explicit BlockCache(Backend backend);
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // The class size a request of `bytes` is rounded up to.
  static size_t size_class(size_t bytes);

  void* allocate(size_t bytes, int device_index, int domain);
  // Returns a block from allocate() to the cache of its device and domain. Never throws (it runs
  // in destructors); a pointer the cache did not hand out goes straight to the raw free.
  void deallocate(void* ptr) noexcept;
  // Frees every cached (not handed out) block of the device, all domains; returns the bytes freed
  // (0 when prepare_release refused).
  int64_t release(int device_index);

  CacheStats stats(int device_index, int domain) const;
  CacheStats total(int device_index) const;  // all domains of the device

 private:
  using Key = std::pair<int, int>;  // (device index, domain)
  struct Live {
    size_t bytes;
    Key key;
  };
  struct Pool {
    std::multimap<size_t, void*> free_blocks;  // by size
    CacheStats stats;
  };
  void* take_cached(Pool& pool, size_t want, size_t* got);  // nullptr when none fits
  int64_t release_locked(int device_index);

  Backend backend_;
  mutable std::mutex mu_;
  std::map<Key, Pool> pools_;
  std::unordered_map<void*, Live> live_;
};

}  // namespace locus
