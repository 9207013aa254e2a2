// MoE routing dumps (moe_routing_dump.h).
#include "modules/moe_routing_dump.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>

#include "core/error.h"

namespace locus::modules {
namespace {

void put_u32(std::FILE* f, uint32_t v) { std::fwrite(&v, sizeof v, 1, f); }

// Reads a dump's fields in order; every read past the end is an Error naming the file.
struct DumpReader {
  const std::string& path;
  std::string bytes;
  size_t pos = 0;
  int record = 0;
  void need(size_t n) const {
    LOCUS_CHECK(n <= bytes.size() - pos, "LOCUS_ROUTING_REPLAY: '", path, "' ends inside record ", record);
  }
  uint32_t u32() {
    need(4);
    uint32_t v;
    std::memcpy(&v, bytes.data() + pos, 4);
    pos += 4;
    return v;
  }
  std::string take(size_t n) {
    skip(n);
    return bytes.substr(pos - n, n);
  }
  void skip(size_t n) {
    need(n);
    pos += n;
  }
};

}  // namespace

const std::string& routing_dump_path() {
  static const std::string path = [] {
    const char* v = std::getenv("LOCUS_ROUTING_DUMP");
    return std::string(v ? v : "");
  }();
  return path;
}

void dump_routing(const std::string& path, const std::string& layer, const Tensor& logits, const Tensor& bias,
                  const ops::MoeRoutingConfig& cfg, const Tensor& ids) {
  static std::mutex mu;
  // to() makes a dense host copy (also of a strided CPU view).
  const Tensor l = logits.to(Device::cpu()), i = ids.to(Device::cpu());
  const Tensor b = bias.defined() ? bias.to(Device::cpu()) : Tensor();
  LOCUS_CHECK(l.dtype() == DType::kFP32 && i.dtype() == DType::kI32 && (!b.defined() || b.dtype() == DType::kFP32),
              "dump_routing: expected fp32 logits and bias and i32 ids");
  std::lock_guard<std::mutex> lock(mu);
  std::FILE* f = std::fopen(path.c_str(), "ab");
  LOCUS_CHECK(f != nullptr, "LOCUS_ROUTING_DUMP: cannot append to '", path, "'");
  std::fwrite("LRD1", 1, 4, f);
  put_u32(f, static_cast<uint32_t>(layer.size()));
  std::fwrite(layer.data(), 1, layer.size(), f);
  for (int64_t v : {l.size(0), l.size(1), i.size(1), cfg.n_group, cfg.topk_group,
                    static_cast<int64_t>(cfg.scoring == ops::MoeScoring::kSoftmax ? 1 : 0),
                    static_cast<int64_t>(b.defined() ? 1 : 0)})
    put_u32(f, static_cast<uint32_t>(v));
  std::fwrite(l.data_ptr(), sizeof(float), static_cast<size_t>(l.numel()), f);
  if (b.defined()) std::fwrite(b.data_ptr(), sizeof(float), static_cast<size_t>(b.numel()), f);
  std::fwrite(i.data_ptr(), sizeof(int32_t), static_cast<size_t>(i.numel()), f);
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  LOCUS_CHECK(ok, "LOCUS_ROUTING_DUMP: writing '", path, "' failed");
}

RoutingReplay::RoutingReplay(const std::string& path) : path_(path) {
  std::ifstream f(path, std::ios::binary);
  LOCUS_CHECK(f.good(), "LOCUS_ROUTING_REPLAY: cannot read '", path, "'");
  DumpReader r{path, std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>())};
  for (; r.pos < r.bytes.size(); ++r.record) {
    LOCUS_CHECK(r.take(4) == "LRD1", "LOCUS_ROUTING_REPLAY: '", path, "' record ", r.record,
                " does not start with LRD1 (not a LOCUS_ROUTING_DUMP file?)");
    const std::string layer = r.take(r.u32());
    Record rec;
    rec.tokens = r.u32();
    rec.experts = r.u32();
    rec.top_k = r.u32();
    r.u32();  // n_group
    r.u32();  // topk_group
    r.u32();  // scoring
    const bool has_bias = r.u32() != 0;
    r.skip(static_cast<size_t>(rec.tokens * rec.experts) * 4 + (has_bias ? static_cast<size_t>(rec.experts) * 4 : 0));
    rec.ids.resize(static_cast<size_t>(rec.tokens * rec.top_k));
    const size_t id_bytes = rec.ids.size() * sizeof(int32_t);
    r.need(id_bytes);
    std::memcpy(rec.ids.data(), r.bytes.data() + r.pos, id_bytes);
    r.pos += id_bytes;
    records_[layer].push_back(std::move(rec));
  }
}

void RoutingReplay::route(const std::string& layer, const Tensor& logits, const ops::MoeRoutingConfig& cfg,
                          const Tensor& weights, const Tensor& ids) {
  const Record* rec = nullptr;  // records_ is not changed after the constructor
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = records_.find(layer);
    index = next_[layer]++;
    LOCUS_CHECK(it != records_.end() && index < it->second.size(), "LOCUS_ROUTING_REPLAY: '", path_,
                "' has no record ", index, " for ", layer, " (it holds ", it == records_.end() ? 0 : it->second.size(),
                "): were the same prompts dumped?");
    rec = &it->second[index];
  }
  const int64_t T = logits.size(0);
  LOCUS_CHECK(rec->tokens == T && rec->experts == cfg.num_experts && rec->top_k == cfg.top_k, "LOCUS_ROUTING_REPLAY: ",
              layer, "'s record ", index, " in '", path_, "' has ", rec->tokens, " tokens, ", rec->experts,
              " experts, top_k ", rec->top_k, "; this call has ", T, ", ", cfg.num_experts, ", ", cfg.top_k);
  Tensor forced = Tensor::empty({T, cfg.top_k}, DType::kI32);
  std::memcpy(forced.data_ptr(), rec->ids.data(), rec->ids.size() * sizeof(int32_t));
  ops::moe_route_forced(logits, cfg, forced, weights, ids);
}

RoutingReplay* routing_replay() {
  static const std::unique_ptr<RoutingReplay> replay = []() -> std::unique_ptr<RoutingReplay> {
    const char* v = std::getenv("LOCUS_ROUTING_REPLAY");
    if (!v || !*v) return nullptr;
    return std::make_unique<RoutingReplay>(v);
  }();
  return replay.get();
}

}  // namespace locus::modules
