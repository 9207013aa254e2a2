#include "locality/domain_place.h"

#include <map>
#include <mutex>
#include <tuple>

#include "backends/cpu/thread_pool.h"
#include "core/error.h"

#if defined(LOCUS_WITH_CUDA)
#include "backends/cuda/cuda_device.h"
#endif

namespace locus::locality {

namespace {

// A CPU domain: its own worker pool (the calling host thread plus units - 1 workers).
class CpuDomainPlace final : public DomainPlace {
 public:
  CpuDomainPlace(int domain, int threads) : domain_(domain), pool_(std::make_unique<cpu::ThreadPool>(threads)) {}
  int domain() const override { return domain_; }
  Device device() const override { return Device::cpu(); }
  Stream stream() const override { return Stream::cpu(pool_.get()); }
  int units() const override { return pool_->num_threads(); }

 private:
  int domain_;
  std::unique_ptr<cpu::ThreadPool> pool_;
};

#if defined(LOCUS_WITH_CUDA)
// A CUDA domain: one green-context SM partition and its stream; or, for a one-domain topology,
// the whole device on its default stream (partition.stream == nullptr, no green context).
class CudaDomainPlace final : public DomainPlace {
 public:
  CudaDomainPlace(int domain, Device device, cuda::SmPartition partition, bool owns_partition)
      : domain_(domain), device_(device), partition_(std::move(partition)), owns_(owns_partition) {}
  ~CudaDomainPlace() override {
    if (owns_) {
      std::vector<cuda::SmPartition> one{partition_};
      cuda::destroy_sm_partitions(one);
    }
  }
  int domain() const override { return domain_; }
  Device device() const override { return device_; }
  Stream stream() const override { return Stream{device_, partition_.stream}; }
  int units() const override { return partition_.sm_count; }

 private:
  int domain_;
  Device device_;
  cuda::SmPartition partition_;
  bool owns_;
};
#endif

}  // namespace

LocalityRuntime::LocalityRuntime(const Topology& topology) : topology_(topology) {
  LOCUS_CHECK(topology_.num_domains >= 1 && topology_.num_domains <= kMaxLocalityDomains,
              "LocalityRuntime: domain count must be in [1, ", kMaxLocalityDomains, "], got ", topology_.num_domains);
  LOCUS_CHECK(static_cast<int>(topology_.units_per_domain.size()) == topology_.num_domains,
              "LocalityRuntime: topology lists ", topology_.units_per_domain.size(), " unit counts for ",
              topology_.num_domains, " domains");
  if (topology_.device.is_cpu()) {
    for (int d = 0; d < topology_.num_domains; ++d) {
      LOCUS_CHECK(topology_.units_per_domain[d] >= 1, "LocalityRuntime: CPU domain ", d, " has ",
                  topology_.units_per_domain[d], " threads");
      places_.push_back(std::make_unique<CpuDomainPlace>(d, topology_.units_per_domain[d]));
    }
    return;
  }
#if defined(LOCUS_WITH_CUDA)
  const Device dev = topology_.device;
  if (topology_.num_domains == 1) {
    cuda::SmPartition whole;
    whole.sm_count = topology_.units_per_domain[0];
    places_.push_back(std::make_unique<CudaDomainPlace>(0, dev, whole, false));
    return;
  }
  std::vector<cuda::SmPartition> parts = cuda::create_sm_partitions(
      dev.index, topology_.num_domains, topology_.backfill ? cuda::SplitMode::kBackfill : cuda::SplitMode::kAligned);
  if (static_cast<int>(parts.size()) != topology_.num_domains) {
    const size_t got = parts.size();
    cuda::destroy_sm_partitions(parts);
    LOCUS_THROW("LocalityRuntime: asked ", topology_.num_domains, " SM partitions on ", dev.name(), ", got ", got);
  }
  // The partitions created are the truth: record their SM counts (the topology was an estimate;
  // its units plus supplemental SMs are the device's SM count).
  int total = topology_.supplemental_units;
  for (int u : topology_.units_per_domain) total += u;
  int used = 0;
  for (int d = 0; d < topology_.num_domains; ++d) {
    topology_.units_per_domain[d] = parts[d].sm_count;
    used += parts[d].sm_count;
    places_.push_back(std::make_unique<CudaDomainPlace>(d, dev, parts[d], true));
  }
  topology_.supplemental_units = std::max(0, total - used);
#else
  LOCUS_THROW("LocalityRuntime: ", topology_.device.name(), " needs the CUDA backend, which this build does not have");
#endif
}

LocalityRuntime::~LocalityRuntime() = default;

std::vector<Stream> LocalityRuntime::streams() const {
  std::vector<Stream> out;
  for (const auto& p : places_) out.push_back(p->stream());
  return out;
}

std::vector<Stream> LocalityRuntime::partition_streams(int partitions) const {
  LOCUS_CHECK(partitions >= 1, "partition_streams: partitions must be positive, got ", partitions);
  std::vector<Stream> out;
  for (int p = 0; p < partitions; ++p) out.push_back(place_for_partition(p).stream());
  return out;
}

std::shared_ptr<LocalityRuntime> shared_locality_runtime(const Topology& topology) {
  using Key = std::tuple<int, int, int, bool, std::vector<int>>;
  static std::mutex mu;
  static auto* cache = new std::map<Key, std::shared_ptr<LocalityRuntime>>();  // process lifetime
  const Key key{static_cast<int>(topology.device.type), topology.device.index, topology.num_domains,
                topology.backfill, topology.device.is_cpu() ? topology.units_per_domain : std::vector<int>{}};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  auto rt = std::make_shared<LocalityRuntime>(topology);
  cache->emplace(key, rt);
  return rt;
}

}  // namespace locus::locality
