// DomainPlace: where one locality domain's work runs and its memory lives. On CUDA: a green
// context over the domain's SM partition, its stream, and allocations tagged with the domain;
// on the CPU: a ThreadPool of the domain's worker threads. LocalityRuntime owns one place per
// domain for a device and is created once at start-up (green contexts cost about 1 ms each).
//
// Lifetime rules: create the runtime (and every shard through it) BEFORE any CUDA graph capture:
// green contexts, streams and allocations cannot be created inside a capture. Keeping one
// runtime for the whole process is fine (shared_locality_runtime caches them). The places must
// outlive every op queued on their streams. On CUDA a topology with one domain uses the
// device's default stream (no green context); N >= 2 domains split the SMs with
// cuda::create_sm_partitions (aligned or backfill, Topology::backfill).
#pragma once
#include <memory>
#include <vector>

#include "core/stream.h"
#include "core/tensor.h"
#include "locality/topology.h"

namespace locus::locality {

class DomainPlace {
 public:
  virtual ~DomainPlace() = default;
  virtual int domain() const = 0;
  virtual Device device() const = 0;
  virtual Stream stream() const = 0;  // the domain's stream (CUDA) or worker pool (CPU)
  virtual int units() const = 0;      // SMs or threads
  // Memory placed in (tagged with) this domain.
  Tensor allocate(const Shape& shape, DType dtype) const { return Tensor::empty(shape, dtype, device(), domain()); }
};

class LocalityRuntime {
 public:
  // Builds the places for `topology` (one per domain).
  explicit LocalityRuntime(const Topology& topology);
  ~LocalityRuntime();
  const Topology& topology() const { return topology_; }
  int num_domains() const { return static_cast<int>(places_.size()); }
  const DomainPlace& place(int d) const { return *places_.at(d); }
  std::vector<Stream> streams() const;  // one per domain, in domain order
  // Partition p of a plan runs on domain p % num_domains (plans may ask more partitions than
  // there are domains, e.g. policy num_partitions on a one-domain device).
  const DomainPlace& place_for_partition(int p) const { return place(p % num_domains()); }
  std::vector<Stream> partition_streams(int partitions) const;

 private:
  Topology topology_;
  std::vector<std::unique_ptr<DomainPlace>> places_;
};

// A process-wide runtime for `topology`, created on first use and kept for the process (one per
// device, domain count and split mode); later calls with the same topology return the same one.
std::shared_ptr<LocalityRuntime> shared_locality_runtime(const Topology& topology);

}  // namespace locus::locality
