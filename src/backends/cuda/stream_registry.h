// Internal to the CUDA backend: which streams belong to green-context SM partitions, and how
// many SMs each has (and which). The tactic cache keys its choices by the count (a partition's
// best cuBLASLt algorithm differs from the whole GPU's); the streaming GEMM maps SMs to domains.
#pragma once
#include <cstdint>
#include <vector>

namespace locus::cuda::detail {

void register_partition_stream(void* stream, int sm_count, std::vector<int> smids);
void unregister_partition_stream(void* stream);
int partition_stream_sm_count(void* stream);  // 0: not a partition stream (whole device)
// The SM ids a probe kernel ran on in the stream's partition (empty: not a partition stream).
std::vector<int> partition_stream_smids(void* stream);
// A number unique to this registration (0: not a partition stream), so that caches keyed by stream
// handles notice a destroyed stream whose handle value came back for a new partition.
uint64_t partition_stream_serial(void* stream);

}  // namespace locus::cuda::detail
