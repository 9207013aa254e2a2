#include "locality/layout.h"

#include "core/error.h"

namespace locus::locality {

std::optional<PartitionedLayout> make_partitioned_layout(int64_t n, int partitions, int64_t align,
                                                         bool fused_gate_up, std::string* why) {
  LOCUS_CHECK(n >= 1, "make_partitioned_layout: N must be positive, got ", n);
  LOCUS_CHECK(partitions >= 1, "make_partitioned_layout: partitions must be positive, got ", partitions);
  LOCUS_CHECK(align >= 1, "make_partitioned_layout: align must be positive, got ", align);
  auto refuse = [&](std::string reason) -> std::optional<PartitionedLayout> {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (n % align != 0) {
    return refuse(str("N=", n, " is not a multiple of the ", align, "-row alignment (the split would need padding)"));
  }
  const int64_t blocks = n / align;
  if (blocks < partitions) {
    return refuse(str("N=", n, " splits into ", blocks, blocks == 1 ? " block" : " blocks", " of ", align,
                      " rows, fewer than the ", partitions, " partitions (a partition would be empty)"));
  }
  PartitionedLayout layout;
  layout.n = n;
  layout.align = align;
  layout.fused_gate_up = fused_gate_up;
  const int64_t base = blocks / partitions, extra = blocks % partitions;
  int64_t row = 0;
  for (int p = 0; p < partitions; ++p) {
    const int64_t rows = (base + (p < extra ? 1 : 0)) * align;
    PartitionRange r;
    r.n0 = row;
    r.n1 = row + rows;
    // Scales are stored row-major, one row per weight row, so a partition's scale rows are its
    // weight rows (see the planner for why NVFP4 asks 128-row multiples anyway).
    r.scale_row0 = r.n0;
    r.scale_row1 = r.n1;
    layout.parts.push_back(r);
    row += rows;
  }
  if (why) why->clear();
  return layout;
}

std::string PartitionedLayout::describe() const {
  std::string s = str(num_partitions(), " x");
  for (const PartitionRange& r : parts) s += str(" [", r.n0, ",", r.n1, ")");
  if (fused_gate_up) s += " (each with its gate and up rows)";
  return s;
}

}  // namespace locus::locality
