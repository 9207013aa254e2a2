#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace locus::runtime {
namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses a non-negative JSON integer; Error with `what` otherwise.
uint64_t as_u64(const nlohmann::json& v, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    LOCUS_CHECK(i >= 0, what, " is negative (", i, ")");
    return static_cast<uint64_t>(i);
  }
  LOCUS_THROW(what, " is not an integer (found ", v.dump(), ")");
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOCUS_CHECK(f.fd >= 0, "cannot open safetensors file '", path, "': ", std::strerror(errno));
  struct stat st {};
  LOCUS_CHECK(::fstat(f.fd, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
  LOCUS_CHECK(S_ISREG(st.st_mode), "safetensors path '", path, "' is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  LOCUS_CHECK(size >= 8, "safetensors file '", path, "' is truncated: ", size,
              " bytes, shorter than the 8-byte header length");

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->file_size_ = size;
  // Private, writable copy-on-write mapping: pages are shared with the page cache until written,
  // so a caller that transforms a borrowed weight in place does not fault (nor change the file).
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, f.fd, 0);
  LOCUS_CHECK(m != MAP_FAILED, "cannot mmap '", path, "' (", size, " bytes): ", std::strerror(errno));
  file->map_ = m;
  const auto* base = static_cast<const unsigned char*>(m);

  const uint64_t hlen = read_u64_le(base);
  LOCUS_CHECK(hlen <= kMaxSafetensorsHeaderBytes, "safetensors file '", path, "': header length ", hlen,
              " bytes exceeds the limit of ", kMaxSafetensorsHeaderBytes, " bytes (corrupt or not a safetensors file)");
  LOCUS_CHECK(hlen <= size - 8, "safetensors file '", path, "' is truncated or corrupt: header length ", hlen,
              " runs past the end of the file (", size, " bytes)");
  file->header_len_ = hlen;
  const uint64_t data_size = size - 8 - hlen;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + hlen);
  } catch (const nlohmann::json::parse_error& e) {
    LOCUS_THROW("safetensors file '", path, "': header is not valid JSON: ", e.what());
  }
  LOCUS_CHECK(header.is_object(), "safetensors file '", path, "': header is not a JSON object");

  std::vector<TensorInfo> infos;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      LOCUS_CHECK(v.is_object() || v.is_null(), "safetensors file '", path, "': __metadata__ is not an object");
      if (v.is_object()) {
        for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
          LOCUS_CHECK(m2.value().is_string(), "safetensors file '", path, "': __metadata__ value of '", m2.key(),
                      "' is not a string");
          file->metadata_[m2.key()] = m2.value().get<std::string>();
        }
      }
      continue;
    }
    const std::string where = str("safetensors file '", path, "': tensor '", name, "'");
    LOCUS_CHECK(v.is_object(), where, ": entry is not an object");
    LOCUS_CHECK(v.contains("dtype") && v["dtype"].is_string(), where, ": missing or non-string 'dtype'");
    LOCUS_CHECK(v.contains("shape") && v["shape"].is_array(), where, ": missing or non-array 'shape'");
    LOCUS_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, where,
                ": 'data_offsets' must be an array [begin, end]");
    TensorInfo info;
    info.name = name;
    info.dtype_name = v["dtype"].get<std::string>();
    try {
      info.dtype = dtype_from_safetensors(info.dtype_name);
    } catch (const Error& e) {
      LOCUS_THROW(where, ": ", e.what());
    }
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : v["shape"]) {
      uint64_t dim = 0;
      try {
        dim = as_u64(d, "shape entry");
      } catch (const Error& e) {
        LOCUS_THROW(where, ": ", e.what());
      }
      LOCUS_CHECK(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where, ": dimension ", dim,
                  " too large");
      info.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
      numel *= dim;
    }
    try {
      info.begin = as_u64(v["data_offsets"][0], "data_offsets begin");
      info.end = as_u64(v["data_offsets"][1], "data_offsets end");
    } catch (const Error& e) {
      LOCUS_THROW(where, ": ", e.what());
    }
    LOCUS_CHECK(info.begin <= info.end, where, ": data_offsets begin ", info.begin, " > end ", info.end);
    LOCUS_CHECK(info.end <= data_size, where, ": data_offsets [", info.begin, ", ", info.end,
                ") run past the data section (", data_size, " bytes; file truncated?)");
    const uint64_t esize = dtype_size(info.dtype);
    LOCUS_CHECK(!overflow && numel <= std::numeric_limits<uint64_t>::max() / esize, where, ": shape ",
                shape_to_string(info.shape), " is too large");
    LOCUS_CHECK(info.end - info.begin == numel * esize, where, ": holds ", info.end - info.begin, " bytes but ",
                info.dtype_name, shape_to_string(info.shape), " needs ", numel * esize);
    infos.push_back(std::move(info));
  }
  std::sort(infos.begin(), infos.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : infos) {
    if (t.nbytes() == 0) continue;
    LOCUS_CHECK(prev == nullptr || t.begin >= prev->end, "safetensors file '", path, "': tensors '", prev ? prev->name : "",
                "' [", prev ? prev->begin : 0, ", ", prev ? prev->end : 0, ") and '", t.name, "' [", t.begin, ", ", t.end,
                ") overlap");
    prev = &t;
  }
  for (TensorInfo& t : infos) {
    file->names_.push_back(t.name);
    std::string key = t.name;
    file->infos_.emplace(std::move(key), std::move(t));
  }
  file->self_ = file;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, file_size_);
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  LOCUS_CHECK(it != infos_.end(), "tensor '", name, "' not found in safetensors file '", path_, "'");
  return it->second;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& i = info(name);
  auto* p = static_cast<unsigned char*>(map_) + data_offset() + i.begin;
  std::shared_ptr<SafetensorsFile> keep = self_.lock();
  return Tensor::from_blob(p, i.shape, i.dtype, Device::cpu(), std::static_pointer_cast<void>(keep));
}

void SafetensorsWriter::add(const std::string& name, const Tensor& t, const std::string& dtype_override) {
  LOCUS_CHECK(!name.empty() && name != "__metadata__", "safetensors writer: invalid tensor name '", name, "'");
  LOCUS_CHECK(!has(name), "safetensors writer: tensor '", name, "' added twice");
  LOCUS_CHECK(t.defined(), "safetensors writer: tensor '", name, "' is undefined");
  std::string dname = dtype_override.empty() ? dtype_safetensors_name(t.dtype()) : dtype_override;
  DType as = dtype_from_safetensors(dname);
  LOCUS_CHECK(dtype_size(as) == dtype_size(t.dtype()), "safetensors writer: tensor '", name, "' of dtype ",
              dtype_name(t.dtype()), " cannot be written as ", dname, " (element sizes differ)");
  Tensor c = t.device().is_cpu() ? (t.is_contiguous() ? t : t.clone()) : t.to(Device::cpu());
  tensors_.push_back({name, c, dname});
}

bool SafetensorsWriter::has(const std::string& name) const {
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const Item& i) { return i.name == name; });
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t n = 0;
  for (const Item& i : tensors_) n += i.tensor.nbytes();
  return n;
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t off = 0;
  for (const Item& i : tensors_) {
    nlohmann::ordered_json e;
    e["dtype"] = i.dtype_name;
    e["shape"] = i.tensor.shape();
    e["data_offsets"] = {off, off + i.tensor.nbytes()};
    off += i.tensor.nbytes();
    header[i.name] = e;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  LOCUS_CHECK(out.good(), "cannot write safetensors file '", path, "'");
  unsigned char len[8];
  uint64_t hl = h.size();
  for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>(hl >> (8 * b));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const Item& i : tensors_) {
    out.write(static_cast<const char*>(i.tensor.data_ptr()), static_cast<std::streamsize>(i.tensor.nbytes()));
  }
  out.close();
  LOCUS_CHECK(!out.fail(), "error while writing safetensors file '", path, "'");
}

}  // namespace locus::runtime
