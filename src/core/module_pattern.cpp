#include "core/module_pattern.h"

#include <fnmatch.h>

namespace locus {

bool module_pattern_matches(const std::string& pattern, const std::string& name) {
  if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
  for (size_t pos = name.find('.'); pos != std::string::npos; pos = name.find('.', pos + 1)) {
    if (::fnmatch(pattern.c_str(), name.substr(0, pos).c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace locus
