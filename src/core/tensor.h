// Tensor: a typed, strided view over reference-counted storage on a device. Views (slice,
// select, view) share the storage; strides are in elements. Storage can be owned (allocated
// through the device's hooks, tagged with a locality domain) or borrowed (an mmap'd checkpoint,
// a caller's buffer), with an optional keep-alive handle for the borrowed memory's owner.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace locus {

using Shape = std::vector<int64_t>;

struct Storage {
  void* ptr = nullptr;
  size_t bytes = 0;
  Device device;
  int domain = -1;       // locality domain the bytes were placed in; -1 = not domain-tagged
  bool owned = false;    // true: freed through the device hooks when the last view goes away
  std::shared_ptr<void> keepalive;  // for borrowed memory (e.g. the mmap of a safetensors file)
  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialized contiguous tensor. domain tags the allocation (see DeviceHooks); -1 on a device
  // means default_allocation_domain() (core/device_hooks.h).
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(), int domain = -1);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu(), int domain = -1);
  // Borrowed memory, contiguous, or with explicit strides.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu(),
                          std::shared_ptr<void> keepalive = {});
  static Tensor from_blob_strided(void* data, const Shape& shape, const Shape& strides, DType dtype,
                                  Device device = Device::cpu(), std::shared_ptr<void> keepalive = {});

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const;
  int domain() const;
  int dim() const { return static_cast<int>(shape_.size()); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t size(int d) const;    // negative d counts from the back
  int64_t stride(int d) const;
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  // True when the last dim is dense and each row lies at a fixed stride (2-D GEMM operands).
  bool is_row_major_2d() const { return dim() == 2 && stride(1) == 1 && stride(0) >= size(1); }

  void* data_ptr() const;
  template <typename T>
  T* data() const { return static_cast<T*>(data_ptr()); }
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Views (share storage).
  Tensor slice(int dim, int64_t start, int64_t end) const;  // [start, end) along dim, strides kept
  Tensor select(int dim, int64_t index) const;              // removes dim
  Tensor view(const Shape& shape) const;                    // contiguous only; one -1 is inferred
  Tensor unsqueeze(int dim) const;
  Tensor transpose(int d0, int d1) const;                   // swaps dims and their strides

  // Copies.
  Tensor clone() const;                                      // contiguous copy, same device/domain
  Tensor to(Device device, int domain = -1) const;           // contiguous copy on another device
  void copy_(const Tensor& src);                             // same shape and dtype; any strides on CPU
  void fill_nan_();   // poisons the tensor with NaN (float types) or 0xFF bytes (others)
  void zero_();

  std::string shape_str() const;  // "[2, 3]"
  std::string describe() const;   // "bf16[2, 3] on cpu:0"

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::kFP32;
};

Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
std::string shape_to_string(const Shape& shape);

}  // namespace locus
