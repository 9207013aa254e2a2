// MLA: projections, latent cache append, the prefill (expanded) and decode (absorbed) attention
// paths, and the lifecycle of the absorbed k_b / v_b weights.
#include "modules/mla.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/host_profile.h"
#include "locality/shards.h"
#include "ops/attention.h"
#include "ops/bmm.h"
#include "ops/kv_table.h"
#include "ops/norm.h"
#include "ops/partitioned.h"
#include "ops/side_stream.h"

namespace locus::modules {

// ---------------------------------------------------------------------------------------------
// latent cache

MlaKvCache MlaKvCache::allocate(int64_t capacity, int64_t kv_lora_rank, int64_t rope_dim, Device device, int domain) {
  LOCUS_CHECK(capacity >= 1 && kv_lora_rank >= 1 && rope_dim >= 1, "MlaKvCache: capacity, kv_lora_rank and rope_dim must be positive, got ",
              capacity, ", ", kv_lora_rank, ", ", rope_dim);
  MlaKvCache c;
  c.latent = Tensor::empty({capacity, kv_lora_rank + rope_dim}, DType::kBF16, device, domain);
  c.kv_lora_rank = kv_lora_rank;
  return c;
}

Tensor MlaKvCache::kv(int64_t n) const { return latent.slice(0, 0, n).slice(1, 0, kv_lora_rank); }
Tensor MlaKvCache::k_pe(int64_t n) const { return latent.slice(0, 0, n).slice(1, kv_lora_rank, latent.size(1)); }

const char* mla_path_name(MlaPath p) {
  switch (p) {
    case MlaPath::kAuto: return "auto";
    case MlaPath::kPrefill: return "prefill";
    case MlaPath::kAbsorbed: return "absorbed";
  }
  return "invalid";
}

// ---------------------------------------------------------------------------------------------
// construction

namespace {

std::unique_ptr<Linear> make_linear(const ModuleContext& ctx, const char* child, int64_t in, int64_t out,
                                    bool partitionable = true, const char* reason = "") {
  LinearConfig c;
  c.in_features = in;
  c.out_features = out;
  c.partitionable = partitionable;
  if (!partitionable) c.unpartitioned_reason = reason;
  return std::make_unique<Linear>(ctx.child(child), c);
}

}  // namespace

MLA::MLA(ModuleContext ctx, MlaConfig cfg) : Module(std::move(ctx)), cfg_(cfg) {
  const auto& c = cfg_;
  LOCUS_CHECK(c.hidden_size >= 1 && c.num_heads >= 1 && c.kv_lora_rank >= 1 && c.qk_nope_head_dim >= 1 &&
                  c.qk_rope_head_dim >= 2 && c.qk_rope_head_dim % 2 == 0 && c.v_head_dim >= 1 && c.q_lora_rank >= 0,
              "MLA '", name(), "': invalid config (hidden ", c.hidden_size, ", heads ", c.num_heads, ", q_lora_rank ",
              c.q_lora_rank, ", kv_lora_rank ", c.kv_lora_rank, ", nope ", c.qk_nope_head_dim, ", rope ",
              c.qk_rope_head_dim, " (even), v ", c.v_head_dim, ")");
  LOCUS_CHECK(c.max_positions >= 1, "MLA '", name(), "': max_positions must be positive");
  const int64_t H = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t dc = c.kv_lora_rank;
  if (c.q_lora_rank > 0) {
    q_a_proj_ = make_linear(ctx_, "q_a_proj", c.hidden_size, c.q_lora_rank);
    q_a_layernorm_ = std::make_unique<RMSNorm>(ctx_.child("q_a_layernorm"), c.q_lora_rank, c.rms_norm_eps);
    q_b_proj_ = make_linear(ctx_, "q_b_proj", c.q_lora_rank, H * (dn + dr));
  } else {
    q_proj_ = make_linear(ctx_, "q_proj", c.hidden_size, H * (dn + dr));
  }
  kv_a_proj_ = make_linear(ctx_, "kv_a_proj_with_mqa", c.hidden_size, dc + dr, false,
                           locality::kKvAProjUnpartitionedReason);
  kv_a_layernorm_ = std::make_unique<RMSNorm>(ctx_.child("kv_a_layernorm"), dc, c.rms_norm_eps);
  kv_b_proj_ = make_linear(ctx_, "kv_b_proj", dc, H * (dn + dv));
  o_proj_ = make_linear(ctx_, "o_proj", H * dv, c.hidden_size);

  cfg_.rope.dim = dr;
  rope_ = ops::make_rope_table(cfg_.rope, c.max_positions);
  if (!device().is_cpu()) {
    rope_.cos = rope_.cos.to(device());
    rope_.sin = rope_.sin.to(device());
  }
  softmax_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dn + dr)) * rope_.softmax_mscale *
                                      rope_.softmax_mscale);

  auto plan_bmm = [&](const char* what, int64_t k, int64_t n) {
    const std::string module = name() + "." + what;
    locality::Plan p;
    if (!ctx_.planner) p = disabled_plan("locality domains off (no planner in the module context)", locality::OpKind::kBf16Bmm);
    else p = ctx_.planner->plan_bmm(module, H, k, n);
    if (p.enabled && !ctx_.runtime) p = disabled_plan("no locality runtime in the module context", locality::OpKind::kBf16Bmm);
    p.module = module;
    check_plan_strict(p, what);
    return p;
  };
  k_b_plan_ = plan_bmm("k_b_proj", dn, dc);  // q_nope [H, T, dn] x k_b [H, dn, dc]
  v_b_plan_ = plan_bmm("v_b_proj", dc, dv);  // o_lat [H, T, dc] x v_b^T [H, dc, dv]
}

void MLA::check_plan_strict(const locality::Plan& plan, const char* what) const {
  if (!ctx_.require_locality || plan.enabled || !ctx_.planner) return;
  const auto& policy = ctx_.planner->policy();
  if (!policy.enabled || !policy.excluding_pattern(plan.module).empty()) return;
  LOCUS_THROW("MLA '", name(), "': locality-domain execution was required, but the absorbed ", what,
              " bf16 BMM cannot be partitioned: ", plan.reason);
}

std::vector<MLA::Child> MLA::children() const {
  std::vector<Child> c;
  if (q_a_proj_) {
    c.push_back({"q_a_proj.", q_a_proj_.get()});
    c.push_back({"q_a_layernorm.", q_a_layernorm_.get()});
    c.push_back({"q_b_proj.", q_b_proj_.get()});
  } else {
    c.push_back({"q_proj.", q_proj_.get()});
  }
  c.push_back({"kv_a_proj_with_mqa.", kv_a_proj_.get()});
  c.push_back({"kv_a_layernorm.", kv_a_layernorm_.get()});
  c.push_back({"kv_b_proj.", kv_b_proj_.get()});
  c.push_back({"o_proj.", o_proj_.get()});
  return c;
}

LifecycleState MLA::state() const {
  if (state_ == LifecycleState::kTransformed || state_ == LifecycleState::kLocalized) return state_;
  LifecycleState s = LifecycleState::kLocalized;
  for (const Child& c : children()) s = std::min(s, c.module->state());
  return std::min(s, LifecycleState::kLoaded);
}

// ---------------------------------------------------------------------------------------------
// lifecycle

void MLA::load(const std::string& piece, const Tensor& t) {
  for (const Child& c : children()) {
    const std::string p = c.prefix;
    if (piece.rfind(p, 0) == 0) return c.module->load(piece.substr(p.size()), t);
  }
  std::string names;
  for (const Child& c : children()) names += (names.empty() ? "" : ", ") + std::string(c.prefix) + "*";
  LOCUS_THROW("MLA '", name(), "': unknown weight '", piece, "' (expected ", names, ")");
}

std::vector<std::string> MLA::missing_pieces() const {
  std::vector<std::string> out;
  for (const Child& c : children())
    for (const std::string& m : c.module->missing_pieces()) out.push_back(c.prefix + m);
  return out;
}

void MLA::write_absorbed(const Tensor& w) {
  const int64_t H = cfg_.num_heads, dn = cfg_.qk_nope_head_dim, dv = cfg_.v_head_dim, per = dn + dv;
  // Head h of the full absorbed weights lives in entry part(h) at index h - head0(part).
  auto locate = [&](const locality::Plan& plan, const std::vector<Tensor>& parts, int64_t h) {
    if (parts.size() == 1 && parts[0].size(0) == H) return parts[0].select(0, h);
    for (size_t p = 0; p < parts.size(); ++p) {
      const auto& r = plan.layout.parts[p];
      if (h >= r.n0 && h < r.n1) return parts[p].select(0, h - r.n0);
    }
    LOCUS_THROW("MLA '", name(), "': head ", h, " is in no absorbed shard");
  };
  for (int64_t h = 0; h < H; ++h) {
    locate(k_b_plan_, k_b_, h).copy_(w.slice(0, h * per, h * per + dn));           // W_UK[h] [dn, dc]
    locate(v_b_plan_, v_b_, h).copy_(w.slice(0, h * per + dn, (h + 1) * per));     // W_UV[h] [dv, dc]
  }
}

void MLA::transform() {
  if (state_ == LifecycleState::kTransformed || state_ == LifecycleState::kLocalized) return;
  const auto missing = missing_pieces();
  if (!missing.empty()) {
    std::string m;
    for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
    LOCUS_THROW("MLA '", name(), "': transform() before every weight was loaded; missing: ", m);
  }
  for (const Child& c : children()) c.module->transform();
  const int64_t H = cfg_.num_heads, dc = cfg_.kv_lora_rank;
  k_b_ = {Tensor::empty({H, cfg_.qk_nope_head_dim, dc}, DType::kBF16, device())};
  v_b_ = {Tensor::empty({H, cfg_.v_head_dim, dc}, DType::kBF16, device())};
  write_absorbed(kv_b_proj_->weight());
  state_ = LifecycleState::kTransformed;
}

void MLA::localize() {
  if (state_ == LifecycleState::kLocalized) return;
  transform();
  for (const Child& c : children()) c.module->localize();
  auto shard = [&](const locality::Plan& plan, std::vector<Tensor>* w) {
    if (!plan.enabled) return;
    std::vector<Tensor> parts;
    for (int p = 0; p < plan.layout.num_partitions(); ++p)
      parts.push_back(locality::make_bmm_shard((*w)[0], plan.layout, p, ctx_.runtime->place_for_partition(p)));
    *w = std::move(parts);  // the full absorbed weight is released
  };
  shard(k_b_plan_, &k_b_);
  shard(v_b_plan_, &v_b_);
  state_ = LifecycleState::kLocalized;
}

std::vector<WeightMap> MLA::split(const WeightMap& weights) const {
  const auto kids = children();
  std::vector<WeightMap> per_child(kids.size());
  for (const auto& [piece, t] : weights) {
    bool found = false;
    for (size_t i = 0; i < kids.size() && !found; ++i) {
      const std::string p = kids[i].prefix;
      if (piece.rfind(p, 0) == 0) {
        per_child[i][piece.substr(p.size())] = t;
        found = true;
      }
    }
    LOCUS_CHECK(found, "MLA '", name(), "': unknown weight '", piece, "' in reload");
  }
  return per_child;
}

void MLA::check_reload(const WeightMap& weights) const {
  const auto kids = children();
  const auto per_child = split(weights);
  for (size_t i = 0; i < kids.size(); ++i)
    if (!per_child[i].empty()) kids[i].module->check_reload(per_child[i]);
}

void MLA::reload(const WeightMap& weights) {
  check_reload(weights);  // every reloaded child validated before any is written
  const auto kids = children();
  const auto per_child = split(weights);
  for (size_t i = 0; i < kids.size(); ++i)
    if (!per_child[i].empty()) kids[i].module->reload(per_child[i]);
  const bool kv_b_changed = !per_child[kids.size() - 2].empty();  // kv_b_proj is second to last
  if (kv_b_changed && (state_ == LifecycleState::kTransformed || state_ == LifecycleState::kLocalized)) {
    write_absorbed(kv_b_proj_->gather_weight());  // absorbed weights rewritten in place
  }
}

void MLA::rebuild() {
  for (const Child& c : children()) c.module->rebuild();
  if (state_ == LifecycleState::kTransformed || state_ == LifecycleState::kLocalized) {
    write_absorbed(kv_b_proj_->gather_weight());
  }
}

MemoryUsage MLA::memory() const {
  MemoryUsage m;
  for (const Child& c : children()) m += c.module->memory();
  for (const Tensor& t : k_b_) m.add(t);
  for (const Tensor& t : v_b_) m.add(t);
  return m;
}

void MLA::collect_plans(std::vector<PlanRecord>* out) const {
  for (const Child& c : children()) c.module->collect_plans(out);
  out->push_back({k_b_plan_.module, "bmm", k_b_plan_});
  out->push_back({v_b_plan_.module, "bmm", v_b_plan_});
}

// ---------------------------------------------------------------------------------------------
// forward

// y[h] = a[h] * B[h] over heads, with B = weights (or their per-head transposes), partitioned
// over heads when the plan is enabled and the weights are sharded.
void MLA::absorbed_bmm(const Tensor& a, const std::vector<Tensor>& weights, bool transpose_weights,
                       const locality::Plan& plan, const Tensor& y, const Stream& stream) const {
  auto operand = [&](const Tensor& w) { return transpose_weights ? w.transpose(1, 2) : w; };
  const bool sharded = plan.enabled && state_ == LifecycleState::kLocalized;
  if (!sharded) return ops::bmm(a, operand(weights[0]), y, stream);
  std::vector<Tensor> shards;
  for (const Tensor& w : weights) shards.push_back(operand(w));
  ops::bmm_partitioned(a, shards, y, locality::partition_slices(plan.layout, *ctx_.runtime), stream);
}

// Non-absorbed attention for one sequence: k_nope and v expanded per head from its cache.
void MLA::attend_prefill(const Tensor& q3, const MlaKvCache& cache, int64_t row0, int64_t n, const Tensor& o_v,
                         const Stream& stream) const {
  const int64_t H = cfg_.num_heads, dn = cfg_.qk_nope_head_dim, dv = cfg_.v_head_dim;
  const int64_t S = cache.length + n;
  Tensor kvb = Tensor::empty({S, H * (dn + dv)}, DType::kBF16, device());
  kv_b_proj_->forward(cache.kv(S), kvb, stream);
  Tensor kvb3 = kvb.view({S, H, dn + dv});
  Tensor q = q3.slice(0, row0, row0 + n);
  ops::mla_attention(q.slice(2, 0, dn), q.slice(2, dn, q3.size(2)), kvb3.slice(2, 0, dn), cache.k_pe(S).unsqueeze(1),
                     kvb3.slice(2, dn, dn + dv), o_v.slice(0, row0, row0 + n), softmax_scale_, cache.length, stream);
}

void MLA::forward(const Tensor& x, const Tensor& positions, const std::vector<MlaSequence>& seqs, const Tensor& y,
                  MlaPath path, const Stream& stream) {
  const auto& c = cfg_;
  const int64_t H = c.num_heads, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t dc = c.kv_lora_rank;
  check_forward("forward", x, y);
  const int64_t T = x.size(0);
  LOCUS_CHECK(positions.dim() == 1 && positions.size(0) == T, "MLA '", name(), "': positions must be [", T, "], got ",
              positions.describe());
  int64_t total = 0, max_new = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const MlaSequence& s = seqs[i];
    LOCUS_CHECK(s.cache && s.cache->latent.defined(), "MLA '", name(), "': sequence ", i, " has no cache");
    LOCUS_CHECK(s.cache->latent.dtype() == DType::kBF16 && s.cache->kv_lora_rank == dc && s.cache->rope_dim() == dr,
                "MLA '", name(), "': sequence ", i, "'s cache is ", s.cache->latent.describe(), " with kv_lora_rank ",
                s.cache->kv_lora_rank, " but this layer needs bf16 [capacity, ", dc, " + ", dr, "]");
    LOCUS_CHECK(s.num_tokens >= 0 && s.cache->length + s.num_tokens <= s.cache->capacity(), "MLA '", name(),
                "': sequence ", i, " appends ", s.num_tokens, " tokens to a cache holding ", s.cache->length, " of ",
                s.cache->capacity());
    total += s.num_tokens;
    max_new = std::max(max_new, s.num_tokens);
  }
  LOCUS_CHECK(total == T, "MLA '", name(), "': the sequences hold ", total, " tokens but x has ", T, " rows");
  if (T == 0) return;
  const bool absorbed = path == MlaPath::kAbsorbed || (path == MlaPath::kAuto && max_new <= c.absorbed_max_tokens);

  // 1. queries [T, H, dn + dr]
  std::optional<HostProfileScope> profile(std::in_place, "mla.q");
  const Tensor q3 = queries(x, positions, stream);

  // 2. latent rows [c_kv | k_pe] appended to each sequence's cache: c_kv normalized, k_pe rotated
  profile.emplace("mla.kv_cache");
  Tensor kva = Tensor::empty({T, dc + dr}, DType::kBF16, device());
  kv_a_proj_->forward(x, kva, stream);
  // Each latent row is made on its own (row-wise ops), so rows may be made in any grouping: one
  // sequence's rows straight into its cache; several sequences' rows all at once, then one copy
  // per cache (3 + B launches rather than 3B).
  const int64_t appending =
      std::count_if(seqs.begin(), seqs.end(), [](const MlaSequence& s) { return s.num_tokens > 0; });
  Tensor latent;  // [T, dc + dr]: the rows made at once, when several sequences append
  if (appending > 1) {
    latent = Tensor::empty({T, dc + dr}, DType::kBF16, device());
    make_latent(kva, latent, positions, stream);
  }
  int64_t row = 0;
  for (const MlaSequence& s : seqs) {
    const int64_t n = s.num_tokens, len = s.cache->length;
    if (n == 0) continue;
    Tensor dst = s.cache->latent.slice(0, len, len + n);
    if (appending > 1) ops::cast(latent.slice(0, row, row + n), dst, stream);
    else make_latent(kva.slice(0, row, row + n), dst, positions.slice(0, row, row + n), stream);
    row += n;
  }

  // 3. attention -> o_v [T, H, dv]
  profile.emplace("mla.attention");
  Tensor o_v = Tensor::empty({T, H, dv}, DType::kBF16, device());
  if (!absorbed) {
    row = 0;
    for (const MlaSequence& s : seqs) {
      if (s.num_tokens) attend_prefill(q3, *s.cache, row, s.num_tokens, o_v, stream);
      row += s.num_tokens;
    }
  } else {
    // Sequences that all append the same number of tokens (decode: one each) attend in one op,
    // so that on a GPU their short attentions run side by side in one launch.
    const bool uniform = std::all_of(seqs.begin(), seqs.end(), [&](const MlaSequence& s) {
      return s.num_tokens == seqs[0].num_tokens;
    });
    absorbed_attention(q3, o_v, stream, [&](const Tensor& q_lat, const Tensor& q_pe, const Tensor& o_lat) {
      if (uniform && seqs.size() > 1) {
        std::vector<ops::AttentionKeys> keys;
        for (const MlaSequence& s : seqs) {
          const int64_t S = s.cache->length + s.num_tokens;
          const Tensor kv = s.cache->kv(S).unsqueeze(1);
          keys.push_back({kv, s.cache->k_pe(S).unsqueeze(1), kv});
        }
        return ops::mla_attention_batch(q_lat, q_pe, keys, o_lat, softmax_scale_, stream);
      }
      int64_t r = 0;
      for (const MlaSequence& s : seqs) {
        const int64_t n = s.num_tokens, S = s.cache->length + n;
        if (n) {
          Tensor kv = s.cache->kv(S).unsqueeze(1);
          ops::mla_attention(q_lat.slice(0, r, r + n), q_pe.slice(0, r, r + n), kv, s.cache->k_pe(S).unsqueeze(1), kv,
                             o_lat.slice(0, r, r + n), softmax_scale_, s.cache->length, stream);
        }
        r += n;
      }
    });
  }
  for (const MlaSequence& s : seqs) s.cache->length += s.num_tokens;

  // 4. output projection
  profile.emplace("mla.o_proj");
  o_proj_->forward(o_v.view({T, H * dv}), y, stream);
}

void MLA::forward_table(const Tensor& x, const ops::KvTable& table, const Tensor& y, const Stream& stream) {
  const auto& c = cfg_;
  const int64_t H = c.num_heads, dr = c.qk_rope_head_dim, dv = c.v_head_dim, dc = c.kv_lora_rank;
  check_forward("forward_table", x, y);
  const int64_t B = x.size(0);
  LOCUS_CHECK(table.rows.defined() && table.rows.dim() == 1 && table.rows.size(0) == B, "MLA '", name(),
              "': the KV table must have one row per sequence (", B, ")");
  LOCUS_CHECK(table.width == dc + dr, "MLA '", name(), "': the KV table's caches have rows of ", table.width,
              " values but this layer needs ", dc, " + ", dr);
  if (B == 0) return;
  // The latent rows (kv_a_proj, its norm, the rope, the cache append: short kernels) are queued
  // on a side stream, beside the queries and their absorption, and joined before the attention.
  // The new token of sequence b sits at position lengths[b].
  std::optional<HostProfileScope> profile(std::in_place, "mla.kv_cache");
  ops::SideStream side(stream);
  side.run([&](const Stream& s) {
    Tensor kva = Tensor::empty({B, dc + dr}, DType::kBF16, device());
    kv_a_proj_->forward(x, kva, s);
    Tensor latent = Tensor::empty({B, dc + dr}, DType::kBF16, device());
    make_latent(kva, latent, table.lengths, s);
    ops::kv_append_rows(latent, table, s);
  });
  profile.emplace("mla.q");
  const Tensor q3 = queries(x, table.lengths, stream);
  profile.emplace("mla.attention");
  Tensor o_v = Tensor::empty({B, H, dv}, DType::kBF16, device());
  absorbed_attention(q3, o_v, stream, [&](const Tensor& q_lat, const Tensor& q_pe, const Tensor& o_lat) {
    side.join();
    ops::mla_attention_table(q_lat, q_pe, table, o_lat, softmax_scale_, stream);
  });
  profile.emplace("mla.o_proj");
  o_proj_->forward(o_v.view({B, H * dv}), y, stream);
}

void MLA::check_forward(const char* fn, const Tensor& x, const Tensor& y) const {
  const int64_t hidden = cfg_.hidden_size;
  LOCUS_CHECK(state_ == LifecycleState::kTransformed || state_ == LifecycleState::kLocalized, "MLA '", name(), "': ", fn,
              "() in state ", lifecycle_state_name(state()), " (load every weight and call transform() first)");
  LOCUS_CHECK(x.dim() == 2 && x.size(1) == hidden && x.dtype() == DType::kBF16, "MLA '", name(), "': x must be bf16 [T, ",
              hidden, "], got ", x.describe());
  const int64_t T = x.size(0);
  LOCUS_CHECK(y.dim() == 2 && y.size(0) == T && y.size(1) == hidden, "MLA '", name(), "': y must be [", T, ", ", hidden,
              "], got ", y.describe());
}

Tensor MLA::queries(const Tensor& x, const Tensor& positions, const Stream& stream) const {
  const auto& c = cfg_;
  const int64_t T = x.size(0), H = c.num_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  Tensor q = Tensor::empty({T, H * (dn + dr)}, DType::kBF16, device());
  if (q_a_proj_) {
    Tensor qa = Tensor::empty({T, c.q_lora_rank}, DType::kBF16, device());
    q_a_proj_->forward(x, qa, stream);
    Tensor qn = Tensor::empty({T, c.q_lora_rank}, DType::kBF16, device());
    q_a_layernorm_->forward(qa, qn, stream);
    q_b_proj_->forward(qn, q, stream);
  } else {
    q_proj_->forward(x, q, stream);
  }
  Tensor q3 = q.view({T, H, dn + dr});
  ops::apply_rope(q3.slice(2, dn, dn + dr), positions, rope_, /*interleaved=*/true, stream);
  return q3;
}

void MLA::make_latent(const Tensor& kva, const Tensor& dst, const Tensor& positions, const Stream& stream) const {
  const int64_t dc = cfg_.kv_lora_rank, dr = cfg_.qk_rope_head_dim;
  kv_a_layernorm_->forward(kva.slice(1, 0, dc), dst.slice(1, 0, dc), stream);
  ops::cast(kva.slice(1, dc, dc + dr), dst.slice(1, dc, dc + dr), stream);
  ops::apply_rope(dst.slice(1, dc, dc + dr).unsqueeze(1), positions, rope_, /*interleaved=*/true, stream);
}

void MLA::absorbed_attention(const Tensor& q3, const Tensor& o_v, const Stream& stream,
                             const std::function<void(const Tensor&, const Tensor&, const Tensor&)>& attend) const {
  const int64_t T = q3.size(0), H = cfg_.num_heads, dn = cfg_.qk_nope_head_dim, dc = cfg_.kv_lora_rank;
  Tensor q_lat = Tensor::empty({T, H, dc}, DType::kBF16, device());
  absorbed_bmm(q3.slice(2, 0, dn).transpose(0, 1), k_b_, false, k_b_plan_, q_lat.transpose(0, 1), stream);
  Tensor o_lat = Tensor::empty({T, H, dc}, DType::kBF16, device());
  attend(q_lat, q3.slice(2, dn, q3.size(2)), o_lat);
  absorbed_bmm(o_lat.transpose(0, 1), v_b_, true, v_b_plan_, o_v.transpose(0, 1), stream);
}

}  // namespace locus::modules
