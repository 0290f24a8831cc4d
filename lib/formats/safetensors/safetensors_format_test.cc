#include "lib/formats/safetensors/safetensors_format.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;

struct TestTensor {
  std::string name;
  DType dtype;
  Shape shape;
};

// Writes a safetensors file holding `tensors` in the given order, data bytes counting up.
std::string WriteSafetensors(const std::string& path, const std::vector<TestTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {}) {
  std::vector<SafetensorsTensorEntry> entries;
  uint64_t offset = 0;
  for (const TestTensor& t : tensors) {
    const uint64_t bytes = NumElementsUnchecked(t.shape) * DTypeSize(t.dtype);
    entries.push_back({t.name, t.dtype, t.shape, offset, offset + bytes});
    offset += bytes;
  }
  auto header = EncodeSafetensorsHeader(entries, metadata);
  EXPECT_TRUE(header.ok()) << header.status();
  std::string file = *header;
  for (uint64_t i = 0; i < offset; ++i) file.push_back(static_cast<char>(i * 7 + 1));
  std::ofstream out(path, std::ios::binary);
  out.write(file.data(), static_cast<std::streamsize>(file.size()));
  return file;
}

TEST(EncodeSafetensorsHeaderTest, PaddedPrefixedAndRoundTrips) {
  std::vector<SafetensorsTensorEntry> entries = {
      {"b", DType::kF32, {2, 3}, 0, 24},
      {"a", DType::kBF16, {5}, 24, 34},
      {"s", DType::kI64, {}, 34, 42},
  };
  std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "x\"y"}};
  auto encoded = EncodeSafetensorsHeader(entries, metadata);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  ASSERT_GE(encoded->size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>((*encoded)[i]);
  EXPECT_EQ(n, encoded->size() - 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string json = encoded->substr(8);
  EXPECT_EQ(json.front(), '{');
  const size_t last = json.find_last_not_of(' ');
  EXPECT_EQ(json[last], '}');
  EXPECT_LT(json.size() - last - 1, 8u) << "padding longer than needed";
  // Compact JSON: no newlines.
  EXPECT_EQ(json.find('\n'), std::string::npos);

  auto parsed = ParseSafetensorsHeaderJson(json, 8 + json.size() + 42);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metadata, metadata);
  ASSERT_EQ(parsed->tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(parsed->tensors[i].name, entries[i].name);
    EXPECT_EQ(parsed->tensors[i].dtype, entries[i].dtype);
    EXPECT_EQ(parsed->tensors[i].shape, entries[i].shape);
    EXPECT_EQ(parsed->tensors[i].begin, entries[i].begin);
    EXPECT_EQ(parsed->tensors[i].end, entries[i].end);
  }
  // The file order is kept in the JSON (ordered keys).
  EXPECT_LT(json.find("\"b\""), json.find("\"a\""));
}

TEST(EncodeSafetensorsHeaderTest, EveryPaddingLength) {
  // Names of growing length hit every residue modulo 8.
  for (int length = 1; length <= 16; ++length) {
    std::vector<SafetensorsTensorEntry> entries = {
        {std::string(length, 'n'), DType::kU8, {1}, 0, 1}};
    auto encoded = EncodeSafetensorsHeader(entries, {});
    ASSERT_TRUE(encoded.ok());
    EXPECT_EQ(encoded->size() % 8, 0u) << length;
    EXPECT_TRUE(ParseSafetensorsHeader(*encoded + "x", encoded->size() + 1).ok()) << length;
  }
  auto empty = EncodeSafetensorsHeader({}, {});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->substr(8, 2), "{}");
  EXPECT_EQ(empty->size(), 16u);
}

TEST(SafetensorsOutputTest, FrameOrdersByDTypeDescThenName) {
  SafetensorsOutput writer;
  OutputFileLayout file;
  file.name = "model.safetensors";
  file.metadata = {{"reshard_part", "1"}};
  file.tensors = {
      {"z.bias", 0, Box{{0}, {4}}, DType::kBF16}, {"a.weight", 1, Box{{0, 0}, {2, 2}}, DType::kF32},
      {"m.count", 2, Box{{}, {}}, DType::kI64},   {"b.bias", 3, Box{{2}, {3}}, DType::kBF16},
      {"flag", 4, Box{{0}, {3}}, DType::kBool},   {"c.weight", 5, Box{{0, 0}, {1, 2}}, DType::kF32},
  };
  auto framing = writer.Frame(file);
  ASSERT_TRUE(framing.ok()) << framing.status();
  ASSERT_EQ(framing->segments.size(), 7u);
  ASSERT_EQ(framing->segments[0].kind, FramingSegment::Kind::kBytes);
  std::vector<int> order;
  for (size_t i = 1; i < framing->segments.size(); ++i) {
    ASSERT_EQ(framing->segments[i].kind, FramingSegment::Kind::kTensor);
    order.push_back(framing->segments[i].tensor);
  }
  // I64 > F32 (a, c) > BF16 (b, z) > BOOL.
  EXPECT_EQ(order, (std::vector<int>{2, 1, 5, 3, 0, 4}));
  const std::string& header = framing->segments[0].bytes;
  uint64_t data_bytes = 8 + 16 + 8 + 6 + 8 + 3;
  auto parsed = ParseSafetensorsHeader(header, header.size() + data_bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->metadata.at("format"), "pt");
  EXPECT_EQ(parsed->metadata.at("reshard_part"), "1");
  ASSERT_EQ(parsed->tensors.size(), 6u);
  EXPECT_EQ(parsed->tensors[0].name, "m.count");
  EXPECT_EQ(parsed->tensors[1].name, "a.weight");
  EXPECT_EQ(parsed->tensors[2].name, "c.weight");
  EXPECT_EQ(parsed->tensors[3].name, "b.bias");
  EXPECT_EQ(parsed->tensors[3].shape, (Shape{3}));  // the region's extent
  EXPECT_EQ(parsed->tensors[4].name, "z.bias");
  EXPECT_EQ(parsed->tensors[5].name, "flag");
  EXPECT_EQ(parsed->tensors[5].end, data_bytes);
}

TEST(SafetensorsOutputTest, FrameRejectsDuplicateNames) {
  SafetensorsOutput writer;
  OutputFileLayout file;
  file.name = "x.safetensors";
  file.tensors = {{"w", 0, Box{{0}, {1}}, DType::kF32}, {"w", 1, Box{{0}, {1}}, DType::kF32}};
  auto framing = writer.Frame(file);
  ASSERT_FALSE(framing.ok());
  EXPECT_NE(framing.status().message().find("\"w\""), absl::string_view::npos);
}

TEST(SafetensorsOutputTest, NamingAndIndex) {
  SafetensorsOutput writer;
  OutputNaming naming = writer.naming();
  EXPECT_EQ(naming.shard_file(0, 1), "model.safetensors");
  EXPECT_EQ(naming.shard_file(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(naming.shard_file(2, 3), "model-00003-of-00003.safetensors");
  EXPECT_EQ(naming.part_file(1, 4), "model_part-1.safetensors");

  TargetLayout layout;
  layout.kind = TargetLayout::Kind::kConsolidated;
  layout.files.resize(2);
  layout.files[0].name = "model-00001-of-00002.safetensors";
  layout.files[0].tensors.push_back({"b", 0, Box::Full({10}), DType::kF32});
  layout.files[1].name = "model-00002-of-00002.safetensors";
  layout.files[1].tensors.push_back({"a", 1, Box::Full({3}), DType::kBF16});
  // A tied alias of "a": listed in the index's metadata, not in the weight map or total_size.
  OutputTensor alias{"a_tied", 2, Box::Full({3}), DType::kBF16};
  alias.alias_of = 0;
  layout.files[1].tensors.push_back(alias);
  CopyPlan plan;
  plan.files.resize(2);
  plan.files[0].name = "model-00001-of-00002.safetensors";
  plan.files[0].tensors.push_back({"b", DType::kF32, DType::kF32, 10, {}});
  plan.files[1].name = "model-00002-of-00002.safetensors";
  plan.files[1].tensors.push_back({"a", DType::kF32, DType::kBF16, 3, {}});
  auto companions = writer.CompanionFiles(layout);
  ASSERT_TRUE(companions.ok());
  ASSERT_EQ(companions->size(), 1u);
  EXPECT_EQ((*companions)[0].first, kSafetensorsIndexName);
  auto index = nlohmann::json::parse((*companions)[0].second);
  EXPECT_EQ(index["metadata"]["total_size"], 46);
  EXPECT_EQ(index["weight_map"]["a"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00002.safetensors");
  EXPECT_FALSE(index["weight_map"].contains("a_tied"));
  EXPECT_EQ(index["metadata"]["a_tied"], "a");
  // One file, or parts: no index.
  layout.files.resize(1);
  EXPECT_TRUE(writer.CompanionFiles(layout)->empty());
  layout.files.resize(2);
  layout.kind = TargetLayout::Kind::kParts;
  EXPECT_TRUE(writer.CompanionFiles(layout)->empty());
}

TEST(SafetensorsInputTest, SingleFile) {
  const std::string dir = MakeTempDir("single");
  const std::string path = dir + "/m.safetensors";
  const std::string bytes = WriteSafetensors(
      path, {{"w", DType::kF32, {2, 3}}, {"b", DType::kBF16, {3}}}, {{"format", "pt"}});
  SafetensorsInput reader;
  EXPECT_TRUE(reader.Probe(path).value());
  EXPECT_TRUE(reader.Probe(dir).value());
  auto model = reader.Read(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->format, "safetensors");
  EXPECT_EQ(model->arrangement, "single-file");
  ASSERT_EQ(model->parts.size(), 1u);
  const Catalog& catalog = model->parts[0];
  ASSERT_EQ(catalog.files.size(), 1u);
  EXPECT_EQ(catalog.files[0].size, bytes.size());
  EXPECT_EQ(catalog.metadata.at("format"), "pt");
  const int b = catalog.Find("b");
  ASSERT_GE(b, 0);
  ASSERT_EQ(catalog.tensors[b].pieces.size(), 1u);
  EXPECT_EQ(catalog.tensors[b].pieces[0].byte_offset, bytes.size() - 6);
  EXPECT_EQ(catalog.tensors[b].pieces[0].box, Box::Full({3}));
  EXPECT_TRUE(ValidateCatalog(catalog).ok());
}

void WriteIndex(const std::string& dir, const nlohmann::json& weight_map) {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  std::ofstream(dir + "/" + kSafetensorsIndexName) << index.dump();
}

TEST(SafetensorsInputTest, IndexedFolder) {
  const std::string dir = MakeTempDir("indexed");
  WriteSafetensors(dir + "/model-00001-of-00002.safetensors", {{"a", DType::kF32, {4}}});
  WriteSafetensors(dir + "/model-00002-of-00002.safetensors",
                   {{"b", DType::kF32, {2}}, {"c", DType::kU8, {3}}});
  WriteIndex(dir, {{"a", "model-00001-of-00002.safetensors"},
                   {"b", "model-00002-of-00002.safetensors"},
                   {"c", "model-00002-of-00002.safetensors"}});
  SafetensorsInput reader;
  auto model = reader.Read(dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->arrangement, "sharded");
  ASSERT_EQ(model->parts.size(), 1u);
  EXPECT_EQ(model->parts[0].files.size(), 2u);
  EXPECT_EQ(model->parts[0].tensors.size(), 3u);
  EXPECT_GE(model->parts[0].Find("c"), 0);
}

void ExpectIndexError(const std::string& dir, const std::vector<std::string>& substrings) {
  SafetensorsInput reader;
  auto model = reader.Read(dir, {});
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find(kSafetensorsIndexName), absl::string_view::npos)
      << model.status();
  for (const std::string& s : substrings) {
    EXPECT_NE(model.status().message().find(s), absl::string_view::npos)
        << "expected \"" << s << "\" in: " << model.status();
  }
}

TEST(SafetensorsInputTest, IndexNamesMissingFile) {
  const std::string dir = MakeTempDir("idx_missing");
  WriteSafetensors(dir + "/one.safetensors", {{"a", DType::kF32, {4}}});
  WriteIndex(dir, {{"a", "one.safetensors"}, {"b", "two.safetensors"}});
  ExpectIndexError(dir, {"two.safetensors"});
}

TEST(SafetensorsInputTest, IndexMapsTensorToWrongFile) {
  const std::string dir = MakeTempDir("idx_wrong");
  WriteSafetensors(dir + "/one.safetensors", {{"a", DType::kF32, {4}}});
  WriteSafetensors(dir + "/two.safetensors", {{"b", DType::kF32, {4}}});
  WriteIndex(dir, {{"a", "two.safetensors"}, {"b", "two.safetensors"}});
  ExpectIndexError(dir, {"\"a\""});
}

TEST(SafetensorsInputTest, IndexListsTensorInNoFile) {
  const std::string dir = MakeTempDir("idx_ghost");
  WriteSafetensors(dir + "/one.safetensors", {{"a", DType::kF32, {4}}});
  WriteIndex(dir, {{"a", "one.safetensors"}, {"ghost", "one.safetensors"}});
  ExpectIndexError(dir, {"\"ghost\""});
}

TEST(SafetensorsInputTest, IndexOmitsFileTensor) {
  const std::string dir = MakeTempDir("idx_unlisted");
  WriteSafetensors(dir + "/one.safetensors", {{"a", DType::kF32, {4}}, {"extra", DType::kU8, {1}}});
  WriteIndex(dir, {{"a", "one.safetensors"}});
  ExpectIndexError(dir, {"\"extra\""});
}

TEST(SafetensorsInputTest, IndexEscapingFolderIsRejected) {
  const std::string dir = MakeTempDir("idx_escape");
  WriteSafetensors(dir + "/one.safetensors", {{"a", DType::kF32, {4}}});
  WriteIndex(dir, {{"a", "../one.safetensors"}});
  ExpectIndexError(dir, {"../one.safetensors"});
}

TEST(SafetensorsInputTest, IdenticalNamesAreModelParallelPartsInNaturalOrder) {
  const std::string dir = MakeTempDir("parts");
  WriteSafetensors(dir + "/p10.safetensors", {{"w", DType::kF32, {2, 3}}, {"b", DType::kF32, {3}}});
  WriteSafetensors(dir + "/p2.safetensors", {{"b", DType::kF32, {3}}, {"w", DType::kF32, {2, 5}}});
  SafetensorsInput reader;
  auto model = reader.Read(dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->arrangement, "model-parallel-parts");
  ASSERT_EQ(model->parts.size(), 2u);
  ASSERT_EQ(model->part_names.size(), 2u);
  EXPECT_EQ(fs::path(model->part_names[0]).filename(), "p2.safetensors");
  EXPECT_EQ(fs::path(model->part_names[1]).filename(), "p10.safetensors");
  EXPECT_EQ(fs::path(model->parts[0].files[0].path).filename(), "p2.safetensors");
  EXPECT_EQ(model->parts[0].tensors[model->parts[0].Find("w")].shape, (Shape{2, 5}));
  EXPECT_EQ(model->parts[1].tensors[model->parts[1].Find("w")].shape, (Shape{2, 3}));
}

TEST(SafetensorsInputTest, DisjointNamesAreShards) {
  const std::string dir = MakeTempDir("shards");
  WriteSafetensors(dir + "/a.safetensors", {{"x", DType::kF32, {2}}});
  WriteSafetensors(dir + "/b.safetensors", {{"y", DType::kF32, {2}}, {"z", DType::kU8, {2}}});
  std::ofstream(dir + "/notes.txt") << "ignored";
  SafetensorsInput reader;
  auto model = reader.Read(dir, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->arrangement, "sharded");
  ASSERT_EQ(model->parts.size(), 1u);
  EXPECT_EQ(model->parts[0].files.size(), 2u);
  EXPECT_EQ(model->parts[0].tensors.size(), 3u);
}

TEST(SafetensorsInputTest, PartiallyOverlappingNamesAreRejected) {
  const std::string dir = MakeTempDir("mixed");
  WriteSafetensors(dir + "/a.safetensors", {{"x", DType::kF32, {2}}, {"y", DType::kF32, {2}}});
  WriteSafetensors(dir + "/b.safetensors", {{"y", DType::kF32, {2}}, {"z", DType::kF32, {2}}});
  SafetensorsInput reader;
  auto model = reader.Read(dir, {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("\"y\""), absl::string_view::npos) << model.status();
}

TEST(SafetensorsInputTest, EmptyFolderAndCorruptFile) {
  SafetensorsInput reader;
  const std::string empty = MakeTempDir("empty");
  EXPECT_FALSE(reader.Probe(empty).value());
  EXPECT_FALSE(reader.Read(empty, {}).ok());
  const std::string dir = MakeTempDir("corrupt");
  std::ofstream(dir + "/bad.safetensors") << "not a safetensors file at all";
  auto model = reader.Read(dir + "/bad.safetensors", {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(model.status().message().find("bad.safetensors"), absl::string_view::npos);
}

TEST(FormatRegistryTest, SafetensorsIsRegistered) {
  auto output = FindOutputFormat("safetensors");
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ((*output)->id(), "safetensors");
  EXPECT_EQ(FindOutputFormat("gguf").status().code(), absl::StatusCode::kInvalidArgument);
  const std::string dir = MakeTempDir("registry");
  WriteSafetensors(dir + "/m.safetensors", {{"w", DType::kF32, {1}}});
  auto input = DetectInputFormat(dir + "/m.safetensors");
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ((*input)->id(), "safetensors");
  EXPECT_EQ(DetectInputFormat(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace reshard
