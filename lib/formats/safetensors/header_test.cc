#include "lib/formats/safetensors/header.h"

#include <stdlib.h>

#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

std::string LengthPrefix(uint64_t n) {
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return prefix;
}

// A whole file: prefix, `json`, then `data_bytes` bytes of data.
std::string File(const std::string& json, size_t data_bytes) {
  return LengthPrefix(json.size()) + json + std::string(data_bytes, '\x01');
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensorsHeader(file, file.size());
}

void ExpectError(const std::string& file, absl::StatusCode code,
                 const std::vector<std::string>& substrings) {
  auto header = Parse(file);
  ASSERT_FALSE(header.ok()) << "accepted: " << file.substr(std::min<size_t>(8, file.size()));
  EXPECT_EQ(header.status().code(), code) << header.status();
  for (const std::string& s : substrings) {
    EXPECT_NE(header.status().message().find(s), absl::string_view::npos)
        << "expected \"" << s << "\" in: " << header.status();
  }
}

TEST(SafetensorsHeaderTest, FileShorterThan8Bytes) {
  for (size_t size : {0, 1, 7}) {
    auto length = ParseSafetensorsHeaderLength(std::string(size, '\0'), size);
    ASSERT_FALSE(length.ok());
    EXPECT_EQ(length.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(length.status().message().find("too short"), absl::string_view::npos)
        << length.status();
  }
  ExpectError("{}", absl::StatusCode::kDataLoss, {"too short"});
}

TEST(SafetensorsHeaderTest, HeaderLengthOverLimit) {
  const std::string prefix = LengthPrefix(100'000'001);
  auto length = ParseSafetensorsHeaderLength(prefix, 1ull << 40);
  ASSERT_FALSE(length.ok());
  EXPECT_EQ(length.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(length.status().message().find("100000000"), absl::string_view::npos)
      << length.status();
  // The limit itself is allowed.
  EXPECT_TRUE(ParseSafetensorsHeaderLength(LengthPrefix(100'000'000), 1ull << 40).ok());
  // A huge N must not wrap around 8 + N.
  EXPECT_FALSE(ParseSafetensorsHeaderLength(LengthPrefix(UINT64_MAX - 4), 100).ok());
}

TEST(SafetensorsHeaderTest, HeaderPastEndOfFile) {
  std::string file = File("{}", 0);
  file.pop_back();  // N = 2, but only 1 byte of JSON left
  ExpectError(file, absl::StatusCode::kDataLoss, {"past the end", "truncated"});
  auto length = ParseSafetensorsHeaderLength(LengthPrefix(100), 107);
  EXPECT_EQ(length.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(ParseSafetensorsHeaderLength(LengthPrefix(100), 108).ok());
}

TEST(SafetensorsHeaderTest, InvalidUtf8) {
  ExpectError(File("{\"a\xff\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1),
              absl::StatusCode::kDataLoss, {"UTF-8"});
  // An overlong encoding of '/' is invalid too.
  ExpectError(File("{\"__metadata__\": {\"k\": \"\xc0\xaf\"}}", 0), absl::StatusCode::kDataLoss,
              {"UTF-8"});
}

TEST(SafetensorsHeaderTest, InvalidJson) {
  ExpectError(File("{\"a\": ", 0), absl::StatusCode::kDataLoss, {"JSON"});
  ExpectError(File("{'a': 1}", 0), absl::StatusCode::kDataLoss, {"JSON"});
  ExpectError(File("{} {}", 0), absl::StatusCode::kDataLoss, {"JSON"});
}

TEST(SafetensorsHeaderTest, NotAnObject) {
  ExpectError(File("[1, 2, 3]", 0), absl::StatusCode::kDataLoss, {"not an object"});
  ExpectError(File("\"str\"", 0), absl::StatusCode::kDataLoss, {"not an object"});
}

TEST(SafetensorsHeaderTest, DuplicateKey) {
  ExpectError(File(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                       "w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                   2),
              absl::StatusCode::kDataLoss, {"duplicate key \"w\""});
  // Inside a tensor entry too.
  ExpectError(
      File(R"({"w": {"dtype": "U8", "dtype": "I8", "shape": [1], "data_offsets": [0, 1]}})", 1),
      absl::StatusCode::kDataLoss, {"duplicate key \"dtype\""});
  // The same key in different objects is fine.
  EXPECT_TRUE(Parse(File(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                             "b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                         2))
                  .ok());
}

TEST(SafetensorsHeaderTest, MetadataValues) {
  ExpectError(File(R"({"__metadata__": {"format": "pt", "step": 5}})", 0),
              absl::StatusCode::kDataLoss, {"__metadata__", "step"});
  ExpectError(File(R"({"__metadata__": ["pt"]})", 0), absl::StatusCode::kDataLoss,
              {"__metadata__"});
  auto ok = Parse(File(R"({"__metadata__": {"format": "pt", "x": ""}})", 0));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->metadata.at("format"), "pt");
  EXPECT_EQ(ok->metadata.at("x"), "");
  EXPECT_TRUE(ok->tensors.empty());
}

TEST(SafetensorsHeaderTest, UnknownDType) {
  for (const char* dtype : {"C64", "F4", "F6_E2M3", "Q8"}) {
    const std::string json = std::string(R"({"w": {"dtype": ")") + dtype +
                             R"(", "shape": [1], "data_offsets": [0, 8]}})";
    ExpectError(File(json, 8), absl::StatusCode::kUnimplemented, {dtype, "\"w\""});
  }
}

TEST(SafetensorsHeaderTest, ShapeTimesDTypeNotLength) {
  ExpectError(File(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20),
              absl::StatusCode::kDataLoss, {"\"w\"", "24 bytes", "[2, 3]"});
  // Overflowing products are caught, not wrapped.
  ExpectError(
      File(R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})",
           0),
      absl::StatusCode::kDataLoss, {"overflow"});
  ExpectError(
      File(R"({"w": {"dtype": "F64", "shape": [2305843009213693952], "data_offsets": [0, 0]}})", 0),
      absl::StatusCode::kDataLoss, {"\"w\""});
}

TEST(SafetensorsHeaderTest, Overlap) {
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                       "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]}})",
                   12),
              absl::StatusCode::kDataLoss, {"\"b\"", "overlap"});
}

TEST(SafetensorsHeaderTest, Gap) {
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                       "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}})",
                   12),
              absl::StatusCode::kDataLoss, {"\"b\"", "gap"});
}

TEST(SafetensorsHeaderTest, FirstTensorMustStartAtZero) {
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})", 8),
              absl::StatusCode::kDataLoss, {"\"a\"", "[4, 8]"});
}

TEST(SafetensorsHeaderTest, TrailingBytes) {
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})", 5),
              absl::StatusCode::kDataLoss, {"trailing"});
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}})", 3),
              absl::StatusCode::kDataLoss, {"truncated"});
  ExpectError(File("{}", 1), absl::StatusCode::kDataLoss, {"trailing"});
}

TEST(SafetensorsHeaderTest, NegativeShapeEntry) {
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [-4], "data_offsets": [0, 4]}})", 4),
              absl::StatusCode::kDataLoss, {"\"a\"", "non-negative"});
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}})", 1),
              absl::StatusCode::kDataLoss, {"\"a\""});
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [-1, 4]}})", 4),
              absl::StatusCode::kDataLoss, {"\"a\"", "data_offsets"});
}

TEST(SafetensorsHeaderTest, BeginAfterEnd) {
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", 4),
              absl::StatusCode::kDataLoss, {"\"a\"", "end before they begin"});
}

TEST(SafetensorsHeaderTest, SchemaViolations) {
  ExpectError(File(R"({"a": 5})", 0), absl::StatusCode::kDataLoss, {"\"a\""});
  ExpectError(File(R"({"a": {"shape": [1], "data_offsets": [0, 1]}})", 1),
              absl::StatusCode::kDataLoss, {"dtype"});
  ExpectError(File(R"({"a": {"dtype": "U8", "data_offsets": [0, 1]}})", 1),
              absl::StatusCode::kDataLoss, {"shape"});
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", 1),
              absl::StatusCode::kDataLoss, {"data_offsets"});
}

TEST(SafetensorsHeaderTest, DeepNesting) {
  ExpectError(File(R"({"a": {"dtype": "U8", "shape": [[1]], "data_offsets": [0, 1]}})", 1),
              absl::StatusCode::kDataLoss, {"nest"});
  std::string deep = "{\"a\": ";
  for (int i = 0; i < 100000; ++i) deep += "[";
  for (int i = 0; i < 100000; ++i) deep += "]";
  deep += "}";
  ExpectError(File(deep, 0), absl::StatusCode::kDataLoss, {"nest"});
  ExpectError(File(R"({"__metadata__": {"k": {"x": "y"}}})", 0), absl::StatusCode::kDataLoss, {});
}

TEST(SafetensorsHeaderTest, ValidEmptyTensorsShareOffsets) {
  auto header = Parse(File(R"({"e1": {"dtype": "F32", "shape": [0, 3], "data_offsets": [4, 4]},
                               "w": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                               "e2": {"dtype": "BF16", "shape": [0], "data_offsets": [4, 4]},
                               "e0": {"dtype": "I64", "shape": [0], "data_offsets": [0, 0]}})",
                           4));
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->tensors.size(), 4u);
  // Sorted by data offset.
  EXPECT_EQ(header->tensors[0].name, "e0");
  EXPECT_EQ(header->tensors[1].name, "w");
  EXPECT_EQ(header->tensors[1].shape, (Shape{4}));
  EXPECT_EQ(header->tensors[1].dtype, DType::kU8);
  EXPECT_EQ(header->tensors[2].begin, 4u);
  EXPECT_EQ(header->tensors[3].end, 4u);
}

TEST(SafetensorsHeaderTest, ValidScalar) {
  const std::string json = R"({"s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]}})";
  auto header = Parse(File(json, 8));
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->tensors.size(), 1u);
  EXPECT_TRUE(header->tensors[0].shape.empty());
  EXPECT_EQ(header->tensors[0].dtype, DType::kF64);
  EXPECT_EQ(header->header_length, json.size());
  EXPECT_EQ(header->data_start, 8 + json.size());
}

TEST(SafetensorsHeaderTest, ValidWhitespacePadded) {
  const std::string json =
      "  \n{\"w\": {\"dtype\": \"I16\", \"shape\": [3], \"data_offsets\": [0, 6]}}        ";
  auto header = Parse(File(json, 6));
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->tensors.size(), 1u);
  EXPECT_EQ(header->tensors[0].end, 6u);
  EXPECT_EQ(header->data_start, 8 + json.size());
}

TEST(SafetensorsHeaderTest, ReadFromFileNamesPath) {
  std::string dir = testing::TempDir() + "/hdr_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string good =
      File(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", 2);
  std::ofstream(dir + "/good.safetensors", std::ios::binary) << good;
  uint64_t size = 0;
  auto header = ReadSafetensorsHeader(dir + "/good.safetensors", &size);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(size, good.size());
  EXPECT_EQ(header->tensors.size(), 1u);
  std::ofstream(dir + "/bad.safetensors", std::ios::binary) << good.substr(0, good.size() - 1);
  auto bad = ReadSafetensorsHeader(dir + "/bad.safetensors", &size);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("bad.safetensors"), absl::string_view::npos)
      << bad.status();
  EXPECT_EQ(ReadSafetensorsHeader(dir + "/missing.safetensors", &size).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace reshard
