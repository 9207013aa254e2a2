// Locality setup for the GPU module tests: an enabled policy over 2 emulated domains
// (green-context SM partitions of cuda:0), and module contexts with locality on or off.
#pragma once
#include <memory>
#include <string>

#include "locality/domain_place.h"
#include "locality/planner.h"
#include "locality/topology.h"
#include "modules/module.h"

namespace locus::testing {

class CudaLdSetup {
 public:
  // Needs a GPU: call after LOCUS_REQUIRE_GPU().
  void init(int domains = 2) {
    const locality::Topology topo = locality::resolve_topology(Device::cuda(0), domains);
    locality::LocalityDomainPolicy pol;
    pol.enabled = true;
    planner_ = std::make_shared<locality::Planner>(pol, topo);
    runtime_ = locality::shared_locality_runtime(topo);
  }
  // ld == false: no planner and no runtime (locality off).
  modules::ModuleContext ctx(const std::string& name, bool ld, Device d) const {
    modules::ModuleContext c;
    c.device = d;
    c.name = name;
    if (ld) {
      c.planner = planner_;
      c.runtime = runtime_;
    }
    return c;
  }

 private:
  std::shared_ptr<locality::Planner> planner_;
  std::shared_ptr<const locality::LocalityRuntime> runtime_;
};

}  // namespace locus::testing
