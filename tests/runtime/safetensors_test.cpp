#include "runtime/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "runtime_test_util.h"
#include "test_util.h"

namespace locus::runtime {
namespace {
using locus::testing::expect_error;
using locus::testing::TempDir;
using locus::testing::write_file;

// A raw safetensors file: 8-byte length, the header text as given, then the data bytes.
std::string raw_file(const std::string& header, const std::string& data, int64_t claimed_len = -1) {
  std::string out(8, '\0');
  uint64_t len = claimed_len < 0 ? header.size() : static_cast<uint64_t>(claimed_len);
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>(len >> (8 * b));
  return out + header + data;
}

TEST(Safetensors, RoundTripKeepsBytesShapesAndMetadata) {
  TempDir tmp;
  const uint64_t seed = locus::testing::fresh_seed();
  SCOPED_TRACE(seed);
  Tensor a = locus::testing::randn({3, 5}, DType::kBF16, seed);
  Tensor b = locus::testing::randn({7}, DType::kFP32, seed + 1);
  Tensor s = Tensor::zeros({}, DType::kFP32);
  s.data<float>()[0] = 0.125f;
  Tensor packed = Tensor::empty({4, 8}, DType::kFP4E2M1x2);
  for (int i = 0; i < 32; ++i) packed.data<uint8_t>()[i] = static_cast<uint8_t>(i * 7 + 1);
  // A non-contiguous view is written as its logical contents.
  Tensor big = locus::testing::randn({4, 6}, DType::kBF16, seed + 2);
  Tensor strided = big.slice(1, 1, 4);

  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  w.add("a", a);
  w.add("b", b);
  w.add("s", s);
  w.add("packed", packed, "U8");
  w.add("strided", strided);
  expect_error([&] { w.add("a", a); }, {"'a'", "twice"});
  expect_error([&] { w.add("bad", b, "BF16"); }, {"'bad'", "element sizes differ"});
  w.write(tmp.file("x.safetensors"));

  auto f = SafetensorsFile::open(tmp.file("x.safetensors"));
  EXPECT_EQ(f->data_offset() % 8, 0u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->names(), (std::vector<std::string>{"a", "b", "s", "packed", "strided"}));
  EXPECT_TRUE(locus::testing::bitwise_equal(f->get("a"), a));
  EXPECT_TRUE(locus::testing::bitwise_equal(f->get("b"), b));
  EXPECT_TRUE(locus::testing::bitwise_equal(f->get("strided"), strided.clone()));
  EXPECT_EQ(f->get("s").dim(), 0);
  EXPECT_EQ(f->get("s").data<float>()[0], 0.125f);
  EXPECT_EQ(f->info("packed").dtype, DType::kU8);
  EXPECT_EQ(f->info("packed").dtype_name, "U8");
  EXPECT_EQ(std::memcmp(f->get("packed").data_ptr(), packed.data_ptr(), 32), 0);
  EXPECT_EQ(f->info("a").shape, (Shape{3, 5}));
  expect_error([&] { f->info("nope"); }, {"'nope'", "x.safetensors"});

  // The view keeps the mapping alive after the file object is gone.
  Tensor keep = f->get("b");
  f.reset();
  EXPECT_TRUE(locus::testing::bitwise_equal(keep, b));
  // Writing through a borrowed view changes this process's copy only, never the file.
  keep.data<float>()[0] = 12345.f;
  EXPECT_TRUE(locus::testing::bitwise_equal(SafetensorsFile::open(tmp.file("x.safetensors"))->get("b"), b));
}

TEST(Safetensors, CorruptFilesGiveClearErrors) {
  TempDir tmp;
  const std::string p = tmp.file("bad.safetensors");
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  const std::string data(16, '\0');

  write_file(p, raw_file(good_header, data));
  EXPECT_EQ(SafetensorsFile::open(p)->info("w").nbytes(), 16u);

  expect_error([&] { SafetensorsFile::open(tmp.file("missing.safetensors")); }, {"missing.safetensors", "cannot open"});

  write_file(p, "abc");
  expect_error([&] { SafetensorsFile::open(p); }, {"bad.safetensors", "truncated", "3 bytes"});

  write_file(p, raw_file(good_header, data, 1ll << 40));
  expect_error([&] { SafetensorsFile::open(p); }, {"bad.safetensors", "header length", "exceeds the limit"});

  write_file(p, raw_file(good_header, data, static_cast<int64_t>(good_header.size() + 100)));
  expect_error([&] { SafetensorsFile::open(p); }, {"bad.safetensors", "runs past the end of the file"});

  write_file(p, raw_file(R"({"w":{"dtype":"F32",)", data));
  expect_error([&] { SafetensorsFile::open(p); }, {"bad.safetensors", "not valid JSON"});

  write_file(p, raw_file("[1,2]", ""));
  expect_error([&] { SafetensorsFile::open(p); }, {"bad.safetensors", "not a JSON object"});

  // Truncated data section: the last tensor's end is beyond the file.
  write_file(p, raw_file(good_header, data.substr(0, 10)));
  expect_error([&] { SafetensorsFile::open(p); }, {"bad.safetensors", "'w'", "run past the data section"});

  write_file(p, raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16,0]}})", data));
  expect_error([&] { SafetensorsFile::open(p); }, {"'w'", "begin 16 > end 0"});

  write_file(p, raw_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", data));
  expect_error([&] { SafetensorsFile::open(p); }, {"'w'", "holds 16 bytes", "needs 24"});

  write_file(p, raw_file(R"({"w":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})", data));
  expect_error([&] { SafetensorsFile::open(p); }, {"'w'", "negative"});

  write_file(p, raw_file(R"({"w":{"dtype":"Q7","shape":[2,2],"data_offsets":[0,16]}})", data));
  expect_error([&] { SafetensorsFile::open(p); }, {"'w'", "'Q7'"});

  write_file(p, raw_file(R"({"w":{"shape":[2,2],"data_offsets":[0,16]}})", data));
  expect_error([&] { SafetensorsFile::open(p); }, {"'w'", "dtype"});

  write_file(p, raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0]}})", data));
  expect_error([&] { SafetensorsFile::open(p); }, {"'w'", "data_offsets"});

  write_file(p, raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                         data));
  expect_error([&] { SafetensorsFile::open(p); }, {"'a'", "'b'", "overlap"});

  write_file(p, raw_file(R"({"__metadata__":{"k":3}})", ""));
  expect_error([&] { SafetensorsFile::open(p); }, {"__metadata__", "'k'", "not a string"});
}

TEST(Safetensors, EmptyTensorsAndMetadataOnlyFilesAreValid) {
  TempDir tmp;
  const std::string p = tmp.file("e.safetensors");
  write_file(p, raw_file(R"({"__metadata__":{"format":"pt"},"z":{"dtype":"BF16","shape":[0,4],"data_offsets":[0,0]},)"
                         R"("y":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})",
                         std::string(2, '\0')));
  auto f = SafetensorsFile::open(p);
  EXPECT_EQ(f->get("z").numel(), 0);
  EXPECT_EQ(f->get("y").numel(), 1);
}

}  // namespace
}  // namespace locus::runtime
