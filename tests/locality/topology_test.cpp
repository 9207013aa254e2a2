// Topology resolution on the CPU: env > config > 1 domain, and every invalid value rejected.
#include "locality/topology.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>

#include "core/error.h"
#include "test_util.h"

namespace locus::locality {
namespace {

// Sets (or unsets) an environment variable for one test and restores the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

constexpr const char* kFake = "LOCUS_FAKE_LOCALITY_DOMAINS";

int sum(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

using locus::testing::error_text;

TEST(Topology, DefaultIsOneDomainWithAllThreads) {
  ScopedEnv fake(kFake, nullptr);
  ScopedEnv threads("LOCUS_NUM_THREADS", "6");
  Topology t = resolve_topology(Device::cpu());
  EXPECT_EQ(t.num_domains, 1);
  EXPECT_EQ(t.units_per_domain, std::vector<int>{6});
  EXPECT_FALSE(t.emulated);
  EXPECT_EQ(t.source, "default");
  EXPECT_EQ(t.supplemental_units, 0);
  EXPECT_EQ(t.describe(), "cpu:0: 1 locality domain (default); threads per domain: 6");
}

TEST(Topology, EnvVariableEmulatesDomains) {
  ScopedEnv threads("LOCUS_NUM_THREADS", "8");
  ScopedEnv fake(kFake, "3");
  Topology t = resolve_topology(Device::cpu());
  EXPECT_EQ(t.num_domains, 3);
  EXPECT_TRUE(t.emulated);
  EXPECT_EQ(t.source, "env LOCUS_FAKE_LOCALITY_DOMAINS");
  EXPECT_EQ(t.units_per_domain, (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(sum(t.units_per_domain), 8);
}

TEST(Topology, EnvBeatsConfigAndConfigBeatsDefault) {
  ScopedEnv threads("LOCUS_NUM_THREADS", "8");
  {
    ScopedEnv fake(kFake, "2");
    EXPECT_EQ(resolve_topology(Device::cpu(), 4).num_domains, 2);
  }
  {
    ScopedEnv fake(kFake, nullptr);
    Topology t = resolve_topology(Device::cpu(), 4);
    EXPECT_EQ(t.num_domains, 4);
    EXPECT_EQ(t.source, "config locality_domains.emulate");
    EXPECT_EQ(t.units_per_domain, (std::vector<int>{2, 2, 2, 2}));
  }
  {
    ScopedEnv fake(kFake, "");  // empty counts as unset
    EXPECT_EQ(resolve_topology(Device::cpu(), 2).num_domains, 2);
    EXPECT_EQ(resolve_topology(Device::cpu()).num_domains, 1);
  }
}

TEST(Topology, MoreDomainsThanThreadsGetOneThreadEach) {
  ScopedEnv threads("LOCUS_NUM_THREADS", "2");
  ScopedEnv fake(kFake, "4");
  Topology t = resolve_topology(Device::cpu());
  EXPECT_EQ(t.num_domains, 4);
  EXPECT_EQ(t.units_per_domain, (std::vector<int>{1, 1, 1, 1}));
}

TEST(Topology, ZeroAndGarbageEnvAreRejectedByName) {
  for (const char* bad : {"0", "two", "-1", "2x", " 2", "1.5", "99999999999", "65"}) {
    ScopedEnv fake(kFake, bad);
    const std::string msg = error_text([] { resolve_topology(Device::cpu()); });
    EXPECT_NE(msg.find("LOCUS_FAKE_LOCALITY_DOMAINS"), std::string::npos) << "value '" << bad << "': " << msg;
  }
  ScopedEnv fake(kFake, "two");
  EXPECT_EQ(error_text([] { resolve_topology(Device::cpu()); }),
            "LOCUS_FAKE_LOCALITY_DOMAINS must be a positive integer number of locality domains, got 'two'");
  ScopedEnv zero(kFake, "0");
  EXPECT_EQ(error_text([] { resolve_topology(Device::cpu()); }), "LOCUS_FAKE_LOCALITY_DOMAINS must be at least 1, got 0");
}

TEST(Topology, BadConfigValueIsRejectedByName) {
  ScopedEnv fake(kFake, nullptr);
  for (int bad : {0, -2, 1000}) {
    const std::string msg = error_text([bad] { resolve_topology(Device::cpu(), bad); });
    EXPECT_NE(msg.find("locality_domains.emulate"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
  }
}

TEST(Topology, CpuTopologySplitsEvenly) {
  EXPECT_EQ(cpu_topology(7, 2, "x").units_per_domain, (std::vector<int>{4, 3}));
  EXPECT_EQ(cpu_topology(12, 4, "x").units_per_domain, (std::vector<int>{3, 3, 3, 3}));
  EXPECT_THROW(cpu_topology(4, 0, "x"), Error);
  EXPECT_THROW(cpu_topology(0, 1, "x"), Error);
  EXPECT_EQ(parse_domain_count("4", "flag"), 4);
  EXPECT_EQ(error_text([] { parse_domain_count("", "--domains"); }),
            "--domains must be a positive integer number of locality domains, got ''");
}

#if !defined(LOCUS_WITH_CUDA)
TEST(Topology, CudaDeviceNeedsTheCudaBackend) {
  ScopedEnv fake(kFake, nullptr);
  const std::string msg = error_text([] { resolve_topology(Device::cuda(0)); });
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CUDA backend"), std::string::npos) << msg;
}
#endif

}  // namespace
}  // namespace locus::locality
