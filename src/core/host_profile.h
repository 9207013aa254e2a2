// Host time per named region of a forward pass (LOCUS_HOST_PROFILE=1), for finding where an
// eager decode step's time goes. On CUDA a region's time is what the host spends enqueueing its
// work, plus any wait for the device inside it (the MoE's expert offsets read-back, the logits
// copy); on the CPU it is the compute itself. Regions nest ("moe" holds "moe.experts"), and a
// parent's time includes its children's. Off (the default), a region costs one branch.
#pragma once
#include <chrono>
#include <string>

namespace locus {

class HostProfile {
 public:
  static bool enabled();               // LOCUS_HOST_PROFILE=1, or set_enabled
  static void set_enabled(bool on);
  static void add(const char* region, double seconds);  // `region`: a string literal
  static void reset();
  // One line per region, by total time: calls, total ms, us per call. Empty when nothing was
  // recorded.
  static std::string report();
};

// Times its scope into `region` (a string literal) while profiling is on.
class HostProfileScope {
 public:
  explicit HostProfileScope(const char* region) : region_(HostProfile::enabled() ? region : nullptr) {
    if (region_) start_ = std::chrono::steady_clock::now();
  }
  ~HostProfileScope() {
    if (region_)
      HostProfile::add(region_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  HostProfileScope(const HostProfileScope&) = delete;
  HostProfileScope& operator=(const HostProfileScope&) = delete;

 private:
  const char* region_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace locus
