// MoE: router, grouped expert GEMMs (one per active expert, all partitions inside one fork/join
// per GEMM stage when localized), shared experts and the weighted combine.
#include "modules/moe.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>

#include "core/host_profile.h"
#include "modules/moe_routing_dump.h"
#include "ops/norm.h"
#include "ops/partitioned.h"

namespace locus::modules {

using locality::QuantKind;
using locality::WeightMode;

namespace {

bool parse_index(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *out = std::strtoll(s.c_str(), nullptr, 10);
  return true;
}

}  // namespace

MoE::MoE(ModuleContext ctx, MoeConfig cfg) : Module(std::move(ctx)), cfg_(cfg) {
  const auto& c = cfg_;
  LOCUS_CHECK(c.hidden_size >= 1 && c.intermediate_size >= 1 && c.num_experts >= 1, "MoE '", name(),
              "': hidden_size, intermediate_size and num_experts must be positive");
  LOCUS_CHECK(c.n_group >= 1 && c.num_experts % c.n_group == 0 && c.topk_group >= 1 && c.topk_group <= c.n_group,
              "MoE '", name(), "': n_group=", c.n_group, " must divide num_experts=", c.num_experts,
              " and topk_group=", c.topk_group, " must be in [1, n_group]");
  LOCUS_CHECK(c.top_k >= 1 && c.top_k <= c.topk_group * (c.num_experts / c.n_group), "MoE '", name(), "': top_k=",
              c.top_k, " exceeds the experts of the kept groups (", c.topk_group * (c.num_experts / c.n_group), ")");
  LOCUS_CHECK(c.n_shared_experts >= 0, "MoE '", name(), "': n_shared_experts must be >= 0");

  LinearConfig g;
  g.in_features = c.hidden_size;
  g.out_features = c.num_experts;
  g.partitionable = false;
  g.unpartitioned_reason = "the router gate is never partitioned (its fp32 logits feed one routing decision)";
  gate_ = std::make_unique<Linear>(ctx_.child("gate"), g);

  const std::string experts = name() + ".experts";
  const locality::OpKind op = c.expert_quant == QuantKind::kNVFP4 ? locality::OpKind::kNvfp4Moe : locality::OpKind::kBf16Moe;
  if (!ctx_.planner) experts_plan_ = disabled_plan("locality domains off (no planner in the module context)", op);
  else experts_plan_ = ctx_.planner->plan_moe(experts, c.num_experts, c.hidden_size, c.intermediate_size, c.expert_quant);
  if (experts_plan_.enabled && !ctx_.runtime) experts_plan_ = disabled_plan("no locality runtime in the module context", op);
  experts_plan_.module = experts;
  if (ctx_.require_locality && !experts_plan_.enabled && ctx_.planner && ctx_.planner->policy().enabled &&
      ctx_.planner->policy().excluding_pattern(experts).empty()) {
    LOCUS_THROW("MoE '", name(), "': locality-domain execution was required, but ",
                locality::quant_kind_name(c.expert_quant), " experts with fused SwiGLU cannot be partitioned: ",
                experts_plan_.reason);
  }

  for (int64_t e = 0; e < c.num_experts; ++e) {
    LinearConfig gu;
    gu.in_features = c.hidden_size;
    gu.out_features = c.intermediate_size;
    gu.quant = c.expert_quant;
    gu.mode = WeightMode::kFusedGateUp;
    gu.partitionable = false;  // planned once for all experts (plan_moe), imposed below
    gu.unpartitioned_reason = "expert weights follow the MoE plan: " + experts_plan_.describe();
    LinearConfig dn = gu;
    dn.in_features = c.intermediate_size;
    dn.out_features = c.hidden_size;
    dn.mode = WeightMode::kVanilla;
    const std::string base = str("experts.", e, ".");
    gate_up_.push_back(std::make_unique<Linear>(ctx_.child(base + "gate_up_proj"), gu));
    down_.push_back(std::make_unique<Linear>(ctx_.child(base + "down_proj"), dn));
    if (experts_plan_.enabled) {
      locality::Plan p1 = experts_plan_, p2 = experts_plan_;
      p2.layout = experts_plan_.down_layout;
      p1.down_layout = {};
      p2.down_layout = {};
      gate_up_.back()->set_plan(p1);
      down_.back()->set_plan(p2);
    }
  }
  if (c.n_shared_experts > 0) {
    GatedMlpConfig s;
    s.hidden_size = c.hidden_size;
    s.intermediate_size = c.intermediate_size * c.n_shared_experts;
    s.quant = c.shared_quant;
    shared_ = std::make_unique<GatedMLP>(ctx_.child("shared_experts"), s);
  }
}

ops::MoeRoutingConfig MoE::routing_config() const {
  ops::MoeRoutingConfig r;
  r.num_experts = cfg_.num_experts;
  r.top_k = cfg_.top_k;
  r.n_group = cfg_.n_group;
  r.topk_group = cfg_.topk_group;
  r.norm_topk_prob = cfg_.norm_topk_prob;
  r.routed_scaling_factor = cfg_.routed_scaling_factor;
  r.scoring = cfg_.scoring;
  return r;
}

std::vector<Module*> MoE::children() const {
  std::vector<Module*> out{gate_.get()};
  for (size_t e = 0; e < gate_up_.size(); ++e) {
    out.push_back(gate_up_[e].get());
    out.push_back(down_[e].get());
  }
  if (shared_) out.push_back(shared_.get());
  return out;
}

LifecycleState MoE::state() const {
  LifecycleState s = LifecycleState::kLocalized;
  for (Module* m : children()) s = std::min(s, m->state());
  if (cfg_.correction_bias && !bias_.defined()) s = LifecycleState::kEmpty;
  return s;
}

bool MoE::experts_partitioned() const { return experts_plan_.enabled && localized_; }

void MoE::check_expert(int64_t e) const {
  LOCUS_CHECK(e >= 0 && e < cfg_.num_experts, "MoE '", name(), "': expert index ", e, " out of range [0, ",
              cfg_.num_experts, ")");
}

void MoE::check_bias(const Tensor& t) const {
  LOCUS_CHECK(cfg_.correction_bias, "MoE '", name(), "': this config has no gate.e_score_correction_bias");
  LOCUS_CHECK(t.defined() && t.shape() == Shape{cfg_.num_experts} &&
                  (t.dtype() == DType::kFP32 || t.dtype() == DType::kBF16),
              "MoE '", name(), "': gate.e_score_correction_bias must be fp32 or bf16 [", cfg_.num_experts, "], got ",
              t.defined() ? t.describe() : "undefined");
}

// ---------------------------------------------------------------------------------------------
// names

MoE::Split MoE::split_names(const WeightMap& weights) const {
  Split s;
  s.gate_up.resize(cfg_.num_experts);
  s.down.resize(cfg_.num_experts);
  const int64_t E = cfg_.num_experts, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  for (const auto& [piece, t] : weights) {
    if (piece.rfind("gate.", 0) == 0) {
      const std::string rest = piece.substr(5);
      if (rest == "e_score_correction_bias") {
        check_bias(t);
        s.bias = t;
      } else {
        s.gate[rest] = t;
      }
    } else if (piece == "experts.gate_up_proj" || piece == "experts.down_proj") {
      const bool gu = piece == "experts.gate_up_proj";
      const Shape want = gu ? Shape{E, 2 * I, H} : Shape{E, H, I};
      LOCUS_CHECK(t.defined() && t.shape() == want, "MoE '", name(), "': ", piece, " must be ", shape_to_string(want),
                  ", got ", t.defined() ? t.describe() : "undefined");
      for (int64_t e = 0; e < E; ++e) (gu ? s.gate_up : s.down)[e]["weight"] = t.select(0, e);
    } else if (piece.rfind("experts.", 0) == 0) {
      // experts.{e}.{gate_proj|up_proj|down_proj}.{piece}
      const std::string rest = piece.substr(8);
      const size_t d1 = rest.find('.');
      const size_t d2 = d1 == std::string::npos ? d1 : rest.find('.', d1 + 1);
      int64_t e = -1;
      LOCUS_CHECK(d2 != std::string::npos && parse_index(rest.substr(0, d1), &e), "MoE '", name(), "': bad expert weight name '",
                  piece, "' (expected experts.{e}.{gate_proj,up_proj,down_proj}.{weight,...})");
      check_expert(e);
      const std::string proj = rest.substr(d1 + 1, d2 - d1 - 1), leaf = rest.substr(d2 + 1);
      if (proj == "gate_proj") s.gate_up[e]["gate." + leaf] = t;
      else if (proj == "up_proj") s.gate_up[e]["up." + leaf] = t;
      else if (proj == "down_proj") s.down[e][leaf] = t;
      else LOCUS_THROW("MoE '", name(), "': unknown expert projection '", proj, "' in '", piece, "' (gate_proj, up_proj, down_proj)");
    } else if (piece.rfind("shared_experts.", 0) == 0) {
      LOCUS_CHECK(shared_, "MoE '", name(), "': '", piece, "' given but this config has no shared experts");
      s.shared[piece.substr(15)] = t;
    } else {
      LOCUS_THROW("MoE '", name(), "': unknown weight '", piece,
                  "' (expected gate.*, experts.{e}.*, experts.gate_up_proj, experts.down_proj, shared_experts.*)");
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// lifecycle

void MoE::load(const std::string& piece, const Tensor& t) {
  Split s = split_names({{piece, t}});
  for (const auto& [k, v] : s.gate) gate_->load(k, v);
  if (s.bias.defined()) {
    LOCUS_CHECK(!localized_ && state() != LifecycleState::kTransformed, "MoE '", name(), "': load() after transform(); use reload()");
    bias_ = Tensor::empty({cfg_.num_experts}, DType::kFP32, device());
    if (s.bias.dtype() == DType::kFP32) {
      bias_.copy_(s.bias);
    } else {
      Tensor tmp = Tensor::empty({cfg_.num_experts}, DType::kFP32, s.bias.device());
      ops::cast(s.bias, tmp);
      bias_.copy_(tmp);
    }
  }
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    for (const auto& [k, v] : s.gate_up[e]) gate_up_[e]->load(k, v);
    for (const auto& [k, v] : s.down[e]) down_[e]->load(k, v);
  }
  for (const auto& [k, v] : s.shared) shared_->load(k, v);
}

void MoE::load_expert(int64_t expert, const std::string& proj, const std::string& piece, const Tensor& t) {
  check_expert(expert);
  load(str("experts.", expert, ".", proj, ".", piece), t);
}

void MoE::load_fused_experts(const Tensor& gate_up, const Tensor& down) {
  Split s = split_names({{"experts.gate_up_proj", gate_up}, {"experts.down_proj", down}});  // validates both first
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    gate_up_[e]->load("weight", s.gate_up[e].at("weight"));
    down_[e]->load("weight", s.down[e].at("weight"));
  }
}

std::vector<std::string> MoE::missing_pieces() const {
  std::vector<std::string> out;
  for (const auto& m : gate_->missing_pieces()) out.push_back("gate." + m);
  if (cfg_.correction_bias && !bias_.defined()) out.push_back("gate.e_score_correction_bias");
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    for (const auto& m : gate_up_[e]->missing_pieces()) {
      const bool gate = m.rfind("gate", 0) == 0;
      const size_t dot = m.find('.');
      out.push_back(str("experts.", e, gate ? ".gate_proj." : ".up_proj.", dot == std::string::npos ? "weight" : m.substr(dot + 1)));
    }
    for (const auto& m : down_[e]->missing_pieces()) out.push_back(str("experts.", e, ".down_proj.", m));
  }
  if (shared_)
    for (const auto& m : shared_->missing_pieces()) out.push_back("shared_experts." + m);
  return out;
}

void MoE::transform() {
  const auto missing = missing_pieces();
  if (!missing.empty()) {
    std::string m;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) m += (i ? ", " : "") + missing[i];
    if (missing.size() > 8) m += str(" and ", missing.size() - 8, " more");
    LOCUS_THROW("MoE '", name(), "': transform() before every weight was loaded; missing: ", m);
  }
  for (Module* m : children()) m->transform();
}

void MoE::localize() {
  if (localized_) return;
  transform();
  for (Module* m : children()) m->localize();
  localized_ = true;
}

void MoE::check_reload(const WeightMap& weights) const {
  Split s = split_names(weights);
  if (!s.gate.empty()) gate_->check_reload(s.gate);
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    if (!s.gate_up[e].empty()) gate_up_[e]->check_reload(s.gate_up[e]);
    if (!s.down[e].empty()) down_[e]->check_reload(s.down[e]);
  }
  if (!s.shared.empty()) shared_->check_reload(s.shared);
}

void MoE::reload(const WeightMap& weights) {
  check_reload(weights);  // every reloaded child validated before any is written
  Split s = split_names(weights);
  if (!s.gate.empty()) gate_->reload(s.gate);
  if (s.bias.defined()) {
    if (!bias_.defined()) bias_ = Tensor::empty({cfg_.num_experts}, DType::kFP32, device());
    Tensor src = s.bias;
    if (src.dtype() != DType::kFP32) {
      Tensor tmp = Tensor::empty({cfg_.num_experts}, DType::kFP32, src.device());
      ops::cast(src, tmp);
      src = tmp;
    }
    bias_.copy_(src);
  }
  for (int64_t e = 0; e < cfg_.num_experts; ++e) {
    if (!s.gate_up[e].empty()) gate_up_[e]->reload(s.gate_up[e]);
    if (!s.down[e].empty()) down_[e]->reload(s.down[e]);
  }
  if (!s.shared.empty()) shared_->reload(s.shared);
}

void MoE::rebuild() {
  for (Module* m : children()) m->rebuild();
}

MemoryUsage MoE::memory() const {
  MemoryUsage m;
  for (Module* c : children()) m += c->memory();
  m.add(bias_);
  return m;
}

void MoE::collect_plans(std::vector<PlanRecord>* out) const {
  gate_->collect_plans(out);
  out->push_back({experts_plan_.module, "moe", experts_plan_});
  if (shared_) shared_->collect_plans(out);
}

// ---------------------------------------------------------------------------------------------
// forward

void MoE::route(const Tensor& x, const Tensor& weights, const Tensor& ids, const Stream& stream) const {
  LOCUS_CHECK(x.dim() == 2 && x.size(1) == cfg_.hidden_size, "MoE '", name(), "': x must be [T, ", cfg_.hidden_size,
              "], got ", x.describe());
  Tensor logits = Tensor::empty({x.size(0), cfg_.num_experts}, DType::kFP32, x.device());
  gate_->forward(x, logits, stream);
  if (RoutingReplay* replay = routing_replay()) {
    LOCUS_CHECK(x.device().is_cpu(), "LOCUS_ROUTING_REPLAY runs on the CPU backend only; MoE '", name(), "' is on ",
                x.device().name());
    replay->route(name(), logits, routing_config(), weights, ids);
  } else {
    ops::moe_route(logits, bias_, routing_config(), weights, ids, stream);
  }
  if (!routing_dump_path().empty()) dump_routing(routing_dump_path(), name(), logits, bias_, routing_config(), ids);
}

void MoE::forward(const Tensor& x, const Tensor& y, const Stream& stream) const {
  const LifecycleState st = state();
  LOCUS_CHECK(st == LifecycleState::kTransformed || st == LifecycleState::kLocalized, "MoE '", name(),
              "': forward() in state ", lifecycle_state_name(st), " (load every weight and call transform() first)");
  LOCUS_CHECK(y.dim() == 2 && x.dim() == 2 && y.size(0) == x.size(0) && y.size(1) == cfg_.hidden_size, "MoE '", name(),
              "': y must be [", x.dim() == 2 ? x.size(0) : -1, ", ", cfg_.hidden_size, "], got ", y.describe());
  const int64_t T = x.size(0), K = cfg_.top_k, E = cfg_.num_experts, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  if (T == 0) return;
  const Device dev = x.device();
  Tensor w = Tensor::empty({T, K}, DType::kFP32, dev);
  Tensor ids = Tensor::empty({T, K}, DType::kI32, dev);
  std::optional<HostProfileScope> profile(std::in_place, "moe.route");
  route(x, w, ids, stream);
  if (const IndexedExperts* ix = indexed_experts(T)) {
    profile.reset();
    return forward_indexed(*ix, x, w, ids, y, stream);
  }

  // Group the (token, choice) pairs by expert on x's device: rows[r] = token of gathered row r,
  // slot[t, j] = the row holding token t's j-th choice, expert e's rows [offsets[e], offsets[e+1]).
  const int64_t R = T * K;
  Tensor offsets = Tensor::empty({E + 1}, DType::kI32, dev);
  Tensor rows = Tensor::empty({R}, DType::kI32, dev), slot = Tensor::empty({T, K}, DType::kI32, dev);
  profile.emplace("moe.group");
  ops::moe_group(ids, E, offsets, rows, slot, stream);
  // The expert launches need the offsets on the host. Their copy is queued now, and the work that
  // does not need them (the gather, the shared expert) is queued behind it before the host waits,
  // so the device is busy while the host waits and then enqueues the experts.
  ops::MoeOffsetsReadback offsets_readback(offsets, stream);

  profile.emplace("moe.gather");
  Tensor xg = Tensor::empty({R, H}, DType::kBF16, dev);
  ops::moe_gather(x, rows, xg, stream);
  Tensor shared;
  if (shared_) {
    profile.emplace("moe.shared");
    shared = Tensor::empty({T, H}, DType::kFP32, dev);  // fp32, as when it rides in the by-id launches
    shared_->forward(x, shared, stream);
  }
  profile.emplace("moe.offsets_wait");  // waits for the device: the copy queued after the group
  const std::vector<int64_t> offsets_host = offsets_readback.wait();
  // On CUDA an id outside [0, E) (a routing bug) is skipped by moe_group and shows here.
  LOCUS_CHECK(offsets_host[E] == R, "MoE '", name(), "': ", R - offsets_host[E], " of ", R,
              " routed (token, expert) pairs had an expert id outside [0, ", E, ")");

  Tensor hg = Tensor::empty({R, I}, DType::kBF16, dev);
  Tensor og = Tensor::empty({R, H}, DType::kFP32, dev);
  profile.emplace("moe.experts");
  run_experts(xg, offsets_host, hg, og, stream);
  profile.emplace("moe.combine");
  ops::moe_combine(og, slot, w, shared, y, stream);
}

namespace {

// -1: not read yet; else 0 (never), 1 (few pairs per expert), 2 (always): LOCUS_MOE_INDEXED,
// or set_moe_indexed_experts.
std::atomic<int> g_indexed{-1};

int moe_indexed_mode() {
  int v = g_indexed.load();
  if (v < 0) {
    const char* set = std::getenv("LOCUS_MOE_INDEXED");
    const std::string env = set ? set : "";
    v = env == "0" ? 0 : env == "all" ? 2 : 1;
    g_indexed.store(v);
  }
  return v;
}

}  // namespace

bool moe_indexed_experts() { return moe_indexed_mode() >= 1; }

void set_moe_indexed_experts(bool on) { g_indexed.store(on ? 1 : 0); }

const MoE::IndexedExperts* MoE::indexed_experts(int64_t tokens) const {
  const int mode = moe_indexed_mode();
  // By id while the pairs are at most half the experts: cuda_moe_experts_bench (H100, 32 experts)
  // has it 7% faster than grouping at 16 pairs and 11% slower at 32 (docs/benchmarks.md).
  if (mode == 0 || (mode == 1 && tokens * cfg_.top_k * 2 > cfg_.num_experts)) return nullptr;
  const int P = experts_partitioned() ? experts_plan_.layout.num_partitions() : 1;
  auto partition = [&](int i) { return experts_partitioned() ? i : -1; };
  // The cached sets hold while every expert's units are where they were (no per-call copies).
  const ops::Nvfp4Weight *shared_gu = nullptr, *shared_dn = nullptr;
  const bool with_shared = shared_in_launch(&shared_gu, &shared_dn);
  bool same = indexed_ && static_cast<int>(indexed_->parts.size()) == P && (indexed_->shared != nullptr) == with_shared &&
              (!with_shared || (indexed_->shared->gate_up.weights()[0] == shared_gu &&
                                indexed_->shared->down.weights()[0] == shared_dn));
  for (int i = 0; i < P && same; ++i) {
    const IndexedPart& part = *indexed_->parts[static_cast<size_t>(i)];
    for (int64_t e = 0; e < cfg_.num_experts && same; ++e)
      same = part.gate_up.weights()[e] == gate_up_[e]->nvfp4_unit(partition(i)) &&
             part.down.weights()[e] == down_[e]->nvfp4_unit(partition(i));
  }
  if (same) return indexed_.get();
  auto ix = std::make_unique<IndexedExperts>();
  for (int i = 0; i < P; ++i) {
    const int p = partition(i);
    std::vector<const ops::Nvfp4Weight*> gu, dn;
    for (int64_t e = 0; e < cfg_.num_experts; ++e) {
      gu.push_back(gate_up_[e]->nvfp4_unit(p));
      dn.push_back(down_[e]->nvfp4_unit(p));
      if (gu.back() == nullptr || dn.back() == nullptr) return nullptr;
    }
    auto part = std::make_unique<IndexedPart>(std::move(gu), std::move(dn));
    expert_columns(*gate_up_[0], p, &part->h0, &part->h1);
    expert_columns(*down_[0], p, &part->o0, &part->o1);
    for (int64_t e = 1; e < cfg_.num_experts; ++e) {
      int64_t h0, h1, o0, o1;
      expert_columns(*gate_up_[e], p, &h0, &h1);
      expert_columns(*down_[e], p, &o0, &o1);
      if (h0 != part->h0 || h1 != part->h1 || o0 != part->o0 || o1 != part->o1) return nullptr;
    }
    ix->parts.push_back(std::move(part));
  }
  if (with_shared)
    ix->shared = std::make_unique<IndexedPart>(std::vector<const ops::Nvfp4Weight*>{shared_gu},
                                               std::vector<const ops::Nvfp4Weight*>{shared_dn});
  indexed_ = std::move(ix);
  return indexed_.get();
}

bool MoE::shared_in_launch(const ops::Nvfp4Weight** gate_up, const ops::Nvfp4Weight** down) const {
  if (!shared_ || experts_partitioned() || !shared_->uses_fused_swiglu()) return false;
  const ops::Nvfp4Weight* gu = shared_->gate_up_proj().nvfp4_unit(-1);
  const ops::Nvfp4Weight* dn = shared_->down_proj().nvfp4_unit(-1);
  const ops::Nvfp4Weight* routed_gu = gate_up_[0]->nvfp4_unit(-1);
  const ops::Nvfp4Weight* routed_dn = down_[0]->nvfp4_unit(-1);
  auto same_shape = [](const ops::Nvfp4Weight* a, const ops::Nvfp4Weight* b) {
    return a && b && a->n == b->n && a->k == b->k && a->layout == b->layout;
  };
  if (!same_shape(gu, routed_gu) || !same_shape(dn, routed_dn)) return false;
  *gate_up = gu;
  *down = dn;
  return true;
}

const Tensor& MoE::token_table(std::map<int64_t, Tensor>& cache, int64_t tokens, int64_t cols,
                               bool row_major_index) const {
  auto it = cache.find(tokens);
  if (it != cache.end()) return it->second;
  Tensor t = Tensor::empty({tokens, cols}, DType::kI32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = row_major_index ? static_cast<int32_t>(i) : 0;
  if (!device().is_cpu()) t = t.to(device());
  return cache.emplace(tokens, t).first->second;
}

const Tensor& MoE::pair_order_slots(int64_t tokens) const {
  return token_table(pair_order_slots_, tokens, cfg_.top_k, /*row_major_index=*/true);
}

const Tensor& MoE::zero_ids(int64_t tokens) const {
  return token_table(zero_ids_, tokens, 1, /*row_major_index=*/false);
}

// The shared expert rides in the routed experts' by-id launches for decode steps of up to this many
// tokens: it then costs one more weight of the launch (streamed once per token) instead of a launch
// pair of its own. cuda_moe_experts_bench (H100, 32 experts, docs/benchmarks.md, twentieth
// session): one token 119.0 us in the launches against 107.0 + 26.8 apart; two tokens 205.0
// against 176.9 + 27.5, the same.
constexpr int64_t kSharedInLaunchMaxTokens = 1;

void MoE::forward_indexed(const IndexedExperts& ix, const Tensor& x, const Tensor& w, const Tensor& ids,
                          const Tensor& y, const Stream& stream) const {
  const int64_t T = x.size(0), K = cfg_.top_k, R = T * K, H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const Device dev = x.device();
  const bool shared_here = ix.shared && T <= kSharedInLaunchMaxTokens;
  const int64_t S = shared_here ? T : 0;  // the shared expert's rows, after the routed pairs'
  std::optional<HostProfileScope> profile(std::in_place, "moe.experts");
  // Pair i = t * K + j: token t's j-th expert, on token t's row; its outputs in row i.
  Tensor h = Tensor::empty({R + S, I}, DType::kBF16, dev);
  Tensor o = Tensor::empty({R + S, H}, DType::kFP32, dev);
  const Tensor pair_ids = ids.view({R, 1});
  auto gate_up = [&](const IndexedPart& part, const Stream& s) {
    std::vector<ops::Nvfp4IndexedProduct> products{{x, ids, &part.gate_up, h.slice(0, 0, R).slice(1, part.h0, part.h1)}};
    if (shared_here) products.push_back({x, zero_ids(T), &ix.shared->gate_up, h.slice(0, R, R + S)});
    ops::nvfp4_gemm_indexed(products, /*swiglu=*/true, s);
  };
  auto down = [&](const IndexedPart& part, const Stream& s) {
    std::vector<ops::Nvfp4IndexedProduct> products{
        {h.slice(0, 0, R), pair_ids, &part.down, o.slice(0, 0, R).slice(1, part.o0, part.o1)}};
    if (shared_here) products.push_back({h.slice(0, R, R + S), zero_ids(T), &ix.shared->down, o.slice(0, R, R + S)});
    ops::nvfp4_gemm_indexed(products, /*swiglu=*/false, s);
  };
  if (experts_partitioned()) {
    // One fork/join per stage, as in run_experts: the down projections read every partition's h.
    const auto streams = ctx_.runtime->partition_streams(static_cast<int>(ix.parts.size()));
    ops::run_partitioned(stream, streams, [&](int p) { gate_up(*ix.parts[static_cast<size_t>(p)], streams[p]); });
    ops::run_partitioned(stream, streams, [&](int p) { down(*ix.parts[static_cast<size_t>(p)], streams[p]); });
  } else {
    gate_up(*ix.parts[0], stream);
    down(*ix.parts[0], stream);
  }
  Tensor shared;
  if (shared_here) {
    shared = o.slice(0, R, R + S);
  } else if (shared_) {
    profile.emplace("moe.shared");
    shared = Tensor::empty({T, H}, DType::kFP32, dev);
    shared_->forward(x, shared, stream);
  }
  profile.emplace("moe.combine");
  ops::moe_combine(o.slice(0, 0, R), pair_order_slots(T), w, shared, y, stream);
}

void MoE::run_experts(const Tensor& xg, const std::vector<int64_t>& offsets, const Tensor& hg, const Tensor& og,
                      const Stream& stream) const {
  std::vector<int64_t> active;
  for (int64_t e = 0; e < cfg_.num_experts; ++e)
    if (offsets[e + 1] > offsets[e]) active.push_back(e);
  auto rows_of = [&](const Tensor& t, int64_t e) { return t.slice(0, offsets[e], offsets[e + 1]); };
  if (experts_partitioned()) {
    // One fork/join per stage; inside, partition p runs its slice of every active expert: as row
    // blocks of its NVFP4 shards where they are such (its columns of hg and og), else expert by
    // expert.
    const int P = experts_plan_.layout.num_partitions();
    const auto streams = ctx_.runtime->partition_streams(P);
    std::vector<Nvfp4Stage> stages(static_cast<size_t>(P));
    bool blocks = true;
    for (int p = 0; p < P && blocks; ++p) blocks = nvfp4_stage(p, offsets, active, &stages[static_cast<size_t>(p)]);
    ops::run_partitioned(stream, streams, [&](int p) {
      const Nvfp4Stage& st = stages[static_cast<size_t>(p)];
      if (blocks) ops::nvfp4_gemm_row_blocks(xg, st.gate_up, hg.slice(1, st.h0, st.h1), true, streams[p]);
      else for (int64_t e : active) gate_up_[e]->forward_partition(p, rows_of(xg, e), rows_of(hg, e), streams[p]);
    });
    ops::run_partitioned(stream, streams, [&](int p) {
      const Nvfp4Stage& st = stages[static_cast<size_t>(p)];
      if (blocks) ops::nvfp4_gemm_row_blocks(hg, st.down, og.slice(1, st.o0, st.o1), false, streams[p]);
      else for (int64_t e : active) down_[e]->forward_partition(p, rows_of(hg, e), rows_of(og, e), streams[p]);
    });
    return;
  }
  Nvfp4Stage st;
  if (nvfp4_stage(-1, offsets, active, &st)) {
    ops::nvfp4_gemm_row_blocks(xg, st.gate_up, hg, true, stream);
    ops::nvfp4_gemm_row_blocks(hg, st.down, og, false, stream);
    return;
  }
  for (int64_t e : active) gate_up_[e]->forward(rows_of(xg, e), rows_of(hg, e), stream);
  for (int64_t e : active) down_[e]->forward(rows_of(hg, e), rows_of(og, e), stream);
}

void MoE::expert_columns(const Linear& l, int p, int64_t* c0, int64_t* c1) {
  if (p < 0) {
    *c0 = 0;
    *c1 = l.out_features();
  } else {
    *c0 = l.plan().layout.parts[static_cast<size_t>(p)].n0;
    *c1 = l.plan().layout.parts[static_cast<size_t>(p)].n1;
  }
}

bool MoE::nvfp4_stage(int p, const std::vector<int64_t>& offsets, const std::vector<int64_t>& active,
                      Nvfp4Stage* st) const {
  for (size_t i = 0; i < active.size(); ++i) {
    const int64_t e = active[i];
    const ops::Nvfp4Weight* gu = gate_up_[e]->nvfp4_unit(p);
    const ops::Nvfp4Weight* dn = down_[e]->nvfp4_unit(p);
    if (gu == nullptr || dn == nullptr) return false;
    int64_t h0, h1, o0, o1;
    expert_columns(*gate_up_[e], p, &h0, &h1);
    expert_columns(*down_[e], p, &o0, &o1);
    if (i == 0) *st = Nvfp4Stage{{}, {}, h0, h1, o0, o1};
    if (h0 != st->h0 || h1 != st->h1 || o0 != st->o0 || o1 != st->o1) return false;
    st->gate_up.push_back({gu, offsets[e], offsets[e + 1] - offsets[e]});
    st->down.push_back({dn, offsets[e], offsets[e + 1] - offsets[e]});
  }
  return true;
}

}  // namespace locus::modules
