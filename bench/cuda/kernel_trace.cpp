// A kernel tracer for any CUDA program, through CUPTI's activity API (the device has no Nsight
// Systems): LD_PRELOAD=libcuda_kernel_trace.so LOCUS_KERNEL_TRACE=FILE prog ... records every
// kernel, copy and memset the device runs, and at exit writes to FILE ("-": stderr) where the
// device time went (kernel_trace_summary.h): per kernel name its calls and time, the time the
// device was busy and the idle gaps. LOCUS_KERNEL_TRACE_LAST_MS=N keeps only the activities that
// start in the last N ms (e.g. the timed decode of `locus generate --warmup`, after its warm-up
// and prefill); LOCUS_KERNEL_TRACE_SEQUENCE=N also lists the last N activities one by one (a
// decode step launch by launch), and LOCUS_KERNEL_TRACE_STEP=NAME the median step cut at each
// start of kernel NAME, by group (step_breakdown). Without LOCUS_KERNEL_TRACE the library does
// nothing.
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernel_trace_summary.h"

namespace {

using locus::bench::TraceActivity;

constexpr size_t kBufferBytes = 8u << 20;

std::mutex g_mutex;
std::vector<TraceActivity>* g_acts = nullptr;               // leaked on purpose: used at exit
std::unordered_map<const char*, std::string>* g_names = nullptr;  // CUPTI's name pointers are stable
bool g_exit_registered = false;

const std::string& kernel_name(const char* mangled) {
  auto it = g_names->find(mangled);
  if (it != g_names->end()) return it->second;
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return g_names->emplace(mangled, locus::bench::short_kernel_name(status == 0 && d ? d.get() : mangled)).first->second;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    default: return "[memcpy other]";
  }
}

void write_summary();

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  {
    // Registered here, after the CUDA runtime registered its own teardown, so that it runs first.
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_exit_registered) {
      g_exit_registered = true;
      std::atexit(write_summary);
    }
  }
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(rec);
        g_acts->push_back({kernel_name(k->name), k->start, k->end,
                           static_cast<int64_t>(k->gridX) * k->gridY * k->gridZ});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(rec);
        g_acts->push_back({copy_kind(m->copyKind), m->start, m->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(rec);
        g_acts->push_back({"[memset]", m->start, m->end});
        break;
      }
      default: break;
    }
  }
  std::free(buffer);
}

double last_ms() {
  const char* v = std::getenv("LOCUS_KERNEL_TRACE_LAST_MS");
  return v ? std::atof(v) : 0.0;
}

size_t sequence_length() {
  const char* v = std::getenv("LOCUS_KERNEL_TRACE_SEQUENCE");
  return v ? static_cast<size_t>(std::max(0L, std::atol(v))) : 0;
}

void write_summary() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::vector<TraceActivity> acts;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    acts = *g_acts;
  }
  const std::string path = std::getenv("LOCUS_KERNEL_TRACE");
  FILE* out = path == "-" ? stderr : std::fopen(path.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "kernel trace: cannot write %s\n", path.c_str());
    return;
  }
  locus::bench::print_trace_summary(out, locus::bench::summarize_trace(acts, last_ms()), last_ms());
  if (const char* marker = std::getenv("LOCUS_KERNEL_TRACE_STEP"); marker && *marker)
    locus::bench::print_step_breakdown(
        out, locus::bench::step_breakdown(acts, marker, locus::bench::decode_step_groups()), marker);
  if (const size_t n = sequence_length(); n > 0) locus::bench::print_trace_sequence(out, std::move(acts), n);
  if (out != stderr) std::fclose(out);
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel trace: %s failed: %s\n", what, msg ? msg : "?");
  return false;
}

__attribute__((constructor)) void start_trace() {
  const char* path = std::getenv("LOCUS_KERNEL_TRACE");
  if (!path || !*path) return;
  g_acts = new std::vector<TraceActivity>();
  g_names = new std::unordered_map<const char*, std::string>();
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks"))
    return;
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
}

}  // namespace
