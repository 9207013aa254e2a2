#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/device_hooks.h"
#include "core/float_convert.h"

namespace locus {

Storage::~Storage() {
  if (owned && ptr) {
    device_hooks(device.type).deallocate(ptr, bytes, device.index, domain);
    record_allocation(device, domain, -static_cast<int64_t>(bytes));
  }
}

Shape contiguous_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

static void check_shape(const Shape& shape) {
  for (int64_t d : shape) LOCUS_CHECK(d >= 0, "negative dimension in shape ", shape_to_string(shape));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, int domain) {
  check_shape(shape);
  if (domain == -1) domain = default_allocation_domain();
  auto st = std::make_shared<Storage>();
  st->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  st->device = device;
  st->domain = domain;
  st->ptr = device_hooks(device.type).allocate(st->bytes, device.index, domain);
  st->owned = true;
  record_allocation(device, domain, static_cast<int64_t>(st->bytes));
  Tensor t;
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, int domain) {
  Tensor t = empty(shape, dtype, device, domain);
  t.zero_();
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::shared_ptr<void> keepalive) {
  return from_blob_strided(data, shape, contiguous_strides(shape), dtype, device, std::move(keepalive));
}

Tensor Tensor::from_blob_strided(void* data, const Shape& shape, const Shape& strides, DType dtype,
                                 Device device, std::shared_ptr<void> keepalive) {
  check_shape(shape);
  LOCUS_CHECK(shape.size() == strides.size(), "from_blob: shape ", shape_to_string(shape), " and strides ",
              shape_to_string(strides), " differ in rank");
  auto st = std::make_shared<Storage>();
  st->ptr = data;
  st->device = device;
  int64_t extent = 0;
  for (size_t i = 0; i < shape.size(); ++i) extent += (shape[i] > 0 ? shape[i] - 1 : 0) * strides[i];
  st->bytes = shape_numel(shape) ? static_cast<size_t>(extent + 1) * dtype_size(dtype) : 0;
  st->keepalive = std::move(keepalive);
  Tensor t;
  t.storage_ = std::move(st);
  t.shape_ = shape;
  t.strides_ = strides;
  t.dtype_ = dtype;
  return t;
}

Device Tensor::device() const { return storage_ ? storage_->device : Device::cpu(); }
int Tensor::domain() const { return storage_ ? storage_->domain : -1; }

int64_t Tensor::size(int d) const {
  int n = dim();
  if (d < 0) d += n;
  LOCUS_CHECK(d >= 0 && d < n, "dimension ", d, " out of range for tensor of rank ", n);
  return shape_[d];
}

int64_t Tensor::stride(int d) const {
  int n = dim();
  if (d < 0) d += n;
  LOCUS_CHECK(d >= 0 && d < n, "dimension ", d, " out of range for tensor of rank ", n);
  return strides_[d];
}

int64_t Tensor::numel() const { return shape_numel(shape_); }

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  LOCUS_CHECK(storage_, "data_ptr() on an undefined tensor");
  return static_cast<char*>(storage_->ptr) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  int n = dim();
  if (d < 0) d += n;
  LOCUS_CHECK(d >= 0 && d < n, "slice: dimension ", d, " out of range for ", describe());
  LOCUS_CHECK(0 <= start && start <= end && end <= shape_[d], "slice [", start, ", ", end,
              ") out of range for dim ", d, " of ", describe());
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  int n = dim();
  if (d < 0) d += n;
  LOCUS_CHECK(d >= 0 && d < n, "select: dimension ", d, " out of range for ", describe());
  LOCUS_CHECK(0 <= index && index < shape_[d], "select: index ", index, " out of range for dim ", d, " of ",
              describe());
  Tensor t = *this;
  t.offset_ += index * strides_[d];
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  LOCUS_CHECK(is_contiguous(), "view() needs a contiguous tensor, got ", describe(), " with strides ",
              shape_to_string(strides_));
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LOCUS_CHECK(infer < 0, "view(): more than one -1 in ", shape_to_string(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    LOCUS_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer ", shape_to_string(shape), " for ",
                describe());
    s[infer] = numel() / known;
  }
  LOCUS_CHECK(shape_numel(s) == numel(), "view(): ", shape_to_string(s), " has ", shape_numel(s),
              " elements, tensor ", describe(), " has ", numel());
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::unsqueeze(int d) const {
  int n = dim();
  if (d < 0) d += n + 1;
  LOCUS_CHECK(d >= 0 && d <= n, "unsqueeze: dimension out of range");
  Tensor t = *this;
  int64_t st = d < n ? strides_[d] * shape_[d] : 1;
  t.shape_.insert(t.shape_.begin() + d, 1);
  t.strides_.insert(t.strides_.begin() + d, st);
  return t;
}

Tensor Tensor::transpose(int d0, int d1) const {
  int n = dim();
  if (d0 < 0) d0 += n;
  if (d1 < 0) d1 += n;
  LOCUS_CHECK(d0 >= 0 && d0 < n && d1 >= 0 && d1 < n, "transpose: dimension out of range");
  Tensor t = *this;
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device(), domain());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device dev, int dom) const {
  Tensor t = empty(shape_, dtype_, dev, dom);
  t.copy_(*this);
  return t;
}

// Copies a CPU strided tensor element by element (byte-wise per element, any dtype).
static void copy_strided_cpu(const Tensor& dst, const Tensor& src) {
  const size_t es = dtype_size(dst.dtype());
  const int n = dst.dim();
  std::vector<int64_t> idx(n, 0);
  const int64_t total = dst.numel();
  char* d = static_cast<char*>(dst.data_ptr());
  const char* s = static_cast<const char*>(src.data_ptr());
  // Inner dimension copied as a run when both sides are dense in it.
  const int64_t inner = n ? dst.size(n - 1) : 1;
  const bool dense_inner = n == 0 || (dst.stride(n - 1) == 1 && src.stride(n - 1) == 1);
  for (int64_t done = 0; done < total;) {
    int64_t doff = 0, soff = 0;
    for (int i = 0; i < n; ++i) {
      doff += idx[i] * dst.stride(i);
      soff += idx[i] * src.stride(i);
    }
    if (dense_inner) {
      std::memcpy(d + doff * es, s + soff * es, inner * es);
      done += inner;
      if (n) idx[n - 1] = inner - 1;
    } else {
      std::memcpy(d + doff * es, s + soff * es, es);
      done += 1;
    }
    for (int i = n - 1; i >= 0; --i) {
      if (++idx[i] < dst.size(i)) break;
      idx[i] = 0;
    }
  }
}

void Tensor::copy_(const Tensor& src) {
  LOCUS_CHECK(defined() && src.defined(), "copy_: undefined tensor");
  LOCUS_CHECK(shape_ == src.shape_, "copy_: shape mismatch, destination ", describe(), " source ",
              src.describe());
  LOCUS_CHECK(dtype_ == src.dtype_, "copy_: dtype mismatch, destination ", describe(), " source ",
              src.describe());
  if (numel() == 0) return;
  Device dd = device(), sd = src.device();
  DeviceHooks& hooks = device_hooks(dd.is_cuda() || sd.is_cuda() ? DeviceType::kCUDA : DeviceType::kCPU);
  if (is_contiguous() && src.is_contiguous()) {
    hooks.copy(data_ptr(), dd, src.data_ptr(), sd, nbytes());
    return;
  }
  if (dd.is_cpu() && sd.is_cpu()) {
    copy_strided_cpu(*this, src);
    return;
  }
  // Across devices: row-strided 2-D views (the layout of output slices and weight shards).
  auto rows_view = [](const Tensor& t, int64_t& rows, int64_t& pitch) {
    if (t.dim() == 1 && t.stride(0) == 1) { rows = 1; pitch = t.size(0); return true; }
    if (t.dim() != 2 || t.stride(1) != 1) return false;
    rows = t.size(0);
    pitch = t.stride(0);
    return true;
  };
  int64_t dr, dp, sr, sp;
  LOCUS_CHECK(rows_view(*this, dr, dp) && rows_view(src, sr, sp),
              "copy_ across devices supports contiguous or row-strided 2-D tensors, got ", describe(), " <- ",
              src.describe());
  const size_t es = dtype_size(dtype_);
  hooks.copy_2d(data_ptr(), dp * es, dd, src.data_ptr(), sp * es, sd, size(-1) * es, dr);
}

void Tensor::fill_nan_() {
  if (numel() == 0) return;
  // Poison value per dtype: a quiet NaN where the format has one, all-ones bytes otherwise.
  uint32_t pattern = 0xFFFFFFFFu;
  switch (dtype_) {
    case DType::kFP32: pattern = 0x7FC00000u; break;
    case DType::kBF16: pattern = 0x7FC0u; break;
    case DType::kFP16: pattern = 0x7E00u; break;
    case DType::kFP8E4M3: pattern = 0x7Fu; break;
    default: break;
  }
  // Build a dense host tensor of the pattern, then copy it through copy_ (handles views and devices).
  const size_t es = dtype_size(dtype_);
  Tensor host = Tensor::empty(shape_, dtype_);
  char* p = static_cast<char*>(host.data_ptr());
  for (int64_t i = 0; i < numel(); ++i) std::memcpy(p + i * es, &pattern, es);
  copy_(host);
}

void Tensor::zero_() {
  if (numel() == 0) return;
  if (is_contiguous()) {
    device_hooks(device().type).fill_bytes(data_ptr(), device().index, 0, nbytes());
    return;
  }
  Tensor z = Tensor::zeros(shape_, dtype_);  // host zeros, then a strided copy
  copy_(z);
}

std::string Tensor::shape_str() const { return shape_to_string(shape_); }

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str(dtype_name(dtype_), shape_str(), " on ", device().name());
}

}  // namespace locus
