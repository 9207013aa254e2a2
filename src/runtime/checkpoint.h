// A Hugging Face model directory: config.json plus model.safetensors, or sharded
// model-*.safetensors with model.safetensors.index.json ({"weight_map": {tensor: shard file}}).
// All shards are memory-mapped and their headers validated at open (safetensors.h); tensors are
// borrowed CPU views of the mapped files.
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/safetensors.h"

namespace locus::runtime {

class Checkpoint {
 public:
  // `dir` is the model directory. Errors: missing directory, no model.safetensors and no index,
  // malformed index JSON, a shard named by the index that is missing, a tensor the index maps to
  // a shard that does not hold it, a tensor present in two shards.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // config.json parsed (Error naming the path when missing or malformed).
  nlohmann::json config_json() const;
  bool has_file(const std::string& relative) const;  // e.g. "hf_quant_config.json"

  bool has(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // Metadata lookups, no data touched. Error naming the tensor and the directory when missing.
  const TensorInfo& info(const std::string& name) const;
  DType dtype(const std::string& name) const { return info(name).dtype; }
  const Shape& shape(const std::string& name) const { return info(name).shape; }
  std::string shard_path(const std::string& name) const;
  // The tensor as a borrowed CPU view (keeps its shard mapped while alive).
  Tensor get(const std::string& name) const;
  // Like get(), and checks dtype and shape; the Error names the tensor, expected and found.
  Tensor get(const std::string& name, DType dtype, const Shape& shape) const;
  // A scalar stored 0-d or as [1] (both are accepted), F32, BF16 or F16, returned as float.
  float get_scalar(const std::string& name) const;

  size_t num_shards() const { return shards_.size(); }
  uint64_t total_tensor_bytes() const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> shards_;
  std::map<std::string, int> where_;  // tensor -> shard index
};

}  // namespace locus::runtime
