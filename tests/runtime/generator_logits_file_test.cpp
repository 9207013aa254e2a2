#include "runtime/generator_logits_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace locus::runtime {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))).string();
}

TEST(LogitsFile, RoundTripsRecordsBitwise) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE(seed);
  std::vector<Tensor> recs = {testing::randn({3, 7}, DType::kFP32, seed), testing::randn({1, 5}, DType::kFP32, seed + 1)};
  // A strided view is written as its logical contents.
  Tensor wide = testing::randn({2, 8}, DType::kFP32, seed + 2);
  recs.push_back(wide.slice(1, 2, 6));
  const std::string path = temp_path("locus_logits_rt_");
  write_logits_file(path, recs);
  auto back = read_logits_file(path);
  ASSERT_EQ(back.size(), recs.size());
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_TRUE(testing::bitwise_equal(back[i], recs[i])) << "record " << i;
  std::filesystem::remove(path);
}

TEST(LogitsFile, CorruptFilesAreErrorsNamingTheProblem) {
  const std::string path = temp_path("locus_logits_bad_");
  write_logits_file(path, {Tensor::zeros({2, 3}, DType::kFP32)});
  auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 4);
  try {
    read_logits_file(path);
    FAIL() << "truncated file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("beyond the file end"), std::string::npos) << e.what();
  }
  { std::ofstream(path, std::ios::binary) << "NOTLOGITSxxxxxxxxxx"; }
  EXPECT_THROW(read_logits_file(path), Error);
  EXPECT_THROW(write_logits_file(path, {Tensor::zeros({2, 3}, DType::kBF16)}), Error);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace locus::runtime
