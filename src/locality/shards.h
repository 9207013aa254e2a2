// Building what a partitioned op needs from a plan: the per-partition slices (output range and
// the stream of the domain that runs it) and weight shards copied into that domain's memory.
// Shards are fresh allocations (never views of the full weight), so the full weight can be
// released after localization.
#pragma once
#include <vector>

#include "locality/domain_place.h"
#include "locality/layout.h"
#include "ops/nvfp4.h"
#include "ops/partitioned.h"

namespace locus::locality {

// One slice per layout partition; partition p runs on runtime.place_for_partition(p).
std::vector<ops::PartitionSlice> partition_slices(const PartitionedLayout& layout, const LocalityRuntime& runtime);

// Partition p's rows of a dense [rows, K] weight (any device): rows [n0, n1), or for a
// FUSED_GATE_UP layout gate rows [n0, n1) followed by up rows [n + n0, n + n1). Copied into
// `place` (its device, tagged with its domain). Throws when w's rows do not match the layout.
Tensor make_dense_shard(const Tensor& w, const PartitionedLayout& layout, int p, const DomainPlace& place);

// The same for a kLinear NVFP4 weight (packed rows and their scale rows; the global scale is
// shared). On a CUDA place the shard is prepared for that device's kernel (nvfp4_prepare).
ops::Nvfp4Weight make_nvfp4_shard(const ops::Nvfp4Weight& w, const PartitionedLayout& layout, int p,
                                  const DomainPlace& place);

// Heads [n0, n1) of a BMM operand [B, K, N] (plan_bmm layouts), copied into `place`.
Tensor make_bmm_shard(const Tensor& b, const PartitionedLayout& layout, int p, const DomainPlace& place);

}  // namespace locus::locality
