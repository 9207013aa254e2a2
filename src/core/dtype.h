// Element types. kFP4E2M1x2 is a packed byte holding two e2m1 values (element 2i in the low
// nibble, 2i+1 in the high nibble); a tensor of that dtype counts bytes in its last dimension,
// exactly as ModelOpt stores NVFP4 weights ([N, K/2] uint8).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace locus {

enum class DType : uint8_t { kBF16, kFP16, kFP32, kFP8E4M3, kFP4E2M1x2, kU8, kI32, kI64 };

size_t dtype_size(DType t);          // bytes per stored element
const char* dtype_name(DType t);     // "bf16", "fp32", ...
DType dtype_from_name(std::string_view name);  // throws Error naming the unknown dtype
// safetensors dtype strings ("BF16", "F32", "F8_E4M3", "U8", ...); throws on unsupported ones.
DType dtype_from_safetensors(std::string_view name);
const char* dtype_safetensors_name(DType t);

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::kCUDA, i}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string name() const;
};

}  // namespace locus
