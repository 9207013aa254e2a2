// Internal to the CUDA backend: the environment variables that switch paths or override limits
// (LOCUS_BMM_TMA, LOCUS_CUBLASLT_AUTOTUNE, ...), read the same way everywhere.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "core/env_switch.h"

namespace locus::cuda::detail {

// A switch that is on unless the environment variable `name` is "0".
inline bool env_switch(const char* name) { return env_switch_on(name); }

// The integer in the environment variable `name`, or `fallback` when it is unset or empty.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// A switch read from the environment variable `name` on first use, which a setter (tests,
// benchmarks) overrides: default on, it is on unless the variable is "0"; default off, on only
// where it is "1".
class EnvToggle {
 public:
  constexpr EnvToggle(const char* name, bool default_on) : name_(name), default_on_(default_on) {}
  bool on() {
    int v = state_.load();
    if (v < 0) {
      v = default_on_ ? env_switch(name_) : env_int(name_, 0) == 1;
      state_.store(v);
    }
    return v == 1;
  }
  void set(bool on) { state_.store(on ? 1 : 0); }
  // A setter's value as EnvCount::set takes it: 1 on, 0 off, negative back to the environment's.
  void set_or_reset(int64_t on) { state_.store(on < 0 ? -1 : on != 0 ? 1 : 0); }

 private:
  const char* name_;
  bool default_on_;
  std::atomic<int> state_{-1};  // 1 on, 0 off, -1 not yet read
};

// A non-negative count read from the environment variable `name` on first use (`fallback` when
// unset, empty or negative), which a setter (tests, benchmarks) overrides; set(-1) goes back to
// the environment's value.
class EnvCount {
 public:
  constexpr EnvCount(const char* name, int64_t fallback) : name_(name), fallback_(fallback) {}
  int64_t get() {
    int64_t v = value_.load();
    if (v < 0) {
      v = env_int(name_, static_cast<int>(fallback_));
      value_.store(v < 0 ? fallback_ : v);
    }
    return value_.load();
  }
  void set(int64_t v) { value_.store(v < 0 ? -1 : v); }

 private:
  const char* name_;
  int64_t fallback_;
  std::atomic<int64_t> value_{-1};
};

}  // namespace locus::cuda::detail
