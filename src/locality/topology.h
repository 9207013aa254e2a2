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
  std::string source;                 // "env LOCUS_FAKE_LOCALITY_DOMAINS", "config", "driver", "default"
  std::string describe() const;       // one line for logs and `locus plan`
};

// Resolves the topology. `config_emulate` is the config's locality_domains.emulate (if set).
// Invalid values (0, negative, more domains than SM partitions or threads allow) throw an
// Error that names the source and the limit.
Topology resolve_topology(Device device, std::optional<int> config_emulate = std::nullopt);

}  // namespace locus::locality
