#include "core/host_profile.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace locus {
namespace {

// 1 on, 0 off, -1 not yet read from LOCUS_HOST_PROFILE.
std::atomic<int> g_enabled{-1};

struct Totals {
  int64_t calls = 0;
  double seconds = 0;
};

std::mutex& mu() {
  static std::mutex m;
  return m;
}

std::map<std::string, Totals>& totals() {
  static auto* t = new std::map<std::string, Totals>();  // leaked: regions may close during exit
  return *t;
}

}  // namespace

bool HostProfile::enabled() {
  int on = g_enabled.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* v = std::getenv("LOCUS_HOST_PROFILE");
    on = v && std::strcmp(v, "1") == 0 ? 1 : 0;
    g_enabled.store(on);
  }
  return on == 1;
}

void HostProfile::set_enabled(bool on) { g_enabled.store(on ? 1 : 0); }

void HostProfile::add(const char* region, double seconds) {
  std::lock_guard<std::mutex> lock(mu());
  Totals& t = totals()[region];
  ++t.calls;
  t.seconds += seconds;
}

void HostProfile::reset() {
  std::lock_guard<std::mutex> lock(mu());
  totals().clear();
}

std::string HostProfile::report() {
  std::vector<std::pair<std::string, Totals>> rows;
  {
    std::lock_guard<std::mutex> lock(mu());
    rows.assign(totals().begin(), totals().end());
  }
  if (rows.empty()) return "";
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::string out = "host time by region (a region includes the ones named after it with a dot):\n";
  char line[160];
  for (const auto& [name, t] : rows) {
    std::snprintf(line, sizeof line, "  %-24s %8lld calls %10.3f ms %9.1f us/call\n", name.c_str(),
                  static_cast<long long>(t.calls), t.seconds * 1e3, t.seconds * 1e6 / static_cast<double>(t.calls));
    out += line;
  }
  return out;
}

}  // namespace locus
