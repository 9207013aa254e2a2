// DomainPlace: where one locality domain's work runs and its memory lives. On CUDA: a green
// context over the domain's SM partition, its stream, and allocations tagged with the domain;
// on the CPU: a ThreadPool of the domain's worker threads. LocalityRuntime owns one place per
// domain for a device and is created once at start-up (green contexts cost about 1 ms each).
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

 private:
  Topology topology_;
  std::vector<std::unique_ptr<DomainPlace>> places_;
};

}  // namespace locus::locality
