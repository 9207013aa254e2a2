// Internal to the CUDA backend: which streams belong to green-context SM partitions, and how
// many SMs each has. The tactic cache keys its choices by it (a partition's best cuBLASLt
// algorithm differs from the whole GPU's).
#pragma once

namespace locus::cuda::detail {

void register_partition_stream(void* stream, int sm_count);
void unregister_partition_stream(void* stream);
int partition_stream_sm_count(void* stream);  // 0: not a partition stream (whole device)

}  // namespace locus::cuda::detail
