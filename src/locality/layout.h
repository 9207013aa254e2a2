// PartitionedLayout: how an op's output dimension N is split across partitions. Each partition
// owns a contiguous row range [n0, n1) of the weight and writes the same column range of the
// shared output. Splits are padding-free: every partition's rows are a multiple of `align`.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace locus::locality {

struct PartitionRange {
  int64_t n0 = 0, n1 = 0;              // weight rows / output columns owned
  int64_t scale_row0 = 0, scale_row1 = 0;  // NVFP4 scale-factor rows (same as n for row-major scales)
  int64_t rows() const { return n1 - n0; }
};

struct PartitionedLayout {
  int64_t n = 0;       // logical N (for FUSED_GATE_UP: the intermediate size I, not 2I)
  int64_t align = 1;   // every partition's row count is a multiple of this
  bool fused_gate_up = false;  // partition p holds gate rows [n0,n1) and up rows [n+n0, n+n1)
  std::vector<PartitionRange> parts;
  int num_partitions() const { return static_cast<int>(parts.size()); }
  std::string describe() const;  // "2 x [0,3584) [3584,7168)"
  // Weight rows partition p holds: its range, doubled for FUSED_GATE_UP (gate + up rows).
  int64_t weight_rows(int p) const { return parts.at(p).rows() * (fused_gate_up ? 2 : 1); }
};

// Splits n into `partitions` near-equal ranges, each a multiple of `align` (the first ones take
// the extra blocks). Returns nullopt and sets `why` when that needs padding (n % align != 0) or
// leaves a partition empty. Nonsense arguments (n < 1, partitions < 1, align < 1) throw.
std::optional<PartitionedLayout> make_partitioned_layout(int64_t n, int partitions, int64_t align,
                                                         bool fused_gate_up, std::string* why);

}  // namespace locus::locality
