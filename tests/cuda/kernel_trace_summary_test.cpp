// The kernel tracer's summary (bench/cuda/kernel_trace_summary.h) on hand-made activities: busy
// time is the union of overlapping activities, idle gaps over 5 us are counted, the window keeps
// only the activities that start in its last milliseconds, and kernel names lose their
// parameter lists and the project's namespaces. No GPU needed.
#include "../../bench/cuda/kernel_trace_summary.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace locus::bench {
namespace {

TEST(KernelTraceSummary, BusyTimeIsTheUnionAndGapsAreCounted) {
  // a: [0, 10) us; b overlaps it: [5, 12); c after a 20 us gap: [32, 40); d after 3 us: [43, 44).
  const std::vector<TraceActivity> acts = {
      {"c", 32000, 40000}, {"a", 0, 10000}, {"b", 5000, 12000}, {"a", 43000, 44000}};
  const TraceSummary s = summarize_trace(acts, 0);
  EXPECT_EQ(s.activities, 4);
  EXPECT_DOUBLE_EQ(s.window_us, 44.0);
  EXPECT_DOUBLE_EQ(s.busy_us, 12.0 + 8.0 + 1.0);
  EXPECT_EQ(s.gaps_over_5us, 1);
  EXPECT_DOUBLE_EQ(s.gaps_over_5us_total_us, 20.0);
  ASSERT_EQ(s.rows.size(), 3u);
  EXPECT_EQ(s.rows[0].name, "a");  // 11 us in 2 calls, the largest total
  EXPECT_EQ(s.rows[0].count, 2);
  EXPECT_DOUBLE_EQ(s.rows[0].total_us, 11.0);
  EXPECT_EQ(s.rows[1].name, "c");
  EXPECT_EQ(s.rows[2].name, "b");
}

TEST(KernelTraceSummary, TheWindowKeepsTheLastMilliseconds) {
  // Warm-up at 0..1 ms, the part that matters in the last 2 ms of a 10 ms trace.
  const std::vector<TraceActivity> acts = {
      {"warmup", 0, 1000000}, {"x", 8500000, 8600000}, {"y", 9000000, 10000000}};
  const TraceSummary s = summarize_trace(acts, 2.0);
  EXPECT_EQ(s.activities, 2);
  ASSERT_EQ(s.rows.size(), 2u);
  EXPECT_EQ(s.rows[0].name, "y");
  EXPECT_EQ(s.rows[1].name, "x");
  EXPECT_DOUBLE_EQ(s.window_us, 1500.0);
  EXPECT_DOUBLE_EQ(s.busy_us, 1100.0);
  EXPECT_EQ(summarize_trace(acts, 0).activities, 3);
  EXPECT_EQ(summarize_trace({}, 1.0).activities, 0);
}

TEST(KernelTraceSummary, KernelNamesAreShortened) {
  EXPECT_EQ(short_kernel_name("void locus::cuda::detail::(anonymous namespace)::stream_gemm_kernel<(locus::cuda::"
                              "detail::StreamWeight)1, 8>(locus::cuda::detail::Plan, locus::cuda::detail::Args)"),
            "stream_gemm_kernel<(StreamWeight)1, 8>");
  EXPECT_EQ(short_kernel_name("rmsnorm_kernel(float const*, int)"), "rmsnorm_kernel");
  EXPECT_EQ(short_kernel_name("plain"), "plain");
  EXPECT_EQ(short_kernel_name(std::string(150, 'k')).size(), 100u);
}

TEST(KernelTraceSummary, PrintsAHeaderAndOneRowPerName) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  ASSERT_NE(out, nullptr);
  print_trace_summary(out, summarize_trace({{"a", 0, 10000}, {"a", 12000, 13000}}, 2.0), 2.0);
  std::fclose(out);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_NE(text.find("kernel trace (last 2 ms): 2 activities over 13.0 us, device busy 11.0 us (84.6%)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("| a | 2 | 11.0 | 5.50 | 100.0% |"), std::string::npos) << text;
}

TEST(KernelTraceSummary, TheSequenceListsTheLastActivitiesInOrder) {
  // a [0, 10) us; b [12, 20) with 24 CTAs; c [15, 18) inside b; d [25, 26): idle 2, 0 and 5 us before them.
  const std::vector<TraceActivity> acts = {
      {"d", 25000, 26000, 4}, {"a", 0, 10000, 1}, {"c", 15000, 18000, 2}, {"b", 12000, 20000, 24}};
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  ASSERT_NE(out, nullptr);
  print_trace_sequence(out, acts, 3);
  std::fclose(out);
  const std::string text(buf, len);
  std::free(buf);
  EXPECT_NE(text.find("last 3 activities in start order"), std::string::npos) << text;
  EXPECT_EQ(text.find("| a |"), std::string::npos) << text;  // before the last 3
  const size_t b = text.find("| 0 | b | 24 | 0.0 | 8.00 | 2.00 |");
  const size_t c = text.find("| 1 | c | 2 | 3.0 | 3.00 | 0.00 |");
  const size_t d = text.find("| 2 | d | 4 | 13.0 | 1.00 | 5.00 |");
  ASSERT_NE(b, std::string::npos) << text;
  ASSERT_NE(c, std::string::npos) << text;
  ASSERT_NE(d, std::string::npos) << text;
  EXPECT_LT(b, c);
  EXPECT_LT(c, d);
}

// Steps cut at the marker: each activity is charged the time it adds to the timeline (an
// overlapping launch only its part past the previous end), idle stretches are counted, and the
// step the trace's end cuts off is left out.
TEST(KernelTraceSummary, StepsChargeEachActivityTheTimeItAdds) {
  // Two steps of 20 us: embed [0, 2), BF16 GEMMs [2, 6) and [6, 10), a stream launch overlapping them
  // [8, 15) (adds 5), 3 us idle, a copy [18, 20); then the same from 20, and a third step that the
  // trace cuts off at 40.
  // The NVFP4 launch is the streaming kernel in the first step, the matrix-vector kernel in the second.
  auto step = [](uint64_t t0, const char* nvfp4) {
    return std::vector<TraceActivity>{{"embedding_kernel", t0, t0 + 2000},
                                      {"nvjet_sm90_tst", t0 + 2000, t0 + 6000},
                                      {"bf16_gemv_kernel<1, 1>", t0 + 6000, t0 + 10000},
                                      {nvfp4, t0 + 8000, t0 + 15000},
                                      {"[memcpy DtoH]", t0 + 18000, t0 + 20000}};
  };
  std::vector<TraceActivity> acts = step(0, "stream_gemm_kernel<1>");
  for (const TraceActivity& a : step(20000, "nvfp4_gemv_kernel<1, 2, 8, true, true>")) acts.push_back(a);
  acts.push_back({"embedding_kernel", 40000, 41000});
  const StepBreakdown b = step_breakdown(acts, "embedding_kernel", decode_step_groups());
  EXPECT_EQ(b.steps, 2);
  EXPECT_DOUBLE_EQ(b.wall_us, 20.0);
  EXPECT_DOUBLE_EQ(b.idle_us, 3.0);
  std::map<std::string, double> by;
  double total = 0;
  for (const auto& [label, us] : b.groups) {
    by[label] = us;
    total += us;
  }
  EXPECT_DOUBLE_EQ(by["NVFP4 GEMM (experts and MLP: stream_gemm, nvfp4_gemv)"], 5.0);
  EXPECT_DOUBLE_EQ(by["BF16 GEMM (cuBLAS(Lt), bf16_gemv)"], 8.0);
  EXPECT_DOUBLE_EQ(by["copies, uploads, memsets"], 2.0);
  EXPECT_DOUBLE_EQ(by["other"], 2.0);  // the embedding
  EXPECT_DOUBLE_EQ(total + b.idle_us, b.wall_us);
  // A fourth marker closes the third step (its 1 us embedding, then 29 us idle): walls 20, 20, 30.
  acts.push_back({"embedding_kernel", 70000, 71000});
  const StepBreakdown c = step_breakdown(acts, "embedding_kernel", decode_step_groups());
  EXPECT_EQ(c.steps, 3);
  EXPECT_DOUBLE_EQ(c.wall_us, 20.0);
  EXPECT_DOUBLE_EQ(c.idle_us, 3.0);  // idles 3, 3 and 29
}

}  // namespace
}  // namespace locus::bench
