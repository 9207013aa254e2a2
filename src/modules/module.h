// What every module shares: the context it is built in (device, planner, locality runtime, its
// full name), its lifecycle state, memory accounting and the plans it made.
//
// Lifecycle (DESIGN.md section 4), identical for every module:
//   EMPTY --load(piece, t)...--> LOADED --transform()--> TRANSFORMED --localize()--> LOCALIZED
// - load() stages one checkpoint tensor by its name relative to the module ("q_a_proj.weight",
//   "experts.3.gate_proj.weight"); pieces of one fused weight may arrive in separate calls. The
//   module copies what it keeps (it never aliases the caller's buffer, e.g. an mmap).
// - transform(): fusions, quantization preparation, MLA absorption. Needs every piece loaded.
// - localize(): per the planner's plan, one shard per locality domain in that domain's memory
//   (DomainPlace::allocate); the full weight is released. Without an enabled plan nothing moves.
// - reload(weights): rewrites the current weights IN PLACE (shards or full weights keep their data
//   pointers, so captured CUDA graphs stay valid) and rebuilds derived state. All inputs are
//   validated before anything is written: a bad shape/dtype throws and leaves the old weights.
// - rebuild(): recomputes derived state (absorbed weights, per-half views) from the weights held.
// Every transition is idempotent: transform/localize twice, or reload with the same weights,
// changes nothing. forward() works from TRANSFORMED on.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "locality/domain_place.h"
#include "locality/planner.h"

namespace locus::modules {

enum class LifecycleState { kEmpty, kLoaded, kTransformed, kLocalized };
const char* lifecycle_state_name(LifecycleState s);  // "EMPTY", "LOADED", ...

// Weights by name relative to a module (same names as load()).
using WeightMap = std::map<std::string, Tensor>;

// Bytes of weight memory a module holds, in total and per locality domain
// (-1 = memory not placed in a domain: full weights, norms, biases, routers).
struct MemoryUsage {
  int64_t total_bytes = 0;
  std::map<int, int64_t> per_domain;
  void add(const Tensor& t);  // undefined tensors add nothing
  MemoryUsage& operator+=(const MemoryUsage& o);
  int64_t domain_bytes(int domain) const;  // 0 when none
};

// One planning decision, for `locus plan` and logs.
struct PlanRecord {
  std::string module;  // full name of the op's owner, e.g. "model.layers.3.self_attn.kv_b_proj"
  std::string op;      // "linear", "bmm", "moe"
  locality::Plan plan;
  std::string describe() const;  // "<module> [<op>]: <plan.describe()>"
};

// Passed to every module. planner and runtime may be null (locality domains off): then every
// plan is disabled with a reason saying so. Both outlive the modules built with them.
struct ModuleContext {
  Device device = Device::cpu();
  std::shared_ptr<const locality::Planner> planner;
  std::shared_ptr<const locality::LocalityRuntime> runtime;
  std::string name;  // full module name, "model.layers.3.mlp.experts"
  // Strict mode: locality execution was requested explicitly for this model. A module whose quant
  // mode / weight mode the LD path does not support (and that the policy does not exclude) then
  // throws an Error naming both instead of silently falling back.
  bool require_locality = false;

  // The context of a submodule: same device/planner/runtime, name "<name>.<suffix>".
  ModuleContext child(std::string_view suffix) const;
  // True when a planner and runtime are present and the policy is enabled.
  bool locality_enabled() const;
};

class Module {
 public:
  explicit Module(ModuleContext ctx);
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return ctx_.name; }
  const ModuleContext& context() const { return ctx_; }
  Device device() const { return ctx_.device; }
  virtual LifecycleState state() const { return state_; }

  // Stages one tensor by relative name; unknown names, wrong shapes or dtypes throw an Error
  // that names the module, the piece and what was expected.
  virtual void load(const std::string& piece, const Tensor& t) = 0;
  // Relative names still needed before transform() (empty once fully loaded).
  virtual std::vector<std::string> missing_pieces() const = 0;
  bool fully_loaded() const { return missing_pieces().empty(); }
  virtual void transform() = 0;
  virtual void localize() = 0;
  virtual void reload(const WeightMap& weights) = 0;
  // Throws exactly as reload(weights) would, without writing anything, so a composite can
  // validate every child before reloading any. Every module in this folder overrides it; the
  // default accepts everything.
  virtual void check_reload(const WeightMap& /*weights*/) const {}
  virtual void rebuild() = 0;
  virtual MemoryUsage memory() const = 0;
  // Appends this module's (and its children's) planning decisions.
  virtual void collect_plans(std::vector<PlanRecord>* /*out*/) const {}

 protected:
  ModuleContext ctx_;
  LifecycleState state_ = LifecycleState::kEmpty;
};

// A composite's reload, split by child. reload_children validates every child's part
// (check_reload) before writing any, so a bad piece anywhere leaves all weights as they were.
using ChildWeights = std::map<Module*, WeightMap>;
void check_children(const ChildWeights& per_child);
void reload_children(const ChildWeights& per_child);

// A disabled plan with `reason` (used when no planner is present or a module refuses to split).
locality::Plan disabled_plan(std::string reason, locality::OpKind op);

}  // namespace locus::modules
