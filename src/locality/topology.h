// Locality-domain topology of one device: how many domains, how many SMs (CUDA) or worker
// threads (CPU) each holds. Resolution order (DESIGN.md section 1):
//   LOCUS_FAKE_LOCALITY_DOMAINS=N  >  config `locality_domains.emulate: N`  >
//   the driver's CUDA 13.4+ attributes (looked up at run time)  >  1 domain.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace locus::locality {

struct Topology {
  Device device;
  int num_domains = 1;
  std::vector<int> units_per_domain;  // SMs or worker threads, one entry per domain
  int supplemental_units = 0;         // SMs not assigned to any domain (backfill candidates)
  bool emulated = false;              // true when the domains are an emulation (fake N)
  // CUDA emulation only: split ignoring SM co-scheduling (H200: 2 x 66, no SMs left over) instead
  // of the aligned split (2 x 64 + 4 supplemental). Chosen by LOCUS_LOCALITY_SPLIT=backfill|aligned.
  bool backfill = false;
  std::string source;                 // "env LOCUS_FAKE_LOCALITY_DOMAINS", "config", "driver", "default"
  std::string describe() const;       // one line for logs and `locus plan`
};

// Resolves the topology. `config_emulate` is the config's locality_domains.emulate (if set).
// Invalid values (0, negative, more domains than SM partitions or threads allow) throw an
// Error that names the source and the limit.
Topology resolve_topology(Device device, std::optional<int> config_emulate = std::nullopt);

// The CPU topology for `total_threads` worker threads split into `domains` groups (the first
// groups take the extra threads; with more domains than threads every domain gets one thread).
// Throws when domains < 1 or domains > kMaxLocalityDomains.
Topology cpu_topology(int total_threads, int domains, const std::string& source);

// Upper bound on any domain count (a guard against typos such as 1000; real GPUs have 1 or 2).
inline constexpr int kMaxLocalityDomains = 64;

// Strict parse of a domain count given as text ("2"); throws an Error naming `what` (e.g.
// "LOCUS_FAKE_LOCALITY_DOMAINS") for "", "two", "2x", 0, negatives and values above the maximum.
int parse_domain_count(const std::string& text, const std::string& what);

}  // namespace locus::locality
