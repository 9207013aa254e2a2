#include "runtime/progress.h"

#include <unistd.h>

#include <algorithm>

#include "core/error.h"

namespace locus::runtime {

std::string format_bytes(uint64_t b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1000.0 && u < 4) v /= 1000.0, ++u;
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
  }
  return buf;
}

ProgressBar::ProgressBar(std::string label, uint64_t total_items, uint64_t total_bytes, bool enabled, std::FILE* out,
                         int tty)
    : label_(std::move(label)),
      total_items_(total_items),
      total_bytes_(total_bytes),
      enabled_(enabled && out != nullptr),
      tty_(tty < 0 ? (out != nullptr && ::isatty(::fileno(out)) == 1) : tty != 0),
      out_(out),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (!finished_) finish();
}

void ProgressBar::advance(uint64_t items, uint64_t bytes) {
  items_ += items;
  bytes_ += bytes;
  draw(false);
}

void ProgressBar::draw(bool force) {
  if (!enabled_) return;
  const double frac = total_bytes_ > 0 ? std::min(1.0, static_cast<double>(bytes_) / static_cast<double>(total_bytes_))
                      : total_items_ > 0 ? std::min(1.0, static_cast<double>(items_) / static_cast<double>(total_items_))
                                         : 1.0;
  const std::string counts = str(items_, "/", total_items_, " tensors, ", format_bytes(bytes_), " / ",
                                 format_bytes(total_bytes_));
  if (tty_) {
    // Redraw at most every 50 ms (and always when forced) so the terminal is not flooded.
    auto now = std::chrono::steady_clock::now();
    if (!force && now - last_draw_ < std::chrono::milliseconds(50)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    std::fprintf(out_, "\r%s [%s] %3d%% %s\x1b[K", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
                 counts.c_str());
    std::fflush(out_);
  } else {
    // Plain lines at each quarter.
    const int quarter = static_cast<int>(frac * 4);
    if (quarter > last_quarter_ && quarter < 4) {
      last_quarter_ = quarter;
      std::fprintf(out_, "%s: %d%% (%s)\n", label_.c_str(), quarter * 25, counts.c_str());
      std::fflush(out_);
    }
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tty_) {
    draw(true);
    std::fprintf(out_, " (%.1f s)\n", secs);
  } else {
    std::fprintf(out_, "%s: done, %llu tensors, %s in %.1f s\n", label_.c_str(), static_cast<unsigned long long>(items_),
                 format_bytes(bytes_).c_str(), secs);
  }
  std::fflush(out_);
}

}  // namespace locus::runtime
