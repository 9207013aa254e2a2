#include "runtime/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/float_convert.h"

namespace locus::runtime {
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  LOCUS_CHECK(in.good(), "cannot read '", p.string(), "'");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    LOCUS_THROW("'", p.string(), "' is not valid JSON: ", e.what());
  }
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  LOCUS_CHECK(fs::exists(dir), "model directory '", dir, "' does not exist");
  LOCUS_CHECK(fs::is_directory(dir), "model path '", dir, "' is not a directory");
  Checkpoint c;
  c.dir_ = dir;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    nlohmann::json j = read_json_file(index);
    LOCUS_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "'", index.string(),
                "' has no \"weight_map\" object");
    std::map<std::string, int> shard_ids;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      LOCUS_CHECK(it.value().is_string(), "'", index.string(), "': weight_map entry '", it.key(),
                  "' is not a file name string");
      const std::string file = it.value().get<std::string>();
      LOCUS_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..", "'",
                  index.string(), "': weight_map entry '", it.key(), "' names '", file,
                  "', which is not a plain file name in the model directory");
      auto sid = shard_ids.find(file);
      if (sid == shard_ids.end()) {
        const fs::path sp = fs::path(dir) / file;
        LOCUS_CHECK(fs::exists(sp), "shard '", file, "' named by '", index.string(), "' (for tensor '", it.key(),
                    "') is missing");
        sid = shard_ids.emplace(file, static_cast<int>(c.shards_.size())).first;
        c.shards_.push_back(SafetensorsFile::open(sp.string()));
      }
      LOCUS_CHECK(c.shards_[sid->second]->has(it.key()), "tensor '", it.key(), "' is mapped to shard '", file,
                  "' by the index of '", dir, "', but that shard does not hold it");
      c.where_[it.key()] = sid->second;
    }
  } else if (fs::exists(single)) {
    c.shards_.push_back(SafetensorsFile::open(single.string()));
    for (const std::string& n : c.shards_[0]->names()) c.where_[n] = 0;
  } else {
    LOCUS_THROW("model directory '", dir, "' has neither model.safetensors nor model.safetensors.index.json");
  }
  return c;
}

nlohmann::json Checkpoint::config_json() const {
  const fs::path p = fs::path(dir_) / "config.json";
  LOCUS_CHECK(fs::exists(p), "model directory '", dir_, "' has no config.json");
  return read_json_file(p);
}

bool Checkpoint::has_file(const std::string& relative) const { return fs::exists(fs::path(dir_) / relative); }

bool Checkpoint::has(const std::string& name) const { return where_.count(name) != 0; }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [n, s] : where_) out.push_back(n);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  LOCUS_CHECK(it != where_.end(), "tensor '", name, "' is missing from the checkpoint in '", dir_, "'");
  return shards_[it->second]->info(name);
}

std::string Checkpoint::shard_path(const std::string& name) const {
  info(name);
  return shards_[where_.at(name)]->path();
}

Tensor Checkpoint::get(const std::string& name) const {
  info(name);
  return shards_[where_.at(name)]->get(name);
}

Tensor Checkpoint::get(const std::string& name, DType dtype, const Shape& shape) const {
  const TensorInfo& i = info(name);
  const bool dtype_ok = i.dtype == dtype || (dtype == DType::kFP4E2M1x2 && i.dtype == DType::kU8);
  LOCUS_CHECK(dtype_ok && i.shape == shape, "tensor '", name, "' in '", dir_, "': expected ", dtype_name(dtype),
              shape_to_string(shape), ", found ", i.dtype_name, shape_to_string(i.shape));
  return get(name);
}

float Checkpoint::get_scalar(const std::string& name) const {
  const TensorInfo& i = info(name);
  const bool scalar_shape = i.shape.empty() || (i.shape.size() == 1 && i.shape[0] == 1);
  LOCUS_CHECK(scalar_shape, "tensor '", name, "' in '", dir_, "' should be a scalar (0-d or [1]), found shape ",
              shape_to_string(i.shape));
  Tensor t = get(name);
  switch (i.dtype) {
    case DType::kFP32: {
      float v;
      std::memcpy(&v, t.data_ptr(), 4);
      return v;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, t.data_ptr(), 2);
      return bf16_bits_to_f32(h);
    }
    case DType::kFP16: {
      uint16_t h;
      std::memcpy(&h, t.data_ptr(), 2);
      return f16_bits_to_f32(h);
    }
    default:
      LOCUS_THROW("tensor '", name, "' in '", dir_, "' should be a float scalar (F32, BF16 or F16), found ",
                  i.dtype_name);
  }
}

uint64_t Checkpoint::total_tensor_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, s] : where_) n += shards_[s]->info(name).nbytes();
  return n;
}

}  // namespace locus::runtime
