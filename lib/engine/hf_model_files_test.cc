// Conversions of Hugging Face folders carry the model's other files (lib/formats/hf/
// model_files.h): config.json with its dtype updated, tokenizer, card and licence, through the
// normal commit.

#include <xxhash.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/engine/conversion.h"
#include "lib/engine/object_store_output.h"
#include "lib/engine/partitioned_conversion.h"
#include "lib/formats/safetensors/safetensors_fixture.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/s3/s3_store.h"
#include "lib/io/s3/testing/memory_s3_client.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

// As transformers 5 writes it (both dtype keys), with keys whose order and values must survive.
constexpr char kConfig[] = R"({
  "architectures": [
    "LlamaForCausalLM"
  ],
  "bos_token_id": 1,
  "dtype": "float32",
  "hidden_size": 8,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "torch_dtype": "float32",
  "transformers_version": "5.17.0",
  "vocab_size": 4
}
)";

std::string FloatBytes(int count, float start) {
  std::string bytes;
  for (int i = 0; i < count; ++i) {
    const float value = start + static_cast<float>(i) / 8;
    bytes.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  return bytes;
}

// The files of a save_pretrained folder beside its two weight shards, by name. tokenizer.json
// is larger than a companion file (kModelFileCompanionBytes), so it is copied verbatim.
std::vector<std::pair<std::string, std::string>> ModelFilesOfFixture() {
  return {{"config.json", kConfig},
          {"generation_config.json", "{\n  \"bos_token_id\": 1\n}\n"},
          {"tokenizer.json", TestPattern((2 << 20) + 3, 7)},
          {"tokenizer_config.json", "{\"model_max_length\": 4}"},
          {"special_tokens_map.json", "{}"},
          {"README.md", "# tiny llama\n"},
          {"LICENSE", "licence text\n"}};
}

// Writes a sharded Hugging Face folder into `dir` (created when missing): two safetensors
// shards, their index, the model files, and a file that is not carried.
void WriteHfFolder(const std::string& dir) {
  fs::create_directories(dir);
  WriteAll(
      dir + "/model-00001-of-00002.safetensors",
      SafetensorsFileOf({{"model.embed_tokens.weight", DType::kF32, {4, 8}, FloatBytes(32, 0)}}));
  WriteAll(dir + "/model-00002-of-00002.safetensors",
           SafetensorsFileOf({{"lm_head.weight", DType::kF32, {4, 8}, FloatBytes(32, 1)}}));
  WriteAll(dir + "/model.safetensors.index.json",
           R"({"metadata": {"total_size": 256}, "weight_map": {)"
           R"("model.embed_tokens.weight": "model-00001-of-00002.safetensors", )"
           R"("lm_head.weight": "model-00002-of-00002.safetensors"}})");
  for (const auto& [name, contents] : ModelFilesOfFixture()) WriteAll(dir + "/" + name, contents);
  WriteAll(dir + "/training_args.bin", "not a model file");
}

ConversionSpec Consolidate(const std::string& input, const std::string& output) {
  ConversionSpec spec;
  spec.input = input;
  spec.output = output;
  spec.dtype = DTypePolicy::kBF16;
  spec.window_bytes = 64 << 10;  // tokenizer.json streams through many windows
  return spec;
}

std::set<std::string> FilesIn(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Every carried file is in OUT as it was, but config.json, whose dtype keys (only) say bf16;
// the manifest lists each with its size and XXH3-64.
void ExpectCarried(const std::string& out) {
  std::set<std::string> expected = {"model.safetensors", kManifestName};
  for (const auto& [name, contents] : ModelFilesOfFixture()) expected.insert(name);
  EXPECT_EQ(FilesIn(out), expected);
  const Json manifest = Json::parse(ReadAll(out + "/" + kManifestName));
  for (const auto& [name, contents] : ModelFilesOfFixture()) {
    const std::string written = ReadAll(out + "/" + name);
    if (name == "config.json") {
      const Json before = Json::parse(contents);
      const Json after = Json::parse(written);
      ASSERT_EQ(after.size(), before.size()) << written;
      auto a = after.begin();
      for (auto b = before.begin(); b != before.end(); ++b, ++a) {
        EXPECT_EQ(a.key(), b.key());  // same keys, same order
        if (b.key() == "torch_dtype" || b.key() == "dtype") {
          EXPECT_EQ(a.value(), "bfloat16") << a.key();
        } else {
          EXPECT_EQ(a.value(), b.value()) << a.key();
        }
      }
    } else {
      EXPECT_EQ(written, contents) << name;
    }
    const auto listed = std::find_if(manifest["files"].begin(), manifest["files"].end(),
                                     [&](const Json& file) { return file["name"] == name; });
    ASSERT_NE(listed, manifest["files"].end()) << name << " is not in the manifest";
    EXPECT_EQ((*listed)["bytes"], written.size()) << name;
    EXPECT_EQ((*listed)["xxh3_64"],
              absl::StrFormat("%016x", XXH3_64bits(written.data(), written.size())))
        << name;
  }
}

// Consolidates `input` to bf16 into a new folder named `name`, and checks what it carried.
void ConsolidateAndExpectCarried(const std::string& input, const std::string& name) {
  const std::string out = MakeTempDir("hf-out") + "/" + name;
  auto result = RunConversion(Consolidate(input, out));
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectCarried(out);
}

TEST(HfModelFilesTest, ConsolidateCarriesTheModelFilesAndUpdatesTheDtype) {
  const std::string in = MakeTempDir("hf-in") + "/model";
  WriteHfFolder(in);
  ConsolidateAndExpectCarried(in, "bf16");
}

TEST(HfModelFilesTest, NoExtraFilesLeavesThemOut) {
  const std::string in = MakeTempDir("hf-in") + "/model";
  WriteHfFolder(in);
  const std::string out = MakeTempDir("hf-out") + "/bare";
  ConversionSpec spec = Consolidate(in, out);
  spec.no_extra_files = true;
  auto result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(FilesIn(out), (std::set<std::string>{"model.safetensors", kManifestName}));
  EXPECT_EQ(Json::parse(ReadAll(out + "/" + kManifestName))["request"]["no_extra_files"], true);
}

// huggingface_hub's cache: every file of a snapshot links to ../../blobs/<hash>.
TEST(HfModelFilesTest, AHuggingFaceCacheSnapshotIsConverted) {
  const std::string flat = MakeTempDir("hf-flat") + "/model";
  WriteHfFolder(flat);
  const std::string repo = MakeTempDir("hub") + "/models--org--tiny";
  const std::string snapshot = repo + "/snapshots/0123abcd";
  fs::create_directories(repo + "/blobs");
  fs::create_directories(snapshot);
  int blob = 0;
  for (const auto& entry : fs::directory_iterator(flat)) {
    const std::string hash = absl::StrFormat("blob%02d", blob++);
    fs::copy_file(entry.path(), repo + "/blobs/" + hash);
    fs::create_symlink("../../blobs/" + hash, snapshot + "/" + entry.path().filename().string());
  }
  ConsolidateAndExpectCarried(snapshot, "from-cache");
}

TEST(HfModelFilesTest, ASymlinkLeavingTheInputIsRefusedAndNothingIsWritten) {
  const std::string in = MakeTempDir("hf-in") + "/model";
  WriteHfFolder(in);
  const std::string elsewhere = MakeTempDir("elsewhere");
  WriteAll(elsewhere + "/tokenizer.json", "{}");
  fs::remove(in + "/tokenizer.json");
  fs::create_symlink(elsewhere + "/tokenizer.json", in + "/tokenizer.json");
  const std::string parent = MakeTempDir("hf-out");
  auto result = RunConversion(Consolidate(in, parent + "/refused"));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kPermissionDenied) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr(in + "/tokenizer.json"));
  EXPECT_THAT(result.status().message(), HasSubstr(elsewhere + "/tokenizer.json"));
  EXPECT_TRUE(FilesIn(parent).empty());  // no OUT, no staging folder
}

TEST(HfModelFilesTest, AFolderInMemoryCarriesThemToo) {
  const std::string local = MakeTempDir("hf-mem-src") + "/model";
  WriteHfFolder(local);
  kvstore::MemoryDriver& memory = kvstore::GetMemoryDriver();
  memory.RemovePrefix("mem://hf-model-files/");
  for (const auto& entry : fs::directory_iterator(local)) {
    memory.Put("mem://hf-model-files/model/" + entry.path().filename().string(),
               ReadAll(entry.path().string()));
  }
  ConsolidateAndExpectCarried("mem://hf-model-files/model", "from-mem");
}

TEST(HfModelFilesTest, AnObjectStoreOutputHoldsThemUnderItsManifest) {
  const std::string in = MakeTempDir("hf-in") + "/model";
  WriteHfFolder(in);
  MemoryS3Client client;
  ASSERT_TRUE(client.CreateBucket("models").ok());
  auto result =
      RunConversionToObjectStore(Consolidate(in, "s3://models/tiny"), {}, S3Store(&client));
  ASSERT_TRUE(result.ok()) << result.status();
  const std::map<std::string, std::string> objects = client.objects("models");
  const Json manifest = Json::parse(objects.at(absl::StrCat("tiny/", kManifestName)));
  std::set<std::string> listed;
  for (const Json& file : manifest["files"]) listed.insert(file["name"].get<std::string>());
  for (const auto& [name, contents] : ModelFilesOfFixture()) {
    ASSERT_EQ(objects.count("tiny/" + name), 1u) << name;
    EXPECT_EQ(listed.count(name), 1u) << name;
    if (name != "config.json") {
      EXPECT_EQ(objects.at("tiny/" + name), contents) << name;
    }
  }
  EXPECT_THAT(objects.at("tiny/config.json"), HasSubstr("\"torch_dtype\": \"bfloat16\""));
}

// Workers of a partitioned conversion write the verbatim copies among their data files; the
// worker that publishes writes the companion files.
TEST(HfModelFilesTest, APartitionedConversionCarriesThemOnce) {
  const std::string in = MakeTempDir("hf-in") + "/model";
  WriteHfFolder(in);
  const std::string out = MakeTempDir("hf-out") + "/partitioned";
  for (int index = 0; index < 2; ++index) {
    ConversionSpec spec = Consolidate(in, out);
    spec.max_shard_size = 100;  // one 64-byte bf16 tensor per shard: files for both workers
    spec.partition_index = index;
    spec.partition_count = 2;
    auto result = RunAnyConversion(spec);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->published, index == 1);
  }
  std::set<std::string> expected = {"model-00001-of-00002.safetensors",
                                    "model-00002-of-00002.safetensors",
                                    "model.safetensors.index.json", kManifestName};
  for (const auto& [name, contents] : ModelFilesOfFixture()) expected.insert(name);
  EXPECT_EQ(FilesIn(out), expected);
  EXPECT_EQ(ReadAll(out + "/tokenizer.json"), ModelFilesOfFixture()[2].second);
}

// A reshard into safetensors parts is still a Hugging Face model's folder; torch parts
// (metaseq's layout) are not.
TEST(HfModelFilesTest, SafetensorsPartsCarryThemTorchPartsDoNot) {
  const std::string in = MakeTempDir("hf-in") + "/model";
  WriteHfFolder(in);
  ConversionSpec spec = Consolidate(in, MakeTempDir("hf-out") + "/parts");
  spec.kind = ConversionSpec::Kind::kReshard;
  spec.parts = 2;
  spec.rules_json = R"({"rules": [{"pattern": ".*", "split_dim": 0}]})";
  auto result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  std::set<std::string> expected = {"model_part-0.safetensors", "model_part-1.safetensors",
                                    kManifestName};
  for (const auto& [name, contents] : ModelFilesOfFixture()) expected.insert(name);
  EXPECT_EQ(FilesIn(spec.output), expected);
  spec.output = MakeTempDir("hf-out") + "/torch-parts";
  spec.output_format = "torch";
  result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(FilesIn(spec.output),
            (std::set<std::string>{"model_part-0.pt", "model_part-1.pt", kManifestName}));
}

TEST(HfModelFilesTest, TokenizerFolderIsCarriedForAnyInput) {
  // A lone safetensors file, no Hugging Face folder: only --tokenizer's files are carried.
  const std::string in = MakeTempDir("plain") + "/weights.safetensors";
  WriteAll(in, SafetensorsFileOf({{"w", DType::kF32, {2, 2}, FloatBytes(4, 0)}}));
  const std::string tokenizer = MakeTempDir("tok");
  WriteAll(tokenizer + "/tokenizer.json", "{\"tok\": 1}");
  WriteAll(tokenizer + "/merges.txt", "a b\n");
  WriteAll(tokenizer + "/config.json", "{}");  // not a tokenizer file
  const std::string out = MakeTempDir("hf-out") + "/with-tokenizer";
  ConversionSpec spec = Consolidate(in, out);
  spec.tokenizer = tokenizer;
  auto result = RunConversion(spec);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(FilesIn(out), (std::set<std::string>{"model.safetensors", "merges.txt",
                                                 "tokenizer.json", kManifestName}));
  EXPECT_EQ(ReadAll(out + "/tokenizer.json"), "{\"tok\": 1}");
  // Not into an output that is no Hugging Face model.
  ConversionSpec olmo = Consolidate(in, MakeTempDir("hf-out") + "/olmo");
  olmo.output_format = "olmo-safetensors";
  olmo.tokenizer = tokenizer;
  auto refused = PlanConversion(olmo);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--tokenizer " + tokenizer));
}

}  // namespace
}  // namespace reshard
