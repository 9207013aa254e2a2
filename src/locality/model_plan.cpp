#include "locality/model_plan.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace locus::locality {

namespace {

std::string shape2(int64_t rows, int64_t cols) { return str("[", rows, ", ", cols, "]"); }

std::string mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string gib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

int domains_of(const Planner& planner) { return planner.topology().num_domains; }

// Adds partition p's bytes to the domain that runs it (p % domains).
void add_to_domain(std::vector<int64_t>& bytes, int p, int64_t b) { bytes[p % bytes.size()] += b; }

LayerPlan linear_entry(const Planner& planner, std::string type, std::string module, int64_t count, int64_t in,
                       int64_t out, QuantKind quant, WeightMode mode) {
  LayerPlan e;
  e.layer_type = std::move(type);
  e.module = std::move(module);
  e.count = count;
  e.quant = quant;
  const int64_t rows = mode == WeightMode::kFusedGateUp ? 2 * out : out;
  e.shape = shape2(rows, in);
  e.whole_bytes = weight_bytes(rows, in, quant);
  e.plan = planner.plan_linear(e.module, in, out, quant, mode);
  if (e.plan.enabled) {
    e.domain_bytes.assign(domains_of(planner), 0);
    for (int p = 0; p < e.plan.layout.num_partitions(); ++p) {
      add_to_domain(e.domain_bytes, p, weight_bytes(e.plan.layout.weight_rows(p), in, quant));
    }
  }
  return e;
}

LayerPlan bmm_entry(const Planner& planner, std::string type, std::string module, int64_t count, int64_t heads,
                    int64_t k, int64_t n) {
  LayerPlan e;
  e.layer_type = std::move(type);
  e.module = std::move(module);
  e.count = count;
  e.quant = QuantKind::kBF16;
  e.shape = str(heads, " x ", shape2(k, n));
  e.whole_bytes = heads * k * n * 2;
  e.plan = planner.plan_bmm(e.module, heads, k, n);
  if (e.plan.enabled) {
    e.domain_bytes.assign(domains_of(planner), 0);
    for (int p = 0; p < e.plan.layout.num_partitions(); ++p) {
      add_to_domain(e.domain_bytes, p, e.plan.layout.parts[p].rows() * k * n * 2);
    }
  }
  return e;
}

LayerPlan moe_entry(const Planner& planner, std::string module, int64_t count, int64_t experts, int64_t hidden,
                    int64_t inter, QuantKind quant) {
  LayerPlan e;
  e.layer_type = "experts";
  e.module = std::move(module);
  e.count = count;
  e.quant = quant;
  e.shape = str(experts, " x (gate_up ", shape2(2 * inter, hidden), " + down ", shape2(hidden, inter), ")");
  e.whole_bytes = experts * (weight_bytes(2 * inter, hidden, quant) + weight_bytes(hidden, inter, quant));
  e.plan = planner.plan_moe(e.module, experts, hidden, inter, quant);
  if (e.plan.enabled) {
    e.domain_bytes.assign(domains_of(planner), 0);
    for (int p = 0; p < e.plan.layout.num_partitions(); ++p) {
      add_to_domain(e.domain_bytes, p, experts * weight_bytes(e.plan.layout.weight_rows(p), hidden, quant));
    }
    for (int p = 0; p < e.plan.down_layout.num_partitions(); ++p) {
      add_to_domain(e.domain_bytes, p, experts * weight_bytes(e.plan.down_layout.parts[p].rows(), inter, quant));
    }
  }
  return e;
}

}  // namespace

void DeepseekShapes::validate() const {
  auto positive = [](const char* name, int64_t v) {
    LOCUS_CHECK(v >= 1, "model shape ", name, " must be positive, got ", v);
  };
  positive("hidden", hidden);
  positive("intermediate", intermediate);
  positive("moe_intermediate", moe_intermediate);
  positive("heads", heads);
  positive("kv_lora_rank", kv_lora_rank);
  positive("qk_nope", qk_nope);
  positive("qk_rope", qk_rope);
  positive("v_head", v_head);
  positive("vocab", vocab);
  positive("layers", layers);
  LOCUS_CHECK(q_lora_rank >= 0, "model shape q_lora_rank must be 0 (none) or positive, got ", q_lora_rank);
  LOCUS_CHECK(experts >= 0, "model shape experts must be 0 (no MoE) or positive, got ", experts);
  LOCUS_CHECK(experts == 0 || (experts_per_token >= 1 && experts_per_token <= experts),
              "model shape experts_per_token must be in [1, experts=", experts, "], got ", experts_per_token);
  LOCUS_CHECK(shared_experts >= 0, "model shape shared_experts must not be negative, got ", shared_experts);
  LOCUS_CHECK(dense_layers >= 0 && dense_layers <= layers, "model shape dense_layers must be in [0, layers=", layers,
              "], got ", dense_layers);
}

int64_t weight_bytes(int64_t rows, int64_t k, QuantKind quant) {
  switch (quant) {
    case QuantKind::kBF16: return rows * k * 2;
    case QuantKind::kNVFP4: return rows * ((k + 1) / 2) + rows * ((k + 15) / 16);
    case QuantKind::kFP8: return rows * k;
  }
  return 0;
}

std::vector<LayerPlan> plan_deepseek_model(const DeepseekShapes& s, const Planner& planner,
                                           const std::function<QuantKind(const std::string&)>& quant_of) {
  s.validate();
  std::vector<LayerPlan> out;
  const std::string attn = "model.layers.0.self_attn.";
  const int64_t qk_head = s.qk_nope + s.qk_rope;
  auto linear = [&](const char* type, const std::string& module, int64_t count, int64_t in, int64_t n,
                    WeightMode mode = WeightMode::kVanilla) {
    out.push_back(linear_entry(planner, type, module, count, in, n, quant_of(module), mode));
  };
  if (s.q_lora_rank > 0) {
    linear("q_a_proj", attn + "q_a_proj", s.layers, s.hidden, s.q_lora_rank);
    linear("q_b_proj", attn + "q_b_proj", s.layers, s.q_lora_rank, s.heads * qk_head);
  } else {
    linear("q_proj", attn + "q_proj", s.layers, s.hidden, s.heads * qk_head);
  }
  linear("kv_a_proj", attn + "kv_a_proj_with_mqa", s.layers, s.hidden, s.kv_lora_rank + s.qk_rope);
  // The MLA module keeps it whole even where the planner would split it: report what really runs.
  if (out.back().plan.enabled) {
    out.back().plan.enabled = false;
    out.back().plan.reason = kKvAProjUnpartitionedReason;
    out.back().domain_bytes.clear();
  }
  // MLA weight absorption: kv_b_proj becomes two per-head BMM operands (split over heads).
  out.push_back(bmm_entry(planner, "kv_b absorbed k", attn + "kv_b_proj.k_absorbed", s.layers, s.heads, s.qk_nope,
                          s.kv_lora_rank));
  out.push_back(bmm_entry(planner, "kv_b absorbed v", attn + "kv_b_proj.v_absorbed", s.layers, s.heads,
                          s.kv_lora_rank, s.v_head));
  linear("o_proj", attn + "o_proj", s.layers, s.heads * s.v_head, s.hidden);

  const int64_t moe_layers = s.experts > 0 ? s.layers - s.dense_layers : 0;
  const int64_t dense_layers = s.layers - moe_layers;
  if (dense_layers > 0) {
    const std::string mlp = "model.layers.0.mlp.";
    linear("dense gate_up", mlp + "gate_up_proj", dense_layers, s.hidden, s.intermediate, WeightMode::kFusedGateUp);
    linear("dense down", mlp + "down_proj", dense_layers, s.intermediate, s.hidden);
  }
  if (moe_layers > 0) {
    const std::string mlp = str("model.layers.", s.dense_layers, ".mlp.");
    linear("router gate", mlp + "gate", moe_layers, s.hidden, s.experts);
    out.push_back(moe_entry(planner, mlp + "experts", moe_layers, s.experts, s.hidden, s.moe_intermediate,
                            quant_of(mlp + "experts.0.gate_proj")));
    if (s.shared_experts > 0) {
      const int64_t inter = s.moe_intermediate * s.shared_experts;
      linear("shared gate_up", mlp + "shared_experts.gate_up_proj", moe_layers, s.hidden, inter,
             WeightMode::kFusedGateUp);
      linear("shared down", mlp + "shared_experts.down_proj", moe_layers, inter, s.hidden);
    }
  }
  linear("lm_head", "lm_head", 1, s.hidden, s.vocab);
  return out;
}

std::string format_model_plan(const std::vector<LayerPlan>& plans, const Planner& planner) {
  const LocalityDomainPolicy& pol = planner.policy();
  const int domains = domains_of(planner);
  std::string s = "topology: " + planner.topology().describe() + "\n";
  s += str("policy: ", pol.enabled ? "enabled" : "disabled (pass --enable-locality-domains)", ", ",
           planner.partitions(), " partitions", pol.num_partitions > 0 ? "" : " (the domain count)",
           ", allowed_ops ", pol.allowed_ops_str(), ", excluded modules:");
  for (const std::string& p : pol.exclude_modules) s += " " + p;
  s += "\n\n";

  std::vector<int64_t> total_domain(domains, 0);
  int64_t total_whole = 0;
  for (const LayerPlan& e : plans) {
    s += str(e.layer_type, " (", e.module, ", x", e.count, "): ", quant_kind_name(e.quant), " ", e.shape, "\n");
    s += "  " + e.plan.describe() + "\n";
    if (e.plan.enabled) {
      s += "  weight bytes per domain:";
      for (int d = 0; d < domains; ++d) {
        s += str(d ? ", d" : " d", d, " ", mib(e.domain_bytes[d]));
        total_domain[d] += e.count * e.domain_bytes[d];
      }
      s += " (of " + mib(e.whole_bytes) + ")\n";
    } else {
      s += "  weight bytes: " + mib(e.whole_bytes) + " whole, in no domain\n";
      total_whole += e.count * e.whole_bytes;
    }
  }
  int64_t total = total_whole;
  s += "\nmodel totals (Linear, MoE and absorbed attention weights; embedding and norms not counted):\n ";
  for (int d = 0; d < domains; ++d) {
    s += str(" d", d, " ", gib(total_domain[d]), ",");
    total += total_domain[d];
  }
  s += " not partitioned " + gib(total_whole) + "; total " + gib(total) + "\n";
  return s;
}

double decode_step_weight_bytes(const std::vector<LayerPlan>& plans, const DeepseekShapes& shapes, int64_t batch) {
  LOCUS_CHECK(batch >= 1, "decode batch must be positive, got ", batch);
  double bytes = 0;
  for (const LayerPlan& e : plans) {
    double share = 1.0;  // of the entry's weights one step reads
    if (e.layer_type == "experts" && shapes.experts > 0) {
      const double k_of_e = static_cast<double>(shapes.experts_per_token) / static_cast<double>(shapes.experts);
      share = 1.0 - std::pow(1.0 - k_of_e, static_cast<double>(batch));
    }
    bytes += static_cast<double>(e.count) * static_cast<double>(e.whole_bytes) * share;
  }
  return bytes;
}

std::string format_decode_floor(const std::vector<LayerPlan>& plans, const DeepseekShapes& shapes,
                                const std::vector<int64_t>& batches, double bandwidth_gbs) {
  std::string s = "decode step weight reads (routed experts: those the batch's tokens pick under uniform routing; "
                  "KV cache, embedding rows and norms not counted):\n";
  for (const int64_t b : batches) {
    const double bytes = decode_step_weight_bytes(plans, shapes, b);
    char buf[160];
    std::snprintf(buf, sizeof buf, "  batch %lld: %.3f GiB per step", static_cast<long long>(b),
                  bytes / (1024.0 * 1024.0 * 1024.0));
    s += buf;
    if (bandwidth_gbs > 0) {
      const double step_s = bytes / (bandwidth_gbs * 1e9);
      std::snprintf(buf, sizeof buf, "; floor at %.0f GB/s: %.3f ms per step, %.1f tok/s", bandwidth_gbs,
                    step_s * 1e3, static_cast<double>(b) / step_s);
      s += buf;
    }
    s += "\n";
  }
  return s;
}

}  // namespace locus::locality
