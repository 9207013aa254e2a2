#include "runtime/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace locus::runtime {
namespace {

// Captures what a ProgressBar writes, through a memory stream.
struct Capture {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  std::string text() {
    std::fflush(f);
    return std::string(buf, len);
  }
  ~Capture() {
    std::fclose(f);
    std::free(buf);
  }
};

TEST(ProgressBar, PlainLinesWhenNotATerminal) {
  Capture c;
  {
    ProgressBar bar("loading", 8, 8000, true, c.f, /*tty=*/0);
    for (int i = 0; i < 8; ++i) bar.advance(1, 1000);
    bar.finish();
  }
  const std::string t = c.text();
  EXPECT_EQ(t.find('\r'), std::string::npos);
  EXPECT_NE(t.find("loading: 25%"), std::string::npos) << t;
  EXPECT_NE(t.find("loading: 50%"), std::string::npos) << t;
  EXPECT_NE(t.find("loading: 75%"), std::string::npos) << t;
  EXPECT_NE(t.find("done, 8 tensors, 8.0 KB"), std::string::npos) << t;
  EXPECT_LE(std::count(t.begin(), t.end(), '\n'), 4);
}

TEST(ProgressBar, RedrawsOneLineOnATerminal) {
  Capture c;
  ProgressBar bar("weights", 2, 2'000'000, true, c.f, /*tty=*/1);
  bar.advance(1, 1'000'000);
  bar.advance(1, 1'000'000);
  bar.finish();
  const std::string t = c.text();
  EXPECT_NE(t.find("\rweights ["), std::string::npos) << t;
  EXPECT_NE(t.find("100% 2/2 tensors, 2.0 MB / 2.0 MB"), std::string::npos) << t;
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 1);
}

TEST(ProgressBar, DisabledWritesNothing) {
  Capture c;
  {
    ProgressBar bar("x", 1, 1, false, c.f, 1);
    bar.advance(1, 1);
  }
  EXPECT_EQ(c.text(), "");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1'500'000'000), "1.5 GB");
}

}  // namespace
}  // namespace locus::runtime
