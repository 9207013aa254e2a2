// Linear: staged loading, transform, localization into per-domain shards, in-place reload and
// the forward dispatch onto the gemm / nvfp4 ops (partitioned or not).
#include "modules/linear.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "locality/shards.h"
#include "ops/gemm.h"
#include "ops/norm.h"

namespace locus::modules {

using locality::QuantKind;
using locality::WeightMode;

namespace {

bool is_nvfp4(const LinearConfig& c) { return c.quant == QuantKind::kNVFP4; }
bool is_fused(const LinearConfig& c) { return c.mode == WeightMode::kFusedGateUp; }

// The same bytes seen as another 1-byte dtype (u8 <-> fp4x2 / e4m3); shares t's storage.
Tensor reinterpret(const Tensor& t, DType d) {
  if (t.dtype() == d) return t;
  return Tensor::from_blob_strided(t.data_ptr(), t.shape(), t.strides(), d, t.device(), t.storage());
}

// Copies src (bf16 or fp32, any device) into the bf16 tensor dst.
void copy_as_bf16(Tensor dst, const Tensor& src) {
  if (src.dtype() == DType::kBF16) {
    dst.copy_(src);
    return;
  }
  Tensor tmp = Tensor::empty(src.shape(), DType::kBF16, src.device());
  ops::cast(src, tmp);
  dst.copy_(tmp);
}

float read_scalar(const Tensor& t) {
  Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  return c.data<float>()[0];
}

// Counts each storage once (views and aliases of one allocation count one time).
struct MemoryCounter {
  std::set<const Storage*> seen;
  MemoryUsage usage;
  void add(const Tensor& t) {
    if (!t.defined() || !seen.insert(t.storage().get()).second) return;
    const int64_t b = static_cast<int64_t>(t.storage()->bytes);
    usage.total_bytes += b;
    usage.per_domain[t.domain()] += b;
  }
  void add(const ops::Nvfp4Weight& w) {
    add(w.packed);
    add(w.scales);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// construction and plan

Linear::Linear(ModuleContext ctx, LinearConfig cfg) : Module(std::move(ctx)), cfg_(std::move(cfg)) {
  LOCUS_CHECK(cfg_.in_features >= 1 && cfg_.out_features >= 1, "Linear '", name(),
              "': in_features and out_features must be positive, got ", cfg_.in_features, " and ", cfg_.out_features);
  LOCUS_CHECK(cfg_.quant == QuantKind::kBF16 || cfg_.quant == QuantKind::kNVFP4, "Linear '", name(),
              "': weights must be bf16 or nvfp4, got ", locality::quant_kind_name(cfg_.quant));
  LOCUS_CHECK(cfg_.mode == WeightMode::kVanilla || cfg_.mode == WeightMode::kFusedGateUp, "Linear '", name(),
              "': weight mode ", locality::weight_mode_name(cfg_.mode), " is not supported (VANILLA, FUSED_GATE_UP)");
  LOCUS_CHECK(!(cfg_.bias && is_fused(cfg_)), "Linear '", name(), "': FUSED_GATE_UP takes no bias");
  LOCUS_CHECK(!is_nvfp4(cfg_) || cfg_.in_features % 16 == 0, "Linear '", name(), "': NVFP4 needs in_features % 16 == 0, got ",
              cfg_.in_features);
  const locality::OpKind op = is_nvfp4(cfg_) ? locality::OpKind::kNvfp4Linear : locality::OpKind::kBf16Linear;
  if (!cfg_.partitionable) {
    plan_ = disabled_plan(cfg_.unpartitioned_reason, op);
  } else if (!ctx_.planner) {
    plan_ = disabled_plan("locality domains off (no planner in the module context)", op);
  } else {
    plan_ = ctx_.planner->plan_linear(name(), cfg_.in_features, cfg_.out_features, cfg_.quant, cfg_.mode);
    if (!plan_.enabled && is_fused(cfg_)) {
      // The fused split was refused; the same rules may still split [gate | up] as plain rows.
      locality::Plan alt = ctx_.planner->plan_linear(name(), cfg_.in_features, 2 * cfg_.out_features, cfg_.quant,
                                                     WeightMode::kVanilla);
      if (alt.enabled) {
        alt.reason = "fused gate/up split refused (" + plan_.reason +
                     "); [gate | up] rows split as VANILLA, SwiGLU applied after the join";
        plan_ = std::move(alt);
        unfused_split_ = true;
      }
    }
    if (plan_.enabled && !ctx_.runtime) {
      plan_ = disabled_plan("no locality runtime in the module context", op);
    }
  }
  plan_.module = name();
  check_strict();
  for (const std::string& p : required_pieces()) have_[p] = false;
}

void Linear::check_strict() const {
  if (!ctx_.require_locality || plan_.enabled || !cfg_.partitionable || !ctx_.planner) return;
  const auto& policy = ctx_.planner->policy();
  if (!policy.enabled || !policy.excluding_pattern(name()).empty()) return;
  LOCUS_THROW("Linear '", name(), "': locality-domain execution was required, but ", locality::quant_kind_name(cfg_.quant),
              " weights in weight mode ", locality::weight_mode_name(cfg_.mode), " cannot be partitioned: ",
              plan_.reason);
}

int64_t Linear::weight_rows() const { return cfg_.out_features * (is_fused(cfg_) ? 2 : 1); }

void Linear::set_plan(locality::Plan plan) {
  LOCUS_CHECK(state_ != LifecycleState::kLocalized, "Linear '", name(), "': set_plan() after localize()");
  if (plan.enabled) {
    LOCUS_CHECK(!(is_nvfp4(cfg_) && state_ == LifecycleState::kTransformed && !q_packed_.defined()), "Linear '", name(),
                "': set_plan() with an enabled plan must come before transform() for NVFP4 weights");
    LOCUS_CHECK(ctx_.runtime, "Linear '", name(), "': an enabled plan needs a locality runtime in the context");
    LOCUS_CHECK(plan.layout.n == cfg_.out_features && plan.layout.fused_gate_up == is_fused(cfg_) &&
                    plan.layout.num_partitions() >= 1,
                "Linear '", name(), "': plan layout ", plan.layout.describe(), " (n=", plan.layout.n,
                ", fused_gate_up=", plan.layout.fused_gate_up, ") does not fit out_features=", cfg_.out_features,
                " in mode ", locality::weight_mode_name(cfg_.mode));
  }
  plan_ = std::move(plan);
  plan_.module = name();
}

bool Linear::partitioned() const { return state_ == LifecycleState::kLocalized && plan_.enabled; }
int Linear::num_partitions() const { return partitioned() ? plan_.layout.num_partitions() : 1; }

Stream Linear::partition_stream(int p) const { return ctx_.runtime->place_for_partition(p).stream(); }

std::vector<ops::PartitionSlice> Linear::slices() const { return locality::partition_slices(plan_.layout, *ctx_.runtime); }

void Linear::collect_plans(std::vector<PlanRecord>* out) const { out->push_back({name(), "linear", plan_}); }

// ---------------------------------------------------------------------------------------------
// pieces

std::vector<std::string> Linear::required_pieces() const {
  std::vector<std::string> r;
  if (!is_fused(cfg_)) {
    r = is_nvfp4(cfg_) ? std::vector<std::string>{"weight", "weight_scale", "weight_scale_2"}
                       : std::vector<std::string>{"weight"};
    if (cfg_.bias) r.push_back("bias");
  } else if (is_nvfp4(cfg_)) {
    r = {"gate.weight", "gate.weight_scale", "gate.weight_scale_2", "up.weight", "up.weight_scale", "up.weight_scale_2"};
  } else {
    r = {"gate", "up"};
  }
  return r;
}

// Canonical name of an accepted piece; "" for pieces accepted and ignored (input_scale).
std::string Linear::canonical_piece(const std::string& piece) const {
  if (piece == "input_scale" || piece == "gate.input_scale" || piece == "up.input_scale") return "";
  if (is_fused(cfg_) && !is_nvfp4(cfg_)) {
    if (piece == "gate" || piece == "gate.weight") return "gate";
    if (piece == "up" || piece == "up.weight") return "up";
    if (piece == "weight") return "weight";
  } else {
    for (const std::string& r : required_pieces())
      if (piece == r) return r;
    if (is_fused(cfg_) && (piece == "weight" || piece == "weight_scale" || piece == "weight_scale_2")) return piece;
  }
  std::string accepted;
  for (const std::string& r : required_pieces()) accepted += (accepted.empty() ? "" : ", ") + r;
  if (is_fused(cfg_)) accepted += is_nvfp4(cfg_) ? ", weight, weight_scale, weight_scale_2" : ", weight";
  LOCUS_THROW("Linear '", name(), "': unknown weight piece '", piece, "' (accepted: ", accepted, ", input_scale)");
}

void Linear::check_piece(const std::string& c, const Tensor& t) const {
  LOCUS_CHECK(t.defined(), "Linear '", name(), "': piece '", c, "' is an undefined tensor");
  const int64_t K = cfg_.in_features, I = cfg_.out_features;
  const bool half = c.rfind("gate", 0) == 0 || c.rfind("up", 0) == 0;
  const int64_t rows = half ? I : weight_rows();
  auto want = [&](const Shape& shape, std::initializer_list<DType> dtypes) {
    bool ok_dtype = false;
    for (DType d : dtypes) ok_dtype |= t.dtype() == d;
    std::string names;
    for (DType d : dtypes) names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
    LOCUS_CHECK(t.shape() == shape && ok_dtype, "Linear '", name(), "': piece '", c, "' must be ", names,
                shape_to_string(shape), ", got ", t.describe());
  };
  const std::string base = c.substr(c.find('.') == std::string::npos ? 0 : c.find('.') + 1);
  if (c == "bias") {
    want({cfg_.out_features}, {DType::kBF16, DType::kFP32});
  } else if (!is_nvfp4(cfg_)) {
    want({rows, K}, {DType::kBF16, DType::kFP32});
  } else if (base == "weight") {
    want({rows, K / 2}, {DType::kU8, DType::kFP4E2M1x2});
  } else if (base == "weight_scale") {
    want({rows, K / 16}, {DType::kFP8E4M3, DType::kU8});
  } else if (base == "weight_scale_2") {
    LOCUS_CHECK(t.dtype() == DType::kFP32 && t.numel() == 1 && t.dim() <= 1, "Linear '", name(), "': piece '", c,
                "' must be an fp32 scalar (0-d or [1]), got ", t.describe());
    const float g = read_scalar(t);
    LOCUS_CHECK(std::isfinite(g) && g > 0.f, "Linear '", name(), "': piece '", c, "' must be a positive finite scale, got ", g);
  }
}

// Writes one validated piece into `a`, allocating its targets on first use.
void Linear::stage_piece(const std::string& c, const Tensor& t, Assembled* a) {
  const int64_t K = cfg_.in_features, I = cfg_.out_features, rows = weight_rows();
  if (c == "bias") {
    if (!a->bias.defined()) a->bias = Tensor::empty({cfg_.out_features}, t.dtype(), device());
    if (a->bias.dtype() != t.dtype()) a->bias = Tensor::empty({cfg_.out_features}, t.dtype(), device());
    a->bias.copy_(t);
    return;
  }
  if (!is_nvfp4(cfg_)) {
    if (!a->dense.defined()) a->dense = Tensor::empty({rows, K}, DType::kBF16, device());
    if (c == "weight") copy_as_bf16(a->dense, t);
    else if (c == "gate") copy_as_bf16(a->dense.slice(0, 0, I), t);
    else copy_as_bf16(a->dense.slice(0, I, 2 * I), t);
    return;
  }
  const bool gate = c.rfind("gate.", 0) == 0, up = c.rfind("up.", 0) == 0;
  const std::string base = gate || up ? c.substr(c.find('.') + 1) : c;
  const int64_t r0 = up ? I : 0, r1 = gate ? I : rows;
  if (base == "weight_scale_2") {
    const float g = read_scalar(t);
    if (!up) a->g_first = g;
    if (!gate) a->g_second = is_fused(cfg_) ? g : 0.f;
    return;
  }
  if (base == "weight") {
    if (!a->packed.defined()) a->packed = Tensor::empty({rows, K / 2}, DType::kFP4E2M1x2, Device::cpu());
    a->packed.slice(0, r0, r1).copy_(reinterpret(t, DType::kFP4E2M1x2));
  } else {
    if (!a->scales.defined()) a->scales = Tensor::empty({rows, K / 16}, DType::kFP8E4M3, Device::cpu());
    a->scales.slice(0, r0, r1).copy_(reinterpret(t, DType::kFP8E4M3));
  }
}

void Linear::load(const std::string& piece, const Tensor& t) {
  LOCUS_CHECK(state_ == LifecycleState::kEmpty || state_ == LifecycleState::kLoaded, "Linear '", name(), "': load('",
              piece, "') in state ", lifecycle_state_name(state_), "; use reload() once transformed");
  const std::string c = canonical_piece(piece);
  if (c.empty()) return;
  check_piece(c, t);
  stage_piece(c, t, &staged_);
  // A fused-form piece ("weight", ...) covers the gate and up halves at once.
  if (have_.count(c)) {
    have_[c] = true;
  } else {
    for (auto& [k, v] : have_)
      if (k.substr(k.find('.') + 1) == c || (c == "weight" && (k == "gate" || k == "up"))) v = true;
  }
  if (missing_pieces().empty()) state_ = LifecycleState::kLoaded;
}

std::vector<std::string> Linear::missing_pieces() const {
  std::vector<std::string> m;
  if (state_ != LifecycleState::kEmpty) return m;
  for (const auto& [k, v] : have_)
    if (!v) m.push_back(k);
  return m;
}

// ---------------------------------------------------------------------------------------------
// transform / localize

ops::Nvfp4Weight Linear::host_nvfp4(const Tensor& packed, const Tensor& scales, int64_t row0, int64_t row1,
                                    float global) const {
  ops::Nvfp4Weight w;
  w.packed = packed.slice(0, row0, row1);
  w.scales = scales.slice(0, row0, row1);
  w.global_scale = global;
  w.layout = ops::Nvfp4Layout::kLinear;
  w.n = row1 - row0;
  w.k = cfg_.in_features;
  return w;
}

// Device weights of the full (unpartitioned) NVFP4 weight from the checkpoint-layout tensors.
void Linear::build_nvfp4_units(const Tensor& packed, const Tensor& scales) {
  const int64_t I = cfg_.out_features, rows = weight_rows();
  nv_.clear();
  nv_gate_.clear();
  nv_up_.clear();
  // The CPU kernel reads the checkpoint layout: the staged host tensors are used as they are.
  auto prepare = [&](const ops::Nvfp4Weight& w) { return device().is_cpu() ? w : ops::nvfp4_prepare(w, device()); };
  if (per_half_) {
    nv_gate_.push_back(prepare(host_nvfp4(packed, scales, 0, I, g_first_)));
    nv_up_.push_back(prepare(host_nvfp4(packed, scales, I, 2 * I, g_second_)));
  } else {
    nv_.push_back(prepare(host_nvfp4(packed, scales, 0, rows, g_first_)));
  }
}

void Linear::transform() {
  if (state_ == LifecycleState::kTransformed || state_ == LifecycleState::kLocalized) return;
  const std::vector<std::string> missing = missing_pieces();
  if (!missing.empty()) {
    std::string m;
    for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
    LOCUS_THROW("Linear '", name(), "': transform() before every piece was loaded; missing: ", m);
  }
  bias_ = staged_.bias;
  if (!is_nvfp4(cfg_)) {
    full_ = staged_.dense;
  } else {
    q_packed_ = staged_.packed;
    q_scales_ = staged_.scales;
    g_first_ = staged_.g_first;
    g_second_ = staged_.g_second;
    per_half_ = is_fused(cfg_) && g_first_ != g_second_;
    if (per_half_ && unfused_split_ && plan_.enabled) {
      for (const auto& r : plan_.layout.parts) {
        if (r.n0 < cfg_.out_features && r.n1 > cfg_.out_features) {
          plan_ = disabled_plan(str("gate and up have different NVFP4 global scales and partition [", r.n0, ", ", r.n1,
                                    ") of the unfused [gate | up] split straddles the boundary at ", cfg_.out_features,
                                    " (", plan_.reason, ")"),
                                plan_.op);
          plan_.module = name();
          unfused_split_ = false;
          break;
        }
      }
    }
    build_nvfp4_units(q_packed_, q_scales_);
    // The host copy is only needed to cut shards from; without an enabled plan it goes now.
    if (!plan_.enabled) release_staging();
  }
  staged_ = {};
  state_ = LifecycleState::kTransformed;
}

void Linear::release_staging() {
  q_packed_ = Tensor();
  q_scales_ = Tensor();
}

void Linear::nvfp4_shard(const Tensor& packed, const Tensor& scales, float g_first, float g_second, int p,
                         ops::Nvfp4Weight* fused, ops::Nvfp4Weight* gate, ops::Nvfp4Weight* up) const {
  const auto& layout = plan_.layout;
  const auto& place = ctx_.runtime->place_for_partition(p);
  const int64_t I = cfg_.out_features;
  if (unfused_split_ && per_half_) {
    // The partition's rows lie in one half (checked at transform()): one unit with that half's scale.
    const auto& r = layout.parts[p];
    *fused = ops::nvfp4_prepare(host_nvfp4(packed, scales, r.n0, r.n1, r.n1 <= I ? g_first : g_second), place.device(),
                                place.domain());
  } else if (per_half_) {
    locality::PartitionedLayout half = layout;
    half.fused_gate_up = false;
    *gate = locality::make_nvfp4_shard(host_nvfp4(packed, scales, 0, I, g_first), half, p, place);
    *up = locality::make_nvfp4_shard(host_nvfp4(packed, scales, I, 2 * I, g_second), half, p, place);
  } else {
    *fused = locality::make_nvfp4_shard(host_nvfp4(packed, scales, 0, weight_rows(), g_first), layout, p, place);
  }
}

void Linear::localize() {
  if (state_ == LifecycleState::kLocalized) return;
  if (state_ != LifecycleState::kTransformed) transform();
  if (!plan_.enabled) {
    release_staging();  // the device weights stay whole; the host copy is not needed any more
    state_ = LifecycleState::kLocalized;
    return;
  }
  const auto& layout = plan_.layout;
  const int parts = layout.num_partitions();
  if (!is_nvfp4(cfg_)) {
    std::vector<Tensor> shards;
    for (int p = 0; p < parts; ++p)
      shards.push_back(locality::make_dense_shard(full_, layout, p, ctx_.runtime->place_for_partition(p)));
    shards_ = std::move(shards);
    full_ = Tensor();
  } else {
    std::vector<ops::Nvfp4Weight> fused, gate, up;
    for (int p = 0; p < parts; ++p) {
      ops::Nvfp4Weight f, g, u;
      nvfp4_shard(q_packed_, q_scales_, g_first_, g_second_, p, &f, &g, &u);
      if (f.packed.defined()) fused.push_back(f);
      if (g.packed.defined()) gate.push_back(g);
      if (u.packed.defined()) up.push_back(u);
    }
    nv_ = std::move(fused);
    nv_gate_ = std::move(gate);
    nv_up_ = std::move(up);
    release_staging();
  }
  state_ = LifecycleState::kLocalized;
}

// ---------------------------------------------------------------------------------------------
// reload / rebuild

Linear::Assembled Linear::assemble(const WeightMap& weights) const {
  std::map<std::string, const Tensor*> pieces;  // canonical -> tensor
  for (const auto& [piece, t] : weights) {
    const std::string c = canonical_piece(piece);
    if (c.empty()) continue;
    check_piece(c, t);
    pieces[c] = &t;
  }
  // Which required pieces are covered (a fused-form piece covers both halves).
  std::vector<std::string> missing;
  for (const std::string& r : required_pieces()) {
    const std::string base = r.substr(r.find('.') == std::string::npos ? 0 : r.find('.') + 1);
    const bool fused_form = is_fused(cfg_) && (is_nvfp4(cfg_) ? pieces.count(base) : pieces.count("weight"));
    if (!pieces.count(r) && !fused_form) missing.push_back(r);
  }
  if (!missing.empty()) {
    std::string m;
    for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
    LOCUS_THROW("Linear '", name(), "': reload is missing pieces: ", m, " (the old weights are unchanged)");
  }
  Assembled a;
  auto* self = const_cast<Linear*>(this);  // stage_piece only writes into `a`
  for (const auto& [c, t] : pieces) self->stage_piece(c, *t, &a);
  if (is_nvfp4(cfg_) && is_fused(cfg_) && state_ != LifecycleState::kEmpty && state_ != LifecycleState::kLoaded) {
    const bool new_per_half = a.g_first != a.g_second;
    LOCUS_CHECK(new_per_half == per_half_, "Linear '", name(), "': reload changes whether gate and up share one global scale (",
                "was ", per_half_ ? "separate" : "shared", ", new gate ", a.g_first, " / up ", a.g_second,
                "); the storage layout was fixed at transform(), the old weights are unchanged");
  }
  if (cfg_.bias && !a.bias.defined()) LOCUS_THROW("Linear '", name(), "': reload is missing the bias");
  return a;
}

void Linear::commit(const Assembled& a) {
  if (state_ == LifecycleState::kEmpty || state_ == LifecycleState::kLoaded) {
    staged_ = a;
    for (auto& [k, v] : have_) v = true;
    state_ = LifecycleState::kLoaded;
    return;
  }
  if (a.bias.defined()) bias_.copy_(a.bias);
  if (!is_nvfp4(cfg_)) {
    if (!partitioned()) {
      full_.copy_(a.dense);
    } else {
      for (size_t p = 0; p < shards_.size(); ++p) {
        const int pi = static_cast<int>(p);
        shards_[p].copy_(locality::make_dense_shard(a.dense, plan_.layout, pi, ctx_.runtime->place_for_partition(pi)));
      }
    }
    return;
  }
  // NVFP4: each unit is rebuilt in a temporary and copied over the existing tensors.
  auto overwrite = [](ops::Nvfp4Weight& dst, const ops::Nvfp4Weight& src) {
    dst.packed.copy_(src.packed);
    dst.scales.copy_(src.scales);
    dst.global_scale = src.global_scale;
  };
  const int64_t I = cfg_.out_features, rows = weight_rows();
  g_first_ = a.g_first;
  g_second_ = a.g_second;
  if (!partitioned()) {
    if (q_packed_.defined()) {  // the host copy (kept until localize) may be the device weight itself
      q_packed_.copy_(a.packed);
      q_scales_.copy_(a.scales);
    }
    if (per_half_) {
      overwrite(nv_gate_[0], ops::nvfp4_prepare(host_nvfp4(a.packed, a.scales, 0, I, a.g_first), device()));
      overwrite(nv_up_[0], ops::nvfp4_prepare(host_nvfp4(a.packed, a.scales, I, 2 * I, a.g_second), device()));
    } else {
      overwrite(nv_[0], ops::nvfp4_prepare(host_nvfp4(a.packed, a.scales, 0, rows, a.g_first), device()));
    }
    return;
  }
  for (int p = 0; p < plan_.layout.num_partitions(); ++p) {
    ops::Nvfp4Weight f, g, u;
    nvfp4_shard(a.packed, a.scales, a.g_first, a.g_second, p, &f, &g, &u);
    if (f.packed.defined()) overwrite(nv_[p], f);
    if (g.packed.defined()) overwrite(nv_gate_[p], g);
    if (u.packed.defined()) overwrite(nv_up_[p], u);
  }
}

void Linear::reload(const WeightMap& weights) {
  Assembled a = assemble(weights);  // validates everything; nothing written yet
  commit(a);
}

void Linear::check_reload(const WeightMap& weights) const { (void)assemble(weights); }

void Linear::rebuild() {
  // Derived state of a Linear: the NVFP4 units' global scales (the tensors are rewritten in place).
  if (!is_nvfp4(cfg_)) return;
  for (size_t p = 0; p < nv_.size(); ++p) {
    // An unfused-split shard of up rows carries up's scale.
    const bool up_rows = unfused_split_ && per_half_ && partitioned() && plan_.layout.parts[p].n0 >= cfg_.out_features;
    nv_[p].global_scale = up_rows ? g_second_ : g_first_;
  }
  for (auto& w : nv_gate_) w.global_scale = g_first_;
  for (auto& w : nv_up_) w.global_scale = g_second_;
}

// ---------------------------------------------------------------------------------------------
// memory / inspection

MemoryUsage Linear::memory() const {
  MemoryCounter c;
  c.add(staged_.dense);
  c.add(staged_.packed);
  c.add(staged_.scales);
  c.add(staged_.bias);
  c.add(full_);
  for (const Tensor& s : shards_) c.add(s);
  c.add(bias_);
  c.add(q_packed_);
  c.add(q_scales_);
  for (const auto* v : {&nv_, &nv_gate_, &nv_up_})
    for (const auto& w : *v) c.add(w);
  return c.usage;
}

std::vector<const void*> Linear::weight_data_ptrs() const {
  std::vector<const void*> out;
  auto add = [&](const Tensor& t) {
    if (t.defined()) out.push_back(t.data_ptr());
  };
  add(full_);
  for (const Tensor& s : shards_) add(s);
  add(bias_);
  for (const auto* v : {&nv_, &nv_gate_, &nv_up_})
    for (const auto& w : *v) {
      add(w.packed);
      add(w.scales);
    }
  return out;
}

Tensor Linear::gather_weight() const {
  LOCUS_CHECK(!is_nvfp4(cfg_), "Linear '", name(), "': gather_weight() is for BF16 weights");
  if (staged_.dense.defined()) return staged_.dense.clone();
  if (full_.defined()) return full_.clone();
  LOCUS_CHECK(!shards_.empty(), "Linear '", name(), "': no weight loaded");
  Tensor out = Tensor::empty({weight_rows(), cfg_.in_features}, DType::kBF16, device());
  const auto& layout = plan_.layout;
  for (int p = 0; p < layout.num_partitions(); ++p) {
    const auto& r = layout.parts[p];
    if (!layout.fused_gate_up) {
      out.slice(0, r.n0, r.n1).copy_(shards_[p]);
    } else {
      out.slice(0, r.n0, r.n1).copy_(shards_[p].slice(0, 0, r.rows()));
      out.slice(0, layout.n + r.n0, layout.n + r.n1).copy_(shards_[p].slice(0, r.rows(), 2 * r.rows()));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// forward

void Linear::check_forward_ready(const char* what) const {
  LOCUS_CHECK(state_ == LifecycleState::kTransformed || state_ == LifecycleState::kLocalized, "Linear '", name(), "': ",
              what, "() in state ", lifecycle_state_name(state_), " (load every piece and call transform() first)");
}

void Linear::forward(const Tensor& x, const Tensor& y, const Stream& stream) const {
  check_forward_ready("forward");
  if (is_fused(cfg_) && (per_half_ || unfused_split_)) return forward_unfused(x, y, stream);
  const bool nv = is_nvfp4(cfg_);
  if (partitioned()) {
    const auto sl = slices();
    if (is_fused(cfg_)) {
      nv ? ops::nvfp4_gemm_swiglu_partitioned(x, nv_, y, sl, stream) : ops::gemm_swiglu_partitioned(x, shards_, y, sl, stream);
    } else {
      nv ? ops::nvfp4_gemm_partitioned(x, nv_, bias_, y, sl, stream) : ops::gemm_partitioned(x, shards_, bias_, y, sl, stream);
    }
    return;
  }
  if (is_fused(cfg_)) {
    nv ? ops::nvfp4_gemm_swiglu(x, nv_[0], y, stream) : ops::gemm_swiglu(x, full_, y, stream);
  } else {
    nv ? ops::nvfp4_gemm(x, nv_[0], bias_, y, stream) : ops::gemm(x, full_, bias_, y, stream);
  }
}

const ops::Nvfp4Weight* Linear::nvfp4_unit(int p) const {
  if (!is_nvfp4(cfg_) || bias_.defined() || (is_fused(cfg_) && (per_half_ || unfused_split_))) return nullptr;
  const int index = partitioned() ? p : p < 0 ? 0 : -1;
  if (index < 0 || index >= static_cast<int>(nv_.size())) return nullptr;
  return &nv_[static_cast<size_t>(index)];
}

void Linear::forward_unfused(const Tensor& x, const Tensor& y, const Stream& stream) const {
  check_forward_ready("forward_unfused");
  LOCUS_CHECK(is_fused(cfg_), "Linear '", name(), "': forward_unfused() needs a FUSED_GATE_UP weight");
  LOCUS_CHECK(x.dim() == 2, "Linear '", name(), "': x must be 2-D, got ", x.describe());
  const int64_t M = x.size(0), I = cfg_.out_features;
  Tensor tmp = Tensor::empty({M, 2 * I}, DType::kFP32, x.device());
  if (unfused_split_ && partitioned()) {
    // Row partitions of [gate | up] write their columns of tmp; SwiGLU needs both halves: after the join.
    if (is_nvfp4(cfg_)) ops::nvfp4_gemm_partitioned(x, nv_, Tensor(), tmp, slices(), stream);
    else ops::gemm_partitioned(x, shards_, Tensor(), tmp, slices(), stream);
    ops::swiglu(tmp, y, stream);
    return;
  }
  // Partition p's products land in columns [2 n0, 2 n1) as [gate_p | up_p]; unpartitioned: [gate | up].
  auto products = [&](int p, int64_t c0, int64_t r, const Stream& s) {
    Tensor out = tmp.slice(1, c0, c0 + 2 * r);
    if (!is_nvfp4(cfg_)) {
      ops::gemm(x, partitioned() ? shards_[p] : full_, Tensor(), out, s);
    } else if (per_half_) {
      ops::nvfp4_gemm(x, nv_gate_[p], Tensor(), out.slice(1, 0, r), s);
      ops::nvfp4_gemm(x, nv_up_[p], Tensor(), out.slice(1, r, 2 * r), s);
    } else {
      ops::nvfp4_gemm(x, nv_[p], Tensor(), out, s);
    }
    ops::swiglu(out, y.slice(1, c0 / 2, c0 / 2 + r), s);
  };
  if (!partitioned()) {
    products(0, 0, I, stream);
    return;
  }
  LOCUS_CHECK(y.dim() == 2 && y.size(1) == I, "Linear '", name(), "': y must be [M, ", I, "], got ", y.describe());
  const auto& layout = plan_.layout;
  ops::run_partitioned(stream, ctx_.runtime->partition_streams(layout.num_partitions()), [&](int p) {
    const auto& r = layout.parts[p];
    products(p, 2 * r.n0, r.rows(), partition_stream(p));
  });
}

void Linear::forward_partition(int p, const Tensor& x, const Tensor& y, const Stream& stream) const {
  check_forward_ready("forward_partition");
  LOCUS_CHECK(partitioned(), "Linear '", name(), "': forward_partition() needs a localized, enabled plan (",
              plan_.describe(), ")");
  LOCUS_CHECK(p >= 0 && p < plan_.layout.num_partitions(), "Linear '", name(), "': partition ", p, " out of range");
  LOCUS_CHECK(!unfused_split_, "Linear '", name(), "': forward_partition() needs a fused gate/up split (", plan_.describe(), ")");
  LOCUS_CHECK(y.dim() == 2 && y.size(1) == cfg_.out_features, "Linear '", name(), "': y must be [M, ",
              cfg_.out_features, "], got ", y.describe());
  const auto& r = plan_.layout.parts[p];
  Tensor ys = y.slice(1, r.n0, r.n1);
  const bool nv = is_nvfp4(cfg_);
  if (!is_fused(cfg_)) {
    Tensor b = bias_.defined() ? bias_.slice(0, r.n0, r.n1) : Tensor();
    nv ? ops::nvfp4_gemm(x, nv_[p], b, ys, stream) : ops::gemm(x, shards_[p], b, ys, stream);
  } else if (!per_half_) {
    nv ? ops::nvfp4_gemm_swiglu(x, nv_[p], ys, stream) : ops::gemm_swiglu(x, shards_[p], ys, stream);
  } else {
    // Scratch from the partition's domain: freed before the join, it must not be handed to
    // another partition's stream while this one may still use it (cuda_hooks.cpp, rule 3).
    Tensor tmp = ctx_.runtime->place_for_partition(p).allocate({x.size(0), 2 * r.rows()}, DType::kFP32);
    ops::nvfp4_gemm(x, nv_gate_[p], Tensor(), tmp.slice(1, 0, r.rows()), stream);
    ops::nvfp4_gemm(x, nv_up_[p], Tensor(), tmp.slice(1, r.rows(), 2 * r.rows()), stream);
    ops::swiglu(tmp, ys, stream);
  }
}

}  // namespace locus::modules
