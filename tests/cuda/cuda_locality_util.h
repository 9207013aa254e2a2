// Locality domains for the GPU module tests: N emulated domains (green-context SM partitions)
// under an enabled policy, and module contexts with or without them.
#pragma once
#include <memory>
#include <string>

#include "locality/domain_place.h"
#include "locality/planner.h"
#include "locality/topology.h"
#include "modules/module.h"

namespace locus::testing {

struct CudaLocality {
  locality::Topology topo;
  std::shared_ptr<locality::Planner> planner;
  std::shared_ptr<const locality::LocalityRuntime> runtime;

  // Needs a GPU (call after LOCUS_REQUIRE_GPU()).
  static CudaLocality emulated(int domains) {
    CudaLocality l;
    l.topo = locality::resolve_topology(Device::cuda(0), domains);
    locality::LocalityDomainPolicy pol;
    pol.enabled = true;
    l.planner = std::make_shared<locality::Planner>(pol, l.topo);
    l.runtime = locality::shared_locality_runtime(l.topo);
    return l;
  }

  // A context on `device`; with `ld` the module plans and places its weights over the domains.
  modules::ModuleContext ctx(const std::string& name, bool ld, Device device) const {
    modules::ModuleContext c;
    c.device = device;
    c.name = name;
    if (ld) {
      c.planner = planner;
      c.runtime = runtime;
    }
    return c;
  }
};

}  // namespace locus::testing
