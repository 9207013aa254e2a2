#include "runtime/model_loader.h"

#include <chrono>
#include <map>
#include <set>

#include "core/device_hooks.h"
#include "core/float_convert.h"
#include "locality/topology.h"
#include "models/deepseek_v3_tensors.h"
#include "runtime/checkpoint.h"
#include "runtime/progress.h"

namespace locus::runtime {
namespace {

// Layer index of "model.layers.<L>.<...>", -1 when the name is not a layer tensor.
int64_t layer_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && j - i < 9 && name[j] >= '0' && name[j] <= '9') ++j;
  if (j == i || j >= name.size() || name[j] != '.') return -1;
  return std::stoll(name.substr(i, j - i));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string list_names(const std::vector<std::string>& names, size_t max = 8) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > max) s += str(", ... (", names.size(), " in all)");
  return s;
}

void note(const ModelLoaderOptions& o, LoadedModel& m, const std::string& text) {
  m.notes.push_back(text);
  if (o.log) std::fprintf(o.log, "locus: %s\n", text.c_str());
}

// Checks the checkpoint against the tensors the config implies. Returns the names to load.
std::vector<std::string> check_tensors(const Checkpoint& ck, const models::DeepseekV3Config& cfg,
                                       const models::QuantPredicate& is_nvfp4, const ModelLoaderOptions& opts,
                                       LoadedModel& out) {
  auto layout = [&](int64_t l) {
    const std::string p = str("model.layers.", l, ".mlp.experts.");
    return ck.has(p + "gate_up_proj") || ck.has(p + "down_proj") ? models::ExpertLayout::kFused
                                                                  : models::ExpertLayout::kPerExpert;
  };
  const auto expected = models::deepseek_v3_expected_tensors(cfg, is_nvfp4, layout);
  std::vector<std::string> missing, to_load;
  std::set<std::string> known;
  for (const auto& e : expected) {
    known.insert(e.name);
    if (!ck.has(e.name)) {
      if (!e.optional) missing.push_back(e.name);
      continue;
    }
    const TensorInfo& info = ck.info(e.name);
    bool dtype_ok = false;
    for (DType d : e.dtypes) dtype_ok = dtype_ok || d == info.dtype;
    LOCUS_CHECK(dtype_ok, "tensor ", e.name, " in ", ck.shard_path(e.name), " has dtype ", info.dtype_name,
                ", expected ", models::describe_dtypes(e.dtypes),
                is_nvfp4 ? " (per the quantization config and its exclude_modules)" : "");
    if (e.scalar) {
      LOCUS_CHECK(info.shape.empty() || info.shape == Shape{1}, "tensor ", e.name, " in ", ck.shard_path(e.name),
                  " has shape ", shape_to_string(info.shape), ", expected a scalar ([] or [1])");
    } else {
      LOCUS_CHECK(info.shape == e.shape, "tensor ", e.name, " in ", ck.shard_path(e.name), " has shape ",
                  shape_to_string(info.shape), ", expected ", shape_to_string(e.shape), " (from config.json)");
    }
    to_load.push_back(e.name);
  }
  LOCUS_CHECK(missing.empty(), "checkpoint ", ck.dir(), " is missing ", missing.size(), " tensor",
              missing.size() == 1 ? "" : "s", " the config needs: ", list_names(missing));

  std::vector<std::string> unexpected;
  int64_t ignored_layers = 0, ignored_buffers = 0;
  for (const auto& name : ck.names()) {
    if (known.count(name)) continue;
    if (layer_of(name) >= cfg.num_hidden_layers) {
      ++ignored_layers;  // MTP / next-token-prediction layers beyond num_hidden_layers
    } else if (ends_with(name, "rotary_emb.inv_freq")) {
      ++ignored_buffers;  // recomputed from the config
    } else {
      unexpected.push_back(name);
    }
  }
  LOCUS_CHECK(unexpected.empty(), "checkpoint ", ck.dir(), " holds ", unexpected.size(), " unexpected tensor",
              unexpected.size() == 1 ? "" : "s", " for a DeepSeek-V3 model with ", cfg.num_hidden_layers,
              " layers (wrong config.json, or a quantization format that does not match the quantization config?): ",
              list_names(unexpected));
  if (ignored_layers)
    note(opts, out, str("ignored ", ignored_layers, " tensors of layers >= num_hidden_layers = ", cfg.num_hidden_layers,
                        " (multi-token-prediction layers are not used)"));
  if (ignored_buffers) note(opts, out, str("ignored ", ignored_buffers, " rotary_emb.inv_freq buffers"));
  return to_load;
}

}  // namespace

Device device_for(const LlmArgs& args) {
  if (args.backend == "cuda") return Device::cuda(args.device);
  LOCUS_CHECK(args.backend == "cpu", "backend=", args.backend, " is not a known backend (cpu, cuda)");
  return Device::cpu();
}

ModelLoader::ModelLoader(LlmArgs args, ModelLoaderOptions opts) : args_(std::move(args)), opts_(opts) {}

LoadedModel ModelLoader::load() const {
  LOCUS_CHECK(!args_.model.empty(), "model is not set: pass --model DIR (a Hugging Face DeepSeek-V3 directory)");
  return load(args_.model);
}

LoadedModel ModelLoader::load(const std::string& dir) const {
  const auto t0 = std::chrono::steady_clock::now();
  validate(args_);  // option errors first, before any file is touched
  LoadedModel out;
  out.device = device_for(args_);

  Checkpoint ck = Checkpoint::open(dir);
  out.config = models::parse_deepseek_v3_config(ck.config_json(), dir + "/config.json");
  out.quant = load_quant_config(dir);
  if (out.quant.quantized())
    note(opts_, out, str("checkpoint is ", quant_algo_name(out.quant.algo), " (", out.quant.source,
                         "); NVFP4 weights run weight-only, activations BF16"));
  models::QuantPredicate is_nvfp4;
  if (out.quant.quantized()) {
    const QuantConfig q = out.quant;
    is_nvfp4 = [q](const std::string& m) { return q.is_quantized(m); };
  }

  models::DeepseekV3BuildOptions bo;
  bo.device = out.device;
  bo.max_positions = args_.max_seq_len;
  bo.is_nvfp4 = is_nvfp4;
  if (args_.enable_locality_domains) {
    out.topology = locality::resolve_topology(out.device, args_.locality_domains.emulate);
    auto planner = std::make_shared<locality::Planner>(to_locality_policy(args_), out.topology);
    out.runtime = locality::shared_locality_runtime(out.topology);
    out.planner = planner;
    bo.planner = out.planner;
    bo.runtime = out.runtime;
    note(opts_, out, str("locality domains on: ", out.topology.describe(), "; ", planner->partitions(),
                         " partitions per op"));
  }

  const auto names = check_tensors(ck, out.config, is_nvfp4, opts_, out);
  out.model = std::make_unique<models::DeepseekV3ForCausalLM>(out.config, bo);

  uint64_t total_bytes = 0;
  for (const auto& n : names) total_bytes += ck.info(n).nbytes();
  {
    ProgressBar bar("loading weights", names.size(), total_bytes, opts_.progress);
    for (const auto& n : names) {
      Tensor t = ck.get(n);
      // The router's correction bias is fp32 in Locus (HF keeps it fp32); some exports store bf16.
      if (ends_with(n, "e_score_correction_bias") && t.dtype() != DType::kFP32) {
        Tensor f = Tensor::empty(t.shape(), DType::kFP32);
        for (int64_t i = 0; i < t.numel(); ++i)
          f.data<float>()[i] = bf16_bits_to_f32(t.data<uint16_t>()[i]);
        t = f;
      }
      try {
        out.model->load(n, t);
      } catch (const Error& e) {
        LOCUS_THROW("loading tensor ", n, " from ", ck.shard_path(n), ": ", e.what());
      }
      bar.advance(1, ck.info(n).nbytes());
    }
    bar.finish();
  }
  out.weight_bytes = total_bytes;
  out.model->transform();
  if (args_.enable_locality_domains) out.model->localize();
  // Staging buffers and the full weights localize() released sit in the device's allocation
  // cache: give them back, so that the memory left for the KV cache is what is really free.
  release_device_cache(out.device);
  out.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace locus::runtime
