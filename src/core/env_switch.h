// A switch read from the environment: on unless the variable is "0". For A/B switches of paths
// that are on by default (the CUDA backend has its own, with setters for tests:
// backends/cuda/env_settings.h).
#pragma once
#include <cstdlib>
#include <cstring>

namespace locus {

inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::strcmp(v, "0") == 0);
}

}  // namespace locus
