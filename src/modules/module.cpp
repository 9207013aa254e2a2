#include "modules/module.h"

namespace locus::modules {

const char* lifecycle_state_name(LifecycleState s) {
  switch (s) {
    case LifecycleState::kEmpty: return "EMPTY";
    case LifecycleState::kLoaded: return "LOADED";
    case LifecycleState::kTransformed: return "TRANSFORMED";
    case LifecycleState::kLocalized: return "LOCALIZED";
  }
  return "invalid";
}

void MemoryUsage::add(const Tensor& t) {
  if (!t.defined()) return;
  const int64_t b = static_cast<int64_t>(t.nbytes());
  total_bytes += b;
  per_domain[t.domain()] += b;
}

MemoryUsage& MemoryUsage::operator+=(const MemoryUsage& o) {
  total_bytes += o.total_bytes;
  for (const auto& [d, b] : o.per_domain) per_domain[d] += b;
  return *this;
}

int64_t MemoryUsage::domain_bytes(int domain) const {
  auto it = per_domain.find(domain);
  return it == per_domain.end() ? 0 : it->second;
}

std::string PlanRecord::describe() const { return str(module, " [", op, "]: ", plan.describe()); }

ModuleContext ModuleContext::child(std::string_view suffix) const {
  ModuleContext c = *this;
  c.name = name.empty() ? std::string(suffix) : str(name, ".", suffix);
  return c;
}

bool ModuleContext::locality_enabled() const { return planner && runtime && planner->policy().enabled; }

Module::Module(ModuleContext ctx) : ctx_(std::move(ctx)) {}

void check_children(const ChildWeights& per_child) {
  for (const auto& [child, w] : per_child) child->check_reload(w);
}

void reload_children(const ChildWeights& per_child) {
  check_children(per_child);
  for (const auto& [child, w] : per_child) child->reload(w);
}

locality::Plan disabled_plan(std::string reason, locality::OpKind op) {
  locality::Plan p;
  p.enabled = false;
  p.reason = std::move(reason);
  p.op = op;
  return p;
}

}  // namespace locus::modules
