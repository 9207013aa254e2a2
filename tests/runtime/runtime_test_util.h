// Helpers for the runtime tests: a fresh temporary directory per test, raw file writing, and
// expecting an Error whose message contains given pieces.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>

#include "core/error.h"

namespace locus::testing {

// A directory under the system temp dir, removed (with its contents) on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("locus_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs fn, expects a locus::Error whose message contains every piece.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected a locus::Error containing '" << *pieces.begin() << "', nothing was thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace locus::testing
