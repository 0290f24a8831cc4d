#include "lib/formats/olmo/olmo_format.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/engine/conversion.h"
#include "lib/formats/olmo/olmo_fixture.h"
#include "lib/formats/olmo/olmo_keys.h"
#include "lib/formats/safetensors/header.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using S = StructureNode;

std::string WriteFixture(const std::vector<OlmoFixtureEntry>& entries, const std::string& tag) {
  const std::string path = MakeTempDir(tag) + "/model.safetensors";
  WriteAll(path, OlmoSafetensorsFileOf(entries));
  return path;
}

TEST(OlmoFormatTest, ReadsTheNestedStateDict) {
  const std::string path = WriteFixture(OlmoFixtureEntries(), "olmo_read");
  OlmoSafetensorsInput input;
  ASSERT_TRUE(input.Probe(path).value());
  absl::StatusOr<InputModel> model = input.Read(path, {});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->parts.size(), 1u);
  const Catalog& catalog = model->parts[0];
  ASSERT_EQ(catalog.tensors.size(), 3u);
  EXPECT_GE(catalog.Find("model.embed.weight"), 0);
  EXPECT_GE(catalog.Find("optim.state.0.step"), 0);
  ASSERT_NE(catalog.structure, nullptr);
  const StructureNode* optim = catalog.structure->Find("optim");
  ASSERT_NE(optim, nullptr);
  const StructureNode* groups = optim->Find("param_groups");
  ASSERT_NE(groups, nullptr);
  ASSERT_EQ(groups->kind, S::Kind::kList);
  const StructureNode* lr = FindKey(&groups->items.at(0), "lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->real, 0.001);
  // The int key of optimizer state stays an int.
  const StructureNode* state = optim->Find("state");
  ASSERT_NE(state, nullptr);
  ASSERT_EQ(state->keys.at(0).kind, S::Kind::kInt);
  EXPECT_EQ(catalog.other_entries, std::vector<std::string>{"optim.param_groups: list of 1"});
  EXPECT_TRUE(absl::StrContains(model->description, "3 tensors, 1 pickled value"))
      << model->description;
}

TEST(OlmoFormatTest, RefusesANameThatIsNotAnOlmoKey) {
  std::vector<OlmoFixtureEntry> entries = OlmoFixtureEntries();
  const std::string path = WriteFixture(entries, "olmo_bad_key");
  // Replace the second key by a same-length run of characters outside base64.
  std::string bytes = ReadAll(path);
  const std::string second = *EncodeOlmoKey(entries[1].key);
  const size_t at = bytes.find(second);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, second.size(), std::string(second.size(), '.'));
  WriteAll(path, bytes);
  OlmoSafetensorsInput input;
  ASSERT_TRUE(input.Probe(path).value());
  absl::StatusOr<InputModel> model = input.Read(path, {});
  ASSERT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  const std::string message(model.status().message());
  EXPECT_TRUE(absl::StrContains(message, path)) << message;
  EXPECT_TRUE(absl::StrContains(message, "\"....")) << message;
  EXPECT_TRUE(absl::StrContains(message, "byte offset")) << message;
  EXPECT_TRUE(absl::StrContains(message, "not url-safe base64")) << message;
}

TEST(OlmoFormatTest, RefusesAPickledValueThatIsNotBytes) {
  std::vector<OlmoFixtureEntry> entries = OlmoFixtureEntries();
  entries[0].key.value_is_pickled = true;  // an F32 tensor marked as a pickled value
  const std::string path = WriteFixture(entries, "olmo_bad_value");
  absl::StatusOr<InputModel> model = OlmoSafetensorsInput().Read(path, {});
  ASSERT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  EXPECT_TRUE(absl::StrContains(model.status().message(), "('model', 'embed.weight')"))
      << model.status();
}

TEST(OlmoFormatTest, RefusesTwoKeyPathsWithOneDottedName) {
  std::vector<OlmoFixtureEntry> entries = OlmoFixtureEntries();
  entries[1].key.keys = {S::String("model.embed"), S::String("weight")};
  const std::string path = WriteFixture(entries, "olmo_same_name");
  absl::StatusOr<InputModel> model = OlmoSafetensorsInput().Read(path, {});
  ASSERT_EQ(model.status().code(), absl::StatusCode::kDataLoss) << model.status();
  EXPECT_TRUE(absl::StrContains(model.status().message(), "same dotted name")) << model.status();
}

TEST(OlmoFormatTest, PlainSafetensorsIsNotOlmo) {
  const std::string path = WriteFixture({}, "olmo_empty");
  EXPECT_FALSE(OlmoSafetensorsInput().Probe(path).value());
}

// Written back, the file holds exactly the keys and values OLMo wrote, in one file even when
// --max-shard-size would split it.
TEST(OlmoFormatTest, WritesTheSameKeysBack) {
  const std::vector<OlmoFixtureEntry> entries = OlmoFixtureEntries();
  const std::string path = WriteFixture(entries, "olmo_write");
  ConversionSpec spec;
  spec.input = path;
  spec.output = MakeTempDir("olmo_write_out") + "/out";
  spec.output_format = OlmoSafetensorsOutput::kId;
  spec.max_shard_size = 16;
  spec.threads = 1;
  absl::StatusOr<ConversionResult> result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::string written = spec.output + "/model.safetensors";
  uint64_t size = 0;
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(written, &size);
  ASSERT_TRUE(header.ok()) << header.status();
  std::set<std::string> names, expected;
  for (const SafetensorsTensorEntry& entry : header->tensors) names.insert(entry.name);
  for (const OlmoFixtureEntry& entry : entries) expected.insert(*EncodeOlmoKey(entry.key));
  EXPECT_EQ(names, expected);
  EXPECT_TRUE(header->metadata.empty());
  const std::string bytes = ReadAll(written);
  for (const OlmoFixtureEntry& entry : entries) {
    const std::string name = *EncodeOlmoKey(entry.key);
    for (const SafetensorsTensorEntry& stored : header->tensors) {
      if (stored.name != name) continue;
      EXPECT_EQ(bytes.substr(header->data_start + stored.begin, stored.end - stored.begin),
                entry.bytes)
          << OlmoKeyTuple(entry.key);
    }
  }
}

}  // namespace
}  // namespace reshard
