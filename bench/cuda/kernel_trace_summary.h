// What the kernel tracer (kernel_trace.cpp) reports, apart from CUPTI so that it can be tested
// without a GPU: device activities (kernels, copies, memsets) with their start and end times,
// summed by name over a window of the trace, with the time the device was busy (the union of
// the activities, so that overlapping streams count once) and the idle gaps between them (the
// device waiting for the host, in an eager program).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace locus::bench {

struct TraceActivity {
  std::string name;  // shortened kernel name, or "[memcpy HtoD]" and the like
  uint64_t start_ns = 0, end_ns = 0;
  int64_t blocks = 0;  // kernels: CTAs in the grid (0 for copies and memsets)
};

struct TraceRow {
  std::string name;
  int64_t count = 0;
  double total_us = 0;
};

struct TraceSummary {
  double window_us = 0;  // from the first activity's start to the last one's end, in the window
  double busy_us = 0;    // union of the activities
  int64_t activities = 0;
  int64_t gaps_over_5us = 0;  // idle stretches between activities longer than 5 us
  double gaps_over_5us_total_us = 0;
  std::vector<TraceRow> rows;  // by total time, largest first
};

// Activities in start order (ties: the earlier end first).
inline void sort_by_start(std::vector<TraceActivity>& acts) {
  std::sort(acts.begin(), acts.end(), [](const TraceActivity& a, const TraceActivity& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
  });
}

// Summarizes the activities that start in the last `last_ms` milliseconds of the trace (all of
// them when last_ms <= 0).
inline TraceSummary summarize_trace(std::vector<TraceActivity> acts, double last_ms) {
  TraceSummary s;
  if (acts.empty()) return s;
  sort_by_start(acts);
  uint64_t last_end = 0;
  for (const auto& a : acts) last_end = std::max(last_end, a.end_ns);
  const uint64_t cut = last_ms > 0 && last_ms * 1e6 < static_cast<double>(last_end)
                           ? last_end - static_cast<uint64_t>(last_ms * 1e6)
                           : 0;
  std::map<std::string, TraceRow> by_name;
  uint64_t first = 0, covered_to = 0, busy = 0;
  bool any = false;
  for (const auto& a : acts) {
    if (a.start_ns < cut) continue;
    TraceRow& r = by_name[a.name];
    r.name = a.name;
    ++r.count;
    r.total_us += static_cast<double>(a.end_ns - a.start_ns) / 1e3;
    ++s.activities;
    if (!any) {
      first = covered_to = a.start_ns;
      any = true;
    }
    if (a.start_ns > covered_to) {  // an idle gap before this activity
      const double gap_us = static_cast<double>(a.start_ns - covered_to) / 1e3;
      if (gap_us > 5) {
        ++s.gaps_over_5us;
        s.gaps_over_5us_total_us += gap_us;
      }
      covered_to = a.start_ns;
    }
    if (a.end_ns > covered_to) {
      busy += a.end_ns - covered_to;
      covered_to = a.end_ns;
    }
  }
  if (!any) return s;
  s.window_us = static_cast<double>(covered_to - first) / 1e3;
  s.busy_us = static_cast<double>(busy) / 1e3;
  for (auto& [name, row] : by_name) s.rows.push_back(row);
  std::sort(s.rows.begin(), s.rows.end(), [](const TraceRow& a, const TraceRow& b) {
    return a.total_us != b.total_us ? a.total_us > b.total_us : a.name < b.name;
  });
  return s;
}

// A demangled kernel name without its parameter list and the project's namespaces, at most 100
// characters: "stream_gemm_kernel<(StreamWeight)1, 8>" rather than the whole signature.
inline std::string short_kernel_name(std::string n) {
  // The parameter list: the last '(' at template depth 0 that closes at the end of the name.
  int depth = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    if (c == '<') ++depth;
    else if (c == '>') depth = std::max(0, depth - 1);
    else if (c == '(' && depth == 0 && n.compare(i, 21, "(anonymous namespace)") != 0) {
      n.resize(i);
      break;
    }
  }
  for (const std::string drop : {"locus::cuda::detail::", "locus::cuda::", "(anonymous namespace)::", "void "}) {
    for (size_t at; (at = n.find(drop)) != std::string::npos;) n.erase(at, drop.size());
  }
  if (n.size() > 100) n = n.substr(0, 97) + "...";
  return n;
}

// The summary as a Markdown table (per-call and per-window shares), with a header line.
inline void print_trace_summary(FILE* out, const TraceSummary& s, double last_ms) {
  char window[64] = "";
  if (last_ms > 0) std::snprintf(window, sizeof window, " (last %g ms)", last_ms);
  std::fprintf(out, "kernel trace%s: %lld activities over %.1f us, device busy %.1f us (%.1f%%), %lld idle gaps > 5 us "
               "(%.1f us)\n\n",
               window,
               static_cast<long long>(s.activities), s.window_us, s.busy_us,
               s.window_us > 0 ? 100.0 * s.busy_us / s.window_us : 0.0, static_cast<long long>(s.gaps_over_5us),
               s.gaps_over_5us_total_us);
  std::fprintf(out, "| activity | calls | total us | us per call | share of busy |\n|---|---|---|---|---|\n");
  for (const auto& r : s.rows) {
    std::fprintf(out, "| %s | %lld | %.1f | %.2f | %.1f%% |\n", r.name.c_str(), static_cast<long long>(r.count),
                 r.total_us, r.total_us / static_cast<double>(r.count),
                 s.busy_us > 0 ? 100.0 * r.total_us / s.busy_us : 0.0);
  }
}

// The last `n` activities in start order, one row each: its CTAs, start (from the first listed),
// duration and the idle time since the device last finished something. For reading one decode
// step launch by launch (LOCUS_KERNEL_TRACE_SEQUENCE=N).
inline void print_trace_sequence(FILE* out, std::vector<TraceActivity> acts, size_t n) {
  sort_by_start(acts);
  const size_t from = acts.size() > n ? acts.size() - n : 0;
  std::fprintf(out, "\nlast %zu activities in start order:\n\n", acts.size() - from);
  std::fprintf(out, "| # | activity | CTAs | start us | us | idle before us |\n|---|---|---|---|---|---|\n");
  if (acts.empty()) return;
  uint64_t covered_to = from > 0 ? 0 : acts[0].start_ns;  // the latest end among those before row i
  for (size_t i = 0; i < from; ++i) covered_to = std::max(covered_to, acts[i].end_ns);
  for (size_t i = from; i < acts.size(); ++i) {
    const TraceActivity& a = acts[i];
    const double idle = a.start_ns > covered_to ? static_cast<double>(a.start_ns - covered_to) / 1e3 : 0.0;
    std::fprintf(out, "| %zu | %s | %lld | %.1f | %.2f | %.2f |\n", i - from, a.name.c_str(),
                 static_cast<long long>(a.blocks), static_cast<double>(a.start_ns - acts[from].start_ns) / 1e3,
                 static_cast<double>(a.end_ns - a.start_ns) / 1e3, idle);
    covered_to = std::max(covered_to, a.end_ns);
  }
}

// A trace cut into steps at each start of a marker activity (a kernel that runs once at the start
// of a decode step: LOCUS_KERNEL_TRACE_STEP=embedding_kernel). Each activity is charged the time it
// adds to the device's timeline: from the latest end of the activities before it (or its start,
// after an idle stretch) to its end, so that launches overlapping the previous one's tail count
// once and a step's charges plus its idle time make its wall time. Medians over the whole steps
// (the last marker's step is cut off by the trace's end and left out).
struct StepGroup {
  std::string label;
  std::vector<std::string> names;  // an activity belongs to the first group one of whose names it contains
};
struct StepBreakdown {
  int64_t steps = 0;
  double wall_us = 0, idle_us = 0;           // medians
  std::vector<std::pair<std::string, double>> groups;  // median us charged, in `groups` order, then "other"
};

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline StepBreakdown step_breakdown(std::vector<TraceActivity> acts, const std::string& marker,
                                    const std::vector<StepGroup>& groups) {
  sort_by_start(acts);
  auto group_of = [&](const std::string& name) {
    for (size_t g = 0; g < groups.size(); ++g)
      for (const std::string& n : groups[g].names)
        if (name.find(n) != std::string::npos) return g;
    return groups.size();  // other
  };
  StepBreakdown b;
  std::vector<double> walls, idles;
  std::vector<std::vector<double>> charged(groups.size() + 1);
  std::vector<double> cur(groups.size() + 1, 0.0);
  double idle = 0;
  bool in_step = false;
  uint64_t step_start = 0, covered_to = 0;
  for (const TraceActivity& a : acts) {
    if (a.name.find(marker) != std::string::npos) {
      if (in_step) {  // the previous step ends where this one starts
        const double wall = static_cast<double>(a.start_ns - step_start) / 1e3;
        const double gap = a.start_ns > covered_to ? static_cast<double>(a.start_ns - covered_to) / 1e3 : 0.0;
        walls.push_back(wall);
        idles.push_back(idle + gap);
        for (size_t g = 0; g < cur.size(); ++g) charged[g].push_back(cur[g]);
      }
      in_step = true;
      step_start = covered_to = a.start_ns;
      std::fill(cur.begin(), cur.end(), 0.0);
      idle = 0;
    }
    if (!in_step) continue;
    if (a.start_ns > covered_to) {
      idle += static_cast<double>(a.start_ns - covered_to) / 1e3;
      covered_to = a.start_ns;
    }
    if (a.end_ns > covered_to) {
      cur[group_of(a.name)] += static_cast<double>(a.end_ns - covered_to) / 1e3;
      covered_to = a.end_ns;
    }
  }
  b.steps = static_cast<int64_t>(walls.size());
  b.wall_us = median_of(walls);
  b.idle_us = median_of(idles);
  for (size_t g = 0; g <= groups.size(); ++g)
    b.groups.emplace_back(g < groups.size() ? groups[g].label : "other", median_of(charged[g]));
  return b;
}

inline void print_step_breakdown(FILE* out, const StepBreakdown& b, const std::string& marker) {
  std::fprintf(out, "\nper step (cut at each %s; median of %lld steps): wall %.1f us, device idle %.1f us\n\n",
               marker.c_str(), static_cast<long long>(b.steps), b.wall_us, b.idle_us);
  std::fprintf(out, "| activities | us a step (time added to the timeline) |\n|---|---|\n");
  for (const auto& [label, us] : b.groups) std::fprintf(out, "| %s | %.1f |\n", label.c_str(), us);
  std::fprintf(out, "| idle | %.1f |\n", b.idle_us);
}

// The groups the decode-step breakdown uses: our NVFP4 GEMMs (the streaming kernel, also BF16
// where it runs, and the NVFP4 matrix-vector kernel), the other BF16 GEMMs (cuBLAS(Lt) and our
// BF16 matrix-vector kernel), attention, MoE routing and combines, host<->device copies and
// memsets.
inline std::vector<StepGroup> decode_step_groups() {
  return {{"NVFP4 GEMM (experts and MLP: stream_gemm, nvfp4_gemv)", {"stream_gemm", "nvfp4_gemv"}},
          {"BF16 GEMM (cuBLAS(Lt), bf16_gemv)", {"nvjet", "cublas", "gemm", "bf16_gemv"}},
          {"attention", {"attn_"}},
          {"MoE routing and combine", {"moe_", "topk", "combine_kernel", "count_kernel", "scan_kernel", "gather"}},
          {"copies, uploads, memsets", {"[memcpy", "[memset", "host_copy"}}};
}

}  // namespace locus::bench
