// Internal to the CUDA backend: what the single-launch locality-domain kernels (stream_gemm.h,
// nvfp4_wgmma.h, bmm_tma.h) need to know about a partitioned op's domains: which partition stream
// is which domain, and the %smid -> domain table of the green-context partitions.
#pragma once
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_ops.h"

namespace locus::cuda::detail {

// Whether x (bf16 [M, K]), y (bf16 or fp32 [M, N]) and bias (undefined, or bf16 or fp32 [N]) are
// what the matrix-vector kernels' domain-aware launches take: on one CUDA device, rows of unit
// column stride, a contiguous bias.
bool gemv_domain_operands(const Tensor& x, const Tensor& y, const Tensor& bias);

// Domain ids for slices: the i-th distinct stream is domain i (domain_of[p] for slice p; streams[i]
// the stream of domain i). False when there are more than `max_parts` slices or `max_domains`
// streams.
bool assign_domains(const std::vector<DomainSlice>& slices, int max_parts, int max_domains, std::vector<int>* domain_of,
                    std::vector<void*>* streams);

// The device tables of a set of partition streams (domain i = streams[i]), built once per set
// from the SM ids the green-context probe recorded. All null when no stream is a partition
// stream (then every SM counts as domain 0 and the other domains' work is taken by stealing).
struct DomainTables {
  const uint8_t* sm_domain = nullptr;  // 1024 entries: SM id -> domain (kNoDomain: outside every domain)
  const uint8_t* sm_rank = nullptr;    // 1024 entries: SM id -> its index among its domain's SMs
  int32_t domain_sms[8] = {};          // SMs per domain
};
const DomainTables& domain_tables(const std::vector<void*>& streams);

// domain_tables(streams).sm_domain.
inline const uint8_t* sm_domain_table(const std::vector<void*>& streams) { return domain_tables(streams).sm_domain; }

}  // namespace locus::cuda::detail
