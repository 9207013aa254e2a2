// Topology resolution: env LOCUS_FAKE_LOCALITY_DOMAINS > config emulate > driver > 1 domain.
#include "locality/topology.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <thread>

#include "core/error.h"

#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_device.h"
#endif

namespace locus::locality {

namespace {

constexpr const char* kFakeEnv = "LOCUS_FAKE_LOCALITY_DOMAINS";
constexpr const char* kSplitEnv = "LOCUS_LOCALITY_SPLIT";

// The explicit emulation request, with where it came from, or nullopt.
struct EmulateRequest {
  int count;
  std::string source;
};

std::optional<EmulateRequest> emulate_request(std::optional<int> config_emulate) {
  const char* env = std::getenv(kFakeEnv);
  if (env != nullptr && env[0] != '\0') {  // an empty variable counts as unset
    return EmulateRequest{parse_domain_count(env, kFakeEnv), str("env ", kFakeEnv)};
  }
  if (config_emulate) {
    const int n = *config_emulate;
    LOCUS_CHECK(n >= 1 && n <= kMaxLocalityDomains, "config locality_domains.emulate must be in [1, ",
                kMaxLocalityDomains, "], got ", n);
    return EmulateRequest{n, "config locality_domains.emulate"};
  }
  return std::nullopt;
}

// Worker threads the CPU backend may use: LOCUS_NUM_THREADS when set (the global pool honours it
// too), else the hardware concurrency.
int cpu_total_threads() {
  if (const char* env = std::getenv("LOCUS_NUM_THREADS"); env != nullptr && env[0] != '\0') {
    int v = 0;
    const char* end = env + std::char_traits<char>::length(env);
    auto [ptr, ec] = std::from_chars(env, end, v);
    LOCUS_CHECK(ec == std::errc() && ptr == end && v >= 1,
                "LOCUS_NUM_THREADS must be a positive integer, got '", env, "'");
    return v;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

#if defined(LOCUS_WITH_CUDA)
bool backfill_requested() {
  const char* env = std::getenv(kSplitEnv);
  if (env == nullptr || env[0] == '\0') return false;
  const std::string v = env;
  if (v == "backfill") return true;
  if (v == "aligned") return false;
  LOCUS_THROW(kSplitEnv, " must be 'aligned' or 'backfill', got '", v, "'");
}

Topology cuda_topology(Device device, const std::optional<EmulateRequest>& request) {
  const cuda::DeviceInfo info = cuda::query_device(device.index);
  Topology t;
  t.device = device;
  if (request) {
    const int n = request->count;
    const int gran = std::max(1, info.min_sm_partition);
    const int limit = info.sm_count / gran;
    LOCUS_CHECK(n <= limit, request->source, "=", n, " asks for more domains than ", device.name(), " (",
                info.name, ") can form: ", info.sm_count, " SMs / minimum SM partition ", gran,
                " = at most ", limit, " domains");
    t.num_domains = n;
    t.emulated = true;
    t.source = request->source;
    t.backfill = backfill_requested();
    if (n == 1) {
      t.units_per_domain = {info.sm_count};
    } else {
      // Mirrors create_sm_partitions: the aligned split rounds each group down to the
      // co-scheduling alignment; the backfill split (co-scheduling ignored) to 2 SMs.
      const int align = t.backfill ? 2 : std::max(gran, info.sm_coscheduled_alignment);
      int per = (info.sm_count / n) / align * align;
      per = std::max(per, gran);
      LOCUS_CHECK(per * n <= info.sm_count, request->source, "=", n, " cannot form ", n, " partitions of ",
                  per, " SMs on ", info.sm_count, " SMs");
      t.units_per_domain.assign(n, per);
      t.supplemental_units = info.sm_count - per * n;
    }
    return t;
  }
  if (info.locality_domain_count > 1) {
    LOCUS_CHECK(info.locality_domain_sm_count > 0, "driver reports ", info.locality_domain_count,
                " locality domains on ", device.name(), " but 0 SMs per domain");
    t.num_domains = info.locality_domain_count;
    t.units_per_domain.assign(t.num_domains, info.locality_domain_sm_count);
    t.supplemental_units = std::max(0, info.sm_count - t.num_domains * info.locality_domain_sm_count);
    t.source = "driver";
    return t;
  }
  t.num_domains = 1;
  t.units_per_domain = {info.sm_count};
  t.source = "default";
  return t;
}
#endif

}  // namespace

int parse_domain_count(const std::string& text, const std::string& what) {
  int v = 0;
  const char* begin = text.data();
  const char* end = begin + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, v);
  LOCUS_CHECK(!text.empty() && ec == std::errc() && ptr == end,
              what, " must be a positive integer number of locality domains, got '", text, "'");
  LOCUS_CHECK(v >= 1, what, " must be at least 1, got ", v);
  LOCUS_CHECK(v <= kMaxLocalityDomains, what, "=", v, " exceeds the maximum of ", kMaxLocalityDomains,
              " locality domains");
  return v;
}

Topology cpu_topology(int total_threads, int domains, const std::string& source) {
  LOCUS_CHECK(domains >= 1 && domains <= kMaxLocalityDomains, "CPU topology: domain count must be in [1, ",
              kMaxLocalityDomains, "], got ", domains);
  LOCUS_CHECK(total_threads >= 1, "CPU topology: needs at least one thread, got ", total_threads);
  Topology t;
  t.device = Device::cpu();
  t.num_domains = domains;
  t.source = source;
  if (domains > total_threads) {
    t.units_per_domain.assign(domains, 1);  // oversubscribed: still one worker group per domain
  } else {
    const int base = total_threads / domains, extra = total_threads % domains;
    for (int d = 0; d < domains; ++d) t.units_per_domain.push_back(base + (d < extra ? 1 : 0));
  }
  return t;
}

Topology resolve_topology(Device device, std::optional<int> config_emulate) {
  const std::optional<EmulateRequest> request = emulate_request(config_emulate);
  if (device.is_cpu()) {
    Topology t = request ? cpu_topology(cpu_total_threads(), request->count, request->source)
                         : cpu_topology(cpu_total_threads(), 1, "default");
    t.emulated = request.has_value();
    return t;
  }
#if defined(LOCUS_WITH_CUDA)
  return cuda_topology(device, request);
#else
  LOCUS_THROW("resolve_topology: ", device.name(), " needs the CUDA backend, which this build does not have");
#endif
}

std::string Topology::describe() const {
  const char* unit = device.is_cpu() ? "threads" : "SMs";
  std::string s = str(device.name(), ": ", num_domains, num_domains == 1 ? " locality domain" : " locality domains",
                      " (", source, emulated ? ", emulated" : "", backfill ? ", backfill split" : "", "); ", unit,
                      " per domain:");
  for (int u : units_per_domain) s += str(" ", u);
  if (supplemental_units > 0) s += str("; ", supplemental_units, " supplemental ", unit);
  return s;
}

}  // namespace locus::locality
