// HostProfile: regions add up their calls and time while on, cost nothing recorded while off,
// and the report lists them by total time.
#include "core/host_profile.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace locus {
namespace {

TEST(HostProfile, RegionsAddUpWhileOnAndReportByTotalTime) {
  const bool was = HostProfile::enabled();
  HostProfile::set_enabled(false);
  HostProfile::reset();
  { HostProfileScope off("never"); }
  EXPECT_EQ(HostProfile::report(), "");

  HostProfile::set_enabled(true);
  for (int i = 0; i < 3; ++i) {
    HostProfileScope outer("outer");
    HostProfileScope inner("outer.inner");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  { HostProfileScope brief("brief"); }
  const std::string r = HostProfile::report();
  EXPECT_EQ(r.rfind("host time by region", 0), 0u) << r;
  const size_t outer = r.find("  outer "), inner = r.find("  outer.inner "), brief = r.find("  brief ");
  ASSERT_NE(outer, std::string::npos) << r;
  ASSERT_NE(inner, std::string::npos) << r;
  ASSERT_NE(brief, std::string::npos) << r;
  EXPECT_LT(inner, brief) << "sorted by total time: " << r;  // 3 x 2 ms against nothing
  EXPECT_NE(r.find("3 calls", outer), std::string::npos) << r;
  EXPECT_EQ(r.find("never"), std::string::npos) << r;
  // At least the 6 ms slept, in each of the two nested regions.
  const double ms = std::stod(r.substr(r.find("calls", outer) + 5));
  EXPECT_GE(ms, 6.0) << r;

  HostProfile::reset();
  EXPECT_EQ(HostProfile::report(), "");
  HostProfile::set_enabled(was);
}

}  // namespace
}  // namespace locus
