// Internal to the CUDA backend: the environment variables that switch paths or override limits
// (LOCUS_BMM_TMA, LOCUS_CUBLASLT_AUTOTUNE, ...), read the same way everywhere.
#pragma once
#include <cstdlib>
#include <cstring>

namespace locus::cuda::detail {

// A switch that is on unless the environment variable `name` is "0".
inline bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::strcmp(v, "0") == 0);
}

// The integer in the environment variable `name`, or `fallback` when it is unset or empty.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace locus::cuda::detail
