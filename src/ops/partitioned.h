// Partitioned op entry points: the output columns are split into slices, each computed on its
// own stream (a locality domain's) from that domain's weight shard, written in place into the
// shared output (no concat). Fork/join: every partition waits for the caller's queued work and
// the caller waits for all partitions (CUDA: stream events, capturable in a graph; CPU: the
// partitions run concurrently on their worker pools and the call returns when all are done).
#pragma once
#include <functional>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"
#include "ops/nvfp4.h"

namespace locus::ops {

struct PartitionSlice {
  int64_t n0 = 0, n1 = 0;  // output columns (= weight rows of the shard) owned by the partition
  Stream stream;           // where the partition runs
};

// Runs fn(p) for each partition between a fork from `caller` and a join back to it.
void run_partitioned(const Stream& caller, const std::vector<Stream>& streams, const std::function<void(int)>& fn);

// y[:, n0_p:n1_p] = x * shards[p]^T (+ bias[n0_p:n1_p]); shards[p] is bf16 [n1_p - n0_p, K].
void gemm_partitioned(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& bias, const Tensor& y,
                      const std::vector<PartitionSlice>& slices, const Stream& caller = {});
// FUSED_GATE_UP: shards[p] holds [gate rows p; up rows p] ([2 (n1_p - n0_p), K]); y[:, n0_p:n1_p] = swiglu.
void gemm_swiglu_partitioned(const Tensor& x, const std::vector<Tensor>& shards, const Tensor& y,
                             const std::vector<PartitionSlice>& slices, const Stream& caller = {});
void nvfp4_gemm_partitioned(const Tensor& x, const std::vector<Nvfp4Weight>& shards, const Tensor& bias,
                            const Tensor& y, const std::vector<PartitionSlice>& slices, const Stream& caller = {});
void nvfp4_gemm_swiglu_partitioned(const Tensor& x, const std::vector<Nvfp4Weight>& shards, const Tensor& y,
                                   const std::vector<PartitionSlice>& slices, const Stream& caller = {});
// BMM split over the batch (heads): slices give batch ranges [n0, n1); b_shards[p] is [n1-n0, K, N].
void bmm_partitioned(const Tensor& a, const std::vector<Tensor>& b_shards, const Tensor& y,
                     const std::vector<PartitionSlice>& slices, const Stream& caller = {});

}  // namespace locus::ops
