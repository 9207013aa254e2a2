#include "locality/shards.h"

#include <utility>

#include "core/error.h"

namespace locus::locality {

namespace {

using RowRange = std::pair<int64_t, int64_t>;

// The weight-row ranges partition p owns, in the order its shard stores them.
std::vector<RowRange> owned_rows(const PartitionedLayout& layout, int p) {
  LOCUS_CHECK(p >= 0 && p < layout.num_partitions(), "shard: partition ", p, " out of range for a layout of ",
              layout.num_partitions(), " partitions");
  const PartitionRange& r = layout.parts[p];
  if (!layout.fused_gate_up) return {{r.n0, r.n1}};
  return {{r.n0, r.n1}, {layout.n + r.n0, layout.n + r.n1}};
}

int64_t expected_rows(const PartitionedLayout& layout) { return layout.n * (layout.fused_gate_up ? 2 : 1); }

// Rows `ranges` of a 2-D tensor, concatenated into a fresh [sum, cols] tensor on dev/domain.
Tensor gather_rows(const Tensor& t, const std::vector<RowRange>& ranges, Device dev, int domain) {
  int64_t total = 0;
  for (const auto& [a, b] : ranges) total += b - a;
  Tensor out = Tensor::empty({total, t.size(1)}, t.dtype(), dev, domain);
  int64_t at = 0;
  for (const auto& [a, b] : ranges) {
    out.slice(0, at, at + (b - a)).copy_(t.slice(0, a, b));
    at += b - a;
  }
  return out;
}

}  // namespace

std::vector<ops::PartitionSlice> partition_slices(const PartitionedLayout& layout, const LocalityRuntime& runtime) {
  LOCUS_CHECK(layout.num_partitions() >= 1, "partition_slices: the layout has no partitions (plan disabled?)");
  std::vector<ops::PartitionSlice> out;
  for (int p = 0; p < layout.num_partitions(); ++p) {
    out.push_back({layout.parts[p].n0, layout.parts[p].n1, runtime.place_for_partition(p).stream()});
  }
  return out;
}

Tensor make_dense_shard(const Tensor& w, const PartitionedLayout& layout, int p, const DomainPlace& place) {
  LOCUS_CHECK(w.defined() && w.dim() == 2, "make_dense_shard: weight must be 2-D, got ",
              w.defined() ? w.describe() : std::string("undefined"));
  LOCUS_CHECK(w.size(0) == expected_rows(layout), "make_dense_shard: weight has ", w.size(0), " rows but the layout (",
              layout.describe(), ") needs ", expected_rows(layout));
  return gather_rows(w, owned_rows(layout, p), place.device(), place.domain());
}

ops::Nvfp4Weight make_nvfp4_shard(const ops::Nvfp4Weight& w, const PartitionedLayout& layout, int p,
                                  const DomainPlace& place) {
  LOCUS_CHECK(w.layout == ops::Nvfp4Layout::kLinear,
              "make_nvfp4_shard: the weight must be in the linear (checkpoint) layout; shard before preparing it");
  LOCUS_CHECK(w.n == expected_rows(layout), "make_nvfp4_shard: weight has ", w.n, " rows but the layout (",
              layout.describe(), ") needs ", expected_rows(layout));
  LOCUS_CHECK(w.packed.defined() && w.packed.dim() == 2 && w.packed.size(0) == w.n && w.scales.defined() &&
                  w.scales.dim() == 2 && w.scales.size(0) == w.n,
              "make_nvfp4_shard: packed and scales must be 2-D with ", w.n, " rows");
  const std::vector<RowRange> rows = owned_rows(layout, p);
  ops::Nvfp4Weight shard;
  shard.global_scale = w.global_scale;
  shard.layout = ops::Nvfp4Layout::kLinear;
  shard.n = layout.weight_rows(p);
  shard.k = w.k;
  if (place.device().is_cpu()) {
    shard.packed = gather_rows(w.packed, rows, place.device(), place.domain());
    shard.scales = gather_rows(w.scales, rows, place.device(), place.domain());
    return shard;
  }
  // Device kernels want their own layout: gather the linear rows on the CPU, then prepare.
  shard.packed = gather_rows(w.packed, rows, Device::cpu(), -1);
  shard.scales = gather_rows(w.scales, rows, Device::cpu(), -1);
  return ops::nvfp4_prepare(shard, place.device(), place.domain());
}

Tensor make_bmm_shard(const Tensor& b, const PartitionedLayout& layout, int p, const DomainPlace& place) {
  LOCUS_CHECK(b.defined() && b.dim() == 3, "make_bmm_shard: operand must be 3-D [B, K, N], got ",
              b.defined() ? b.describe() : std::string("undefined"));
  LOCUS_CHECK(!layout.fused_gate_up && b.size(0) == layout.n, "make_bmm_shard: operand has ", b.size(0),
              " heads but the layout (", layout.describe(), ") needs ", layout.n);
  const PartitionRange& r = layout.parts.at(p);
  Tensor heads = b.slice(0, r.n0, r.n1);
  // A transposed (strided) CPU view is made row-major first; copies across devices need dense rows.
  if (!heads.is_contiguous() && heads.device().is_cpu()) heads = heads.clone();
  return heads.to(place.device(), place.domain());
}

}  // namespace locus::locality
