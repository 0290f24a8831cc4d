#include "lib/formats/hf/model_files.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/status_matchers.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Names(const absl::StatusOr<std::vector<ModelFile>>& files) {
  std::vector<std::string> names;
  if (!files.ok()) {
    ADD_FAILURE() << files.status();
    return names;
  }
  for (const ModelFile& file : *files) names.push_back(file.name);
  return names;
}

// A folder as save_pretrained writes it: weights, config, a tokenizer, a card, a licence, and
// files that are not carried.
std::string MakeHfFolder(const std::string& tag) {
  const std::string dir = MakeTempDir(tag);
  WriteAll(dir + "/model.safetensors", "weights");
  WriteAll(dir + "/config.json", R"({"model_type": "llama"})");
  WriteAll(dir + "/generation_config.json", "{}");
  WriteAll(dir + "/tokenizer.json", "{}");
  WriteAll(dir + "/tokenizer_config.json", "{}");
  WriteAll(dir + "/README.md", "# model");
  WriteAll(dir + "/LICENSE.txt", "licence");
  WriteAll(dir + "/training_args.bin", "not carried");
  WriteAll(dir + "/notes.json", "not carried");
  return dir;
}

TEST(ModelFilesTest, FindsTheFilesOfAHuggingFaceFolder) {
  const std::string dir = MakeHfFolder("hf");
  EXPECT_THAT(Names(FindModelFiles(dir)),
              ElementsAre("LICENSE.txt", "README.md", "config.json", "generation_config.json",
                          "tokenizer.json", "tokenizer_config.json"));
  // The weight file itself names the same model; a trailing '/' the same folder.
  EXPECT_THAT(Names(FindModelFiles(dir + "/model.safetensors")),
              ElementsAre("LICENSE.txt", "README.md", "config.json", "generation_config.json",
                          "tokenizer.json", "tokenizer_config.json"));
  auto files = FindModelFiles(dir + "/");
  ASSERT_OK(files);
  EXPECT_EQ(files->front().path, dir + "/LICENSE.txt");
  EXPECT_EQ(files->front().size, 7u);
}

TEST(ModelFilesTest, AFolderWithoutConfigOrWeightsIsNoHuggingFaceModel) {
  const std::string no_config = MakeHfFolder("no-config");
  fs::remove(no_config + "/config.json");
  EXPECT_THAT(Names(FindModelFiles(no_config)), IsEmpty());
  const std::string no_weights = MakeHfFolder("no-weights");
  fs::rename(no_weights + "/model.safetensors", no_weights + "/weights.safetensors");
  EXPECT_THAT(Names(FindModelFiles(no_weights)), IsEmpty());
  // A file that is not a Hugging Face weight file: no folder is looked at.
  EXPECT_THAT(Names(FindModelFiles(no_weights + "/weights.safetensors")), IsEmpty());
  // Sharded torch.save weights are Hugging Face weights too.
  fs::rename(no_weights + "/weights.safetensors", no_weights + "/pytorch_model-00001-of-00002.bin");
  EXPECT_THAT(Names(FindModelFiles(no_weights)), ::testing::Contains("config.json"));
}

// huggingface_hub's cache: models--org--name/snapshots/<rev>/<file> -> ../../blobs/<hash>.
TEST(ModelFilesTest, AHuggingFaceCacheSnapshotLinksIntoItsBlobs) {
  const std::string hub = MakeTempDir("hub");
  const std::string repo = hub + "/models--org--tiny";
  fs::create_directories(repo + "/blobs");
  fs::create_directories(repo + "/snapshots/abc123");
  const std::string snapshot = repo + "/snapshots/abc123";
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json"}) {
    WriteAll(repo + "/blobs/hash-" + std::string(name), name);
    fs::create_symlink(std::string("../../blobs/hash-") + name, snapshot + "/" + name);
  }
  auto files = FindModelFiles(snapshot);
  EXPECT_THAT(Names(files), ElementsAre("config.json", "tokenizer.json"));
  ASSERT_OK(files);
  EXPECT_EQ(files->at(1).size, std::string("tokenizer.json").size());
}

TEST(ModelFilesTest, ASymlinkOutOfTheFolderIsRefusedNamingLinkAndTarget) {
  const std::string dir = MakeHfFolder("escape");
  const std::string outside = MakeTempDir("outside");
  WriteAll(outside + "/secret.json", "{}");
  fs::create_symlink(outside + "/secret.json", dir + "/tokenizer_config.json.tmp");
  fs::remove(dir + "/tokenizer_config.json");
  fs::rename(dir + "/tokenizer_config.json.tmp", dir + "/tokenizer_config.json");
  auto files = FindModelFiles(dir);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kPermissionDenied) << files.status();
  EXPECT_THAT(files.status().message(), HasSubstr(dir + "/tokenizer_config.json"));
  EXPECT_THAT(files.status().message(), HasSubstr(outside + "/secret.json"));
  // The same link in a folder that only looks like a cache snapshot, outside its repository.
  const std::string hub = MakeTempDir("fake-hub");
  const std::string snapshot = hub + "/models--org--x/snapshots/r1";
  fs::create_directories(snapshot);
  WriteAll(snapshot + "/config.json", "{}");
  WriteAll(snapshot + "/model.safetensors", "w");
  fs::create_symlink(outside + "/secret.json", snapshot + "/tokenizer.json");
  auto cached = FindModelFiles(snapshot);
  EXPECT_EQ(cached.status().code(), absl::StatusCode::kPermissionDenied) << cached.status();
  EXPECT_THAT(cached.status().message(), HasSubstr(snapshot + "/tokenizer.json"));
}

TEST(ModelFilesTest, FindsTheFilesOfAFolderInMemory) {
  kvstore::MemoryDriver& memory = kvstore::GetMemoryDriver();
  memory.RemovePrefix("mem://hf-files/");
  memory.Put("mem://hf-files/model/model.safetensors", "weights");
  memory.Put("mem://hf-files/model/config.json", "{}");
  memory.Put("mem://hf-files/model/vocab.txt", "a\nb\n");
  memory.Put("mem://hf-files/model/other.txt", "x");
  auto files = FindModelFiles("mem://hf-files/model/");
  EXPECT_THAT(Names(files), ElementsAre("config.json", "vocab.txt"));
  ASSERT_OK(files);
  EXPECT_EQ(files->at(1).path, "mem://hf-files/model/vocab.txt");
  EXPECT_EQ(files->at(1).size, 4u);
}

TEST(ModelFilesTest, TokenizerFilesOfAnyFolder) {
  const std::string dir = MakeHfFolder("tok");
  EXPECT_THAT(Names(FindTokenizerFiles(dir)),
              ElementsAre("tokenizer.json", "tokenizer_config.json"));
  const std::string empty = MakeTempDir("no-tok");
  auto none = FindTokenizerFiles(empty);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr(empty));
  auto file = FindTokenizerFiles(dir + "/README.md");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
}

TEST(ModelFilesTest, ConfigDtypeIsTheOnlyChange) {
  const std::string config =
      "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"dtype\": \"float32\",\n"
      "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n  \"torch_dtype\": \"float32\",\n"
      "  \"name\": \"caf\\u00e9\"\n}\n";
  auto updated = UpdateConfigDtype(config, "config.json", DTypePolicy::kBF16);
  ASSERT_OK(updated);
  EXPECT_EQ(
      *updated,
      "{\n  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n  \"dtype\": \"bfloat16\",\n"
      "  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n  \"torch_dtype\": \"bfloat16\",\n"
      "  \"name\": \"caf\\u00e9\"\n}\n");
  // Unchanged when nothing is cast; torch_dtype added when the config has neither key.
  EXPECT_THAT(UpdateConfigDtype(config, "config.json", DTypePolicy::kKeep), IsOkAndHolds(config));
  EXPECT_THAT(UpdateConfigDtype(R"({"a": 1})", "config.json", DTypePolicy::kF16),
              IsOkAndHolds(std::string("{\n  \"a\": 1,\n  \"torch_dtype\": \"float16\"\n}\n")));
  auto broken = UpdateConfigDtype("[1]", "in/config.json", DTypePolicy::kF16);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(broken.status().message(), HasSubstr("in/config.json"));
}

TEST(ModelFilesTest, ATrainingSaveReadsItsFolderOrTheTrainerCheckpointAboveIt) {
  const std::string root = MakeTempDir("trainer");
  // HF Trainer: checkpoint-500/ holds the config and tokenizer beside global_step500/.
  fs::create_directories(root + "/out/checkpoint-500/global_step500");
  WriteAll(root + "/out/checkpoint-500/config.json", "{}");
  WriteAll(root + "/out/checkpoint-500/tokenizer.json", "{}");
  WriteAll(root + "/out/checkpoint-500/trainer_state.json", "{}");
  std::vector<std::string> looked_in;
  EXPECT_THAT(Names(FindTrainingSaveModelFiles(root + "/out/checkpoint-500/global_step500",
                                               &looked_in)),
              ElementsAre("config.json", "tokenizer.json"));
  EXPECT_THAT(looked_in, ElementsAre(root + "/out/checkpoint-500/global_step500",
                                     root + "/out/checkpoint-500"));
  EXPECT_THAT(Names(FindTrainingSaveModelFiles(root + "/out/checkpoint-500/")),
              ElementsAre("config.json", "tokenizer.json"));
  // A folder above that is no trainer checkpoint folder is not read, nor one two levels up.
  fs::create_directories(root + "/run/global_step7");
  WriteAll(root + "/run/config.json", "{}");
  looked_in.clear();
  EXPECT_THAT(Names(FindTrainingSaveModelFiles(root + "/run/global_step7", &looked_in)),
              IsEmpty());
  EXPECT_THAT(looked_in, ElementsAre(root + "/run/global_step7"));
  fs::create_directories(root + "/checkpoint-9/x/global_step9");
  WriteAll(root + "/checkpoint-9/config.json", "{}");
  EXPECT_THAT(Names(FindTrainingSaveModelFiles(root + "/checkpoint-9/x/global_step9")),
              IsEmpty());
}

TEST(ModelFilesTest, OnlyHuggingFaceOutputsCarryThem) {
  EXPECT_TRUE(OutputIsHuggingFaceModel("safetensors", /*consolidate=*/true));
  EXPECT_TRUE(OutputIsHuggingFaceModel("safetensors", /*consolidate=*/false));
  EXPECT_TRUE(OutputIsHuggingFaceModel("torch", /*consolidate=*/true));
  EXPECT_FALSE(OutputIsHuggingFaceModel("torch", /*consolidate=*/false));
  EXPECT_FALSE(OutputIsHuggingFaceModel("megatron", /*consolidate=*/false));
  EXPECT_FALSE(OutputIsHuggingFaceModel("deepspeed-universal", /*consolidate=*/true));
}

}  // namespace
}  // namespace reshard
