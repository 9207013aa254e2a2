// ModelLoader on the tiny checkpoint and on corrupted copies of it: missing, mis-shaped and
// unexpected tensors are Errors naming the tensor; MTP layers are ignored; the HF fused expert
// form loads to the same model; option validation comes before any file is read.
#include "runtime/model_loader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "models/model_test_util.h"
#include "runtime/safetensors.h"

namespace locus::testing {
namespace {

namespace fs = std::filesystem;
using Rewrite = std::function<std::vector<std::pair<std::string, Tensor>>(const std::string&, const Tensor&)>;

// Copies the checkpoint in `src` to `dst` as one model.safetensors, passing every tensor through
// `rewrite` (which may drop, change or add tensors), plus `extra` tensors at the end.
void rewrite_checkpoint(const std::string& src, const std::string& dst, const Rewrite& rewrite,
                        std::vector<std::pair<std::string, Tensor>> extra = {}) {
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string f = e.path().filename().string();
    if (f.find(".safetensors") == std::string::npos) fs::copy_file(e.path(), fs::path(dst) / f);
  }
  auto ck = runtime::Checkpoint::open(src);
  runtime::SafetensorsWriter w;
  for (const auto& name : ck.names())
    for (auto& [n, t] : rewrite(name, ck.get(name))) w.add(n, t);
  for (auto& [n, t] : extra) w.add(n, t);
  w.write(dst + "/model.safetensors");
}

std::vector<std::pair<std::string, Tensor>> keep(const std::string& n, const Tensor& t) { return {{n, t}}; }

runtime::LoadedModel load_quiet(const std::string& dir) { return load_model(dir, 0); }

TEST(ModelLoader, LoadsTheTinyCheckpointFully) {
  auto lm = load_quiet(tiny_model_dir(false));
  EXPECT_EQ(lm.model->state(), modules::LifecycleState::kTransformed);
  EXPECT_TRUE(lm.model->missing_pieces().empty());
  EXPECT_GT(lm.weight_bytes, 0u);
  EXPECT_FALSE(lm.planner);
  auto nv = load_quiet(tiny_model_dir(true));
  EXPECT_TRUE(nv.quant.quantized());
  EXPECT_LT(nv.weight_bytes, lm.weight_bytes);  // 4-bit MLP/expert weights
}

TEST(ModelLoader, MissingTensorIsAnErrorNamingIt) {
  TempDir d;
  const std::string victim = "model.layers.1.mlp.experts.3.up_proj.weight";
  rewrite_checkpoint(tiny_model_dir(false), d.path(), [&](const std::string& n, const Tensor& t) {
    return n == victim ? std::vector<std::pair<std::string, Tensor>>{} : keep(n, t);
  });
  expect_error([&] { load_quiet(d.path()); }, {"missing", victim});
}

TEST(ModelLoader, WrongShapeIsAnErrorNamingTheTensorAndBothShapes) {
  TempDir d;
  const std::string victim = "model.layers.0.self_attn.kv_b_proj.weight";
  Shape want;
  rewrite_checkpoint(tiny_model_dir(false), d.path(), [&](const std::string& n, const Tensor& t) {
    if (n != victim) return keep(n, t);
    want = t.shape();
    return keep(n, t.slice(0, 0, t.size(0) - 16));
  });
  Shape got = want;
  got[0] -= 16;
  expect_error([&] { load_quiet(d.path()); }, {victim, shape_to_string(got), shape_to_string(want)});
}

TEST(ModelLoader, WrongDtypeIsAnErrorNamingTheTensor) {
  TempDir d;
  const std::string victim = "model.layers.0.mlp.down_proj.weight";
  rewrite_checkpoint(tiny_model_dir(false), d.path(), [&](const std::string& n, const Tensor& t) {
    return n == victim ? keep(n, Tensor::zeros(t.shape(), DType::kFP16)) : keep(n, t);
  });
  expect_error([&] { load_quiet(d.path()); }, {victim, "dtype"});
}

TEST(ModelLoader, UnexpectedTensorIsAnErrorButMtpLayersAreIgnoredWithANote) {
  {
    TempDir d;
    rewrite_checkpoint(tiny_model_dir(false), d.path(), keep,
                       {{"model.layers.0.mlp.bogus.weight", Tensor::zeros({4, 4}, DType::kBF16)}});
    expect_error([&] { load_quiet(d.path()); }, {"unexpected", "model.layers.0.mlp.bogus.weight"});
  }
  TempDir d;
  auto cfg = load_quiet(tiny_model_dir(false)).config;
  const std::string mtp = str("model.layers.", cfg.num_hidden_layers, ".");
  rewrite_checkpoint(tiny_model_dir(false), d.path(), keep,
                     {{mtp + "eh_proj.weight", Tensor::zeros({8, 16}, DType::kBF16)},
                      {mtp + "enorm.weight", Tensor::zeros({16}, DType::kBF16)}});
  auto lm = load_quiet(d.path());
  bool noted = false;
  for (const auto& n : lm.notes) noted = noted || n.find("ignored 2 tensors") != std::string::npos;
  EXPECT_TRUE(noted);
  // Same weights as the original: same logits.
  auto ref = load_quiet(tiny_model_dir(false));
  const auto ids = random_ids(4, cfg.vocab_size, fresh_seed());
  EXPECT_TRUE(bitwise_equal(prefill_logits(*lm.model, ids), prefill_logits(*ref.model, ids)));
}

// transformers keeps experts fused in memory: mlp.experts.gate_up_proj [E, 2I, D] (gate rows
// first) and mlp.experts.down_proj [E, D, I]. A checkpoint in that form loads to the same model.
TEST(ModelLoader, FusedHfExpertTensorsLoadToTheSameModel) {
  auto ref = load_quiet(tiny_model_dir(false));
  const auto& c = ref.config;
  const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size, D = c.hidden_size;
  std::map<int64_t, std::pair<Tensor, Tensor>> fused;  // layer -> (gate_up, down)
  auto parse = [](const std::string& n, int64_t* layer, int64_t* e, std::string* proj) {
    long l = -1, x = -1;
    if (std::sscanf(n.c_str(), "model.layers.%ld.mlp.experts.%ld.", &l, &x) != 2) return false;
    *layer = l;
    *e = x;
    const std::string marker = str(".experts.", x, ".");
    const size_t p = n.find(marker) + marker.size();
    *proj = n.substr(p, n.find('.', p) - p);
    return true;
  };
  TempDir d;
  rewrite_checkpoint(tiny_model_dir(false), d.path(), [&](const std::string& n, const Tensor& t) {
    int64_t layer = -1, e = -1;
    std::string proj;
    if (!parse(n, &layer, &e, &proj)) return keep(n, t);
    auto& f = fused[layer];
    if (!f.first.defined()) {
      f.first = Tensor::empty({E, 2 * I, D}, DType::kBF16);
      f.second = Tensor::empty({E, D, I}, DType::kBF16);
    }
    if (proj == "gate_proj") f.first.select(0, e).slice(0, 0, I).copy_(t);
    if (proj == "up_proj") f.first.select(0, e).slice(0, I, 2 * I).copy_(t);
    if (proj == "down_proj") f.second.select(0, e).copy_(t);
    EXPECT_TRUE(proj == "gate_proj" || proj == "up_proj" || proj == "down_proj") << n;
    return std::vector<std::pair<std::string, Tensor>>{};
  });
  ASSERT_FALSE(fused.empty());
  // Re-write with the fused tensors added.
  TempDir d2;
  std::vector<std::pair<std::string, Tensor>> extra;
  for (auto& [l, f] : fused) {
    extra.push_back({str("model.layers.", l, ".mlp.experts.gate_up_proj"), f.first});
    extra.push_back({str("model.layers.", l, ".mlp.experts.down_proj"), f.second});
  }
  rewrite_checkpoint(d.path(), d2.path(), keep, extra);
  auto lm = load_quiet(d2.path());
  const auto ids = random_ids(5, c.vocab_size, fresh_seed());
  EXPECT_TRUE(bitwise_equal(prefill_logits(*lm.model, ids), prefill_logits(*ref.model, ids)));
}

TEST(ModelLoader, Bf16CorrectionBiasIsAccepted) {
  TempDir d;
  int converted = 0;
  rewrite_checkpoint(tiny_model_dir(false), d.path(), [&](const std::string& n, const Tensor& t) {
    if (n.find("e_score_correction_bias") == std::string::npos) return keep(n, t);
    Tensor b = Tensor::empty(t.shape(), DType::kBF16);
    for (int64_t i = 0; i < t.numel(); ++i) set(b, i, get(t, i));
    ++converted;
    return keep(n, b);
  });
  ASSERT_GT(converted, 0);
  auto lm = load_quiet(d.path());
  EXPECT_EQ(lm.model->state(), modules::LifecycleState::kTransformed);
}

TEST(ModelLoader, OptionErrorsComeFirstAndNameBothOptions) {
  runtime::LlmArgs a = tiny_args("/nonexistent/model/dir", 2);
  a.weight_sharing = true;
  runtime::ModelLoaderOptions o;
  o.progress = false;
  o.log = nullptr;
  expect_error([&] { runtime::ModelLoader(a, o).load(); }, {"enable_locality_domains", "weight_sharing"});
  a.weight_sharing = false;
  expect_error([&] { runtime::ModelLoader(a, o).load(); }, {"/nonexistent/model/dir"});
  runtime::LlmArgs empty;
  expect_error([&] { runtime::ModelLoader(empty, o).load(); }, {"model"});
}

TEST(ModelLoader, LocalityDomainsLocalizeAfterLoadAndReleaseFullWeights) {
  auto lm = load_model(tiny_model_dir(false), 2);
  ASSERT_TRUE(lm.planner);
  EXPECT_EQ(lm.model->state(), modules::LifecycleState::kLocalized);
  // A partitioned Linear holds shards only, each in its domain.
  auto& q_b = *lm.model->layer(0).self_attn().q_b_proj();
  ASSERT_TRUE(q_b.plan().enabled) << q_b.plan().describe();
  EXPECT_FALSE(q_b.weight().defined());
  ASSERT_EQ(q_b.shards().size(), 2u);
  EXPECT_EQ(q_b.shards()[0].domain(), 0);
  EXPECT_EQ(q_b.shards()[1].domain(), 1);
}

}  // namespace
}  // namespace locus::testing
