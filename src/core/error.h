// Error type and checking macros. Header-only and nvcc-safe (no fmt): messages are built with
// operator<< so any streamable value can be part of the text.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace locus {

// Every failure Locus reports is an Error whose what() is a readable sentence naming the culprit.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Concatenates any streamable values into one string: str("K=", k, " is odd").
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace locus

#define LOCUS_THROW(...) throw ::locus::Error(::locus::str(__VA_ARGS__))

// LOCUS_CHECK(cond, "message parts", ...): throws locus::Error when cond is false.
#define LOCUS_CHECK(cond, ...)                                   \
  do {                                                           \
    if (!(cond)) {                                               \
      throw ::locus::Error(::locus::str(__VA_ARGS__));           \
    }                                                            \
  } while (0)
