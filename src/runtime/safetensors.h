// safetensors files: a memory-mapped reader with a fully validated header, and a writer.
//
// Format: 8-byte little-endian header length H, H bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}},
// then the data section; offsets are relative to the data section's start.
// The reader checks, at open: file at least 8 bytes; H <= kMaxHeaderBytes and 8 + H <= file size;
// the header is valid JSON (parse errors name the file); every entry has a known dtype, a
// non-negative integer shape and data_offsets with begin <= end <= data size; end - begin ==
// numel * dtype size; no two tensors overlap; __metadata__ maps strings to strings. Every Error
// names the file and, where one is at fault, the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace locus::runtime {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;  // 100 MB

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::string dtype_name;   // as written in the file ("BF16", "F8_E4M3", "U8", ...)
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section
  uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps the file (private copy-on-write: the file is never modified) and validates its header.
  // Throws Error naming the path.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return 8 + header_len_; }  // file offset of the data section
  // Tensor names in data-offset order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return infos_.count(name) != 0; }
  // Dtype/shape/offsets without touching the data; Error naming the tensor and the file.
  const TensorInfo& info(const std::string& name) const;
  // A borrowed, contiguous CPU view of the mapped bytes (no copy; pages load on first touch).
  // Writing through it changes only this process's copy, never the file.
  // Its storage keeps this file mapped for as long as the tensor lives.
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  uint64_t file_size_ = 0, header_len_ = 0;
  void* map_ = nullptr;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;  // handed to tensors as their keepalive
};

// Collects tensors (any device, any strides: they are copied to contiguous CPU bytes when
// written) and writes one safetensors file. Tensors keep insertion order in the data section.
class SafetensorsWriter {
 public:
  // dtype_override writes the tensor's bytes under another safetensors dtype name of the same
  // element size (e.g. "U8" for kFP4E2M1x2, which is what ModelOpt writes).
  // Error when the name was already added.
  void add(const std::string& name, const Tensor& t, const std::string& dtype_override = "");
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  bool has(const std::string& name) const;
  size_t size() const { return tensors_.size(); }
  uint64_t data_bytes() const;
  // Writes the file (header padded with spaces to a multiple of 8 bytes). Error naming the path.
  void write(const std::string& path) const;

 private:
  struct Item {
    std::string name;
    Tensor tensor;
    std::string dtype_name;
  };
  std::vector<Item> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace locus::runtime
