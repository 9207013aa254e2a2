// The logits dump `locus logits --out FILE` writes (read back by tools/parity/hf_parity.py):
//   "LOCUSLGT" (8 bytes), u32 version = 1, u32 record count, then per record i64 rows, i64 cols
//   and rows * cols float32 values, row-major. Everything little-endian.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace locus::runtime {

// records: fp32 [rows, cols] tensors (any device, any strides). Error naming the path on I/O failure.
void write_logits_file(const std::string& path, const std::vector<Tensor>& records);
// Error naming the path and what is wrong (bad magic, version, truncated record, trailing bytes).
std::vector<Tensor> read_logits_file(const std::string& path);

}  // namespace locus::runtime
