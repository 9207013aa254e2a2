// MoE routing dumps (moe_routing_dump.h).
#include "modules/moe_routing_dump.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace locus::modules {
namespace {

void put_u32(std::FILE* f, uint32_t v) { std::fwrite(&v, sizeof v, 1, f); }

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

}  // namespace locus::modules
