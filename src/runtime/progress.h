// A small progress bar for the loader. On a TTY it redraws one line with '\r'
// ("loading weights [=====>    ] 12/40 tensors, 1.2/3.9 GB"); otherwise (logs, CI) it prints a
// few plain lines (at 25/50/75/100 %) so logs stay short.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace locus::runtime {

class ProgressBar {
 public:
  // out = stderr by default; tty = whether `out` is a terminal (detected with isatty when null).
  // enabled = false makes every call a no-op (for quiet runs and tests).
  ProgressBar(std::string label, uint64_t total_items, uint64_t total_bytes, bool enabled = true,
              std::FILE* out = stderr, int tty = -1);
  ~ProgressBar();  // finishes the line if finish() was not called
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void advance(uint64_t items, uint64_t bytes);
  void finish();  // final line with the elapsed time

  uint64_t items_done() const { return items_; }
  uint64_t bytes_done() const { return bytes_; }

 private:
  void draw(bool force);
  std::string label_;
  uint64_t total_items_, total_bytes_, items_ = 0, bytes_ = 0;
  bool enabled_, tty_, finished_ = false;
  std::FILE* out_;
  int last_quarter_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1.5 GB", "12.0 MB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace locus::runtime
