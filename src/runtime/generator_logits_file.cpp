#include "runtime/generator_logits_file.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

static_assert(sizeof(float) == 4, "float32 expected");

namespace locus::runtime {
namespace {

constexpr char kMagic[8] = {'L', 'O', 'C', 'U', 'S', 'L', 'G', 'T'};
constexpr uint32_t kVersion = 1;

template <typename T>
void put(std::string& buf, T v) {  // the hosts Locus runs on are little-endian
  buf.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

void write_logits_file(const std::string& path, const std::vector<Tensor>& records) {
  std::string buf(kMagic, sizeof(kMagic));
  put<uint32_t>(buf, kVersion);
  put<uint32_t>(buf, static_cast<uint32_t>(records.size()));
  for (size_t r = 0; r < records.size(); ++r) {
    const Tensor& t = records[r];
    LOCUS_CHECK(t.defined() && t.dtype() == DType::kFP32 && t.dim() == 2, "write_logits_file(", path, "): record ",
                r, " must be an fp32 [rows, cols] tensor, got ", t.defined() ? t.describe() : "an undefined tensor");
    Tensor c = t.device().is_cpu() ? t.clone() : t.to(Device::cpu());
    put<int64_t>(buf, c.size(0));
    put<int64_t>(buf, c.size(1));
    buf.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  LOCUS_CHECK(f.good(), "cannot open ", path, " for writing");
  f.write(buf.data(), static_cast<std::streamsize>(buf.size()));
  LOCUS_CHECK(f.good(), "writing ", path, " failed");
}

std::vector<Tensor> read_logits_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LOCUS_CHECK(f.good(), "cannot open logits file ", path);
  std::string buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  LOCUS_CHECK(buf.size() >= 16 && std::memcmp(buf.data(), kMagic, 8) == 0, path, ": not a Locus logits file (bad magic)");
  uint32_t version = 0, count = 0;
  std::memcpy(&version, buf.data() + 8, 4);
  std::memcpy(&count, buf.data() + 12, 4);
  LOCUS_CHECK(version == kVersion, path, ": unsupported logits file version ", version);
  size_t off = 16;
  std::vector<Tensor> out;
  for (uint32_t r = 0; r < count; ++r) {
    LOCUS_CHECK(off + 16 <= buf.size(), path, ": truncated at record ", r);
    int64_t rows = 0, cols = 0;
    std::memcpy(&rows, buf.data() + off, 8);
    std::memcpy(&cols, buf.data() + off + 8, 8);
    off += 16;
    LOCUS_CHECK(rows >= 0 && cols >= 0 && (cols == 0 || rows <= static_cast<int64_t>(buf.size() / 4) / cols) &&
                    off + static_cast<size_t>(rows * cols) * 4 <= buf.size(),
                path, ": record ", r, " claims [", rows, ", ", cols, "] beyond the file end");
    Tensor t = Tensor::empty({rows, cols}, DType::kFP32);
    std::memcpy(t.data_ptr(), buf.data() + off, t.nbytes());
    off += t.nbytes();
    out.push_back(t);
  }
  LOCUS_CHECK(off == buf.size(), path, ": ", buf.size() - off, " trailing bytes after ", count, " records");
  return out;
}

}  // namespace locus::runtime
