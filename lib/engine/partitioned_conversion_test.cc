#include "lib/engine/partitioned_conversion.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "lib/engine/partition_spec.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;

// A safetensors model of `tensors` f32 tensors of different sizes, so that a small
// max_shard_size gives many output files of unequal sizes.
void WriteModel(const std::string& path, int tensors) {
  std::mt19937 rng(20261123);
  std::vector<SafetensorsTensorEntry> entries;
  std::string data;
  for (int t = 0; t < tensors; ++t) {
    const int64_t rows = 3 + t % 5;
    const int64_t cols = 16 + 8 * (t % 3);
    const uint64_t begin = data.size();
    for (int64_t i = 0; i < rows * cols; ++i) {
      float v = std::uniform_real_distribution<float>(-2, 2)(rng);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
    char name[64];
    std::snprintf(name, sizeof(name), "layers.%02d.weight", t);
    entries.push_back({name, DType::kF32, {rows, cols}, begin, data.size()});
  }
  auto header = EncodeSafetensorsHeader(entries, {{"format", "pt"}});
  ASSERT_TRUE(header.ok()) << header.status();
  WriteAll(path, *header + data);
}

// name -> contents of every file below `dir` (relative names).
std::map<std::string, std::string> Files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    files[fs::relative(entry.path(), dir).string()] = ReadAll(entry.path().string());
  }
  return files;
}

class PartitionedConversionTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("partitioned");
    input_ = root_ + "/model.safetensors";
    WriteModel(input_, 14);
    auto single = RunAnyConversion(Spec(root_ + "/single", 0, 0));
    ASSERT_TRUE(single.ok()) << single.status();
    single_files_ = Files(root_ + "/single");
    ASSERT_GE(single_files_.size(), 8u) << "the model should make several output files";
  }

  ConversionSpec Spec(const std::string& output, int index, int count) {
    ConversionSpec spec;
    spec.input = input_;
    spec.output = output;
    spec.max_shard_size = 600;
    spec.window_bytes = 4096;
    spec.partition_index = index;
    spec.partition_count = count;
    return spec;
  }

  // The published output equals the single-worker run: every data file and the index byte
  // for byte; the manifest's file list equal (its time stamp and split id differ).
  void ExpectSameAsSingle(const std::string& out) {
    std::map<std::string, std::string> files = Files(out);
    ASSERT_EQ(files.size(), single_files_.size());
    for (const auto& [name, contents] : single_files_) {
      ASSERT_TRUE(files.count(name)) << name;
      if (name == kManifestName) {
        auto a = nlohmann::json::parse(contents);
        auto b = nlohmann::json::parse(files[name]);
        EXPECT_EQ(a["files"], b["files"]);
        EXPECT_EQ(a["tensors"], b["tensors"]);
        EXPECT_EQ(a["request"], b["request"]);
        EXPECT_EQ(b["split_id"].get<std::string>().size(), 16u);
        continue;
      }
      EXPECT_TRUE(files[name] == contents) << name << " differs from the single-worker run";
    }
    EXPECT_FALSE(fs::exists(PartitionAreaPathFor(out))) << "the shared area is removed";
  }

  std::string root_, input_;
  std::map<std::string, std::string> single_files_;
};

TEST_F(PartitionedConversionTest, LastWorkerToFinishPublishes) {
  const std::string out = root_ + "/out";
  for (int i = 0; i < 3; ++i) {
    auto result = RunAnyConversion(Spec(out, i, 3));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->partition_index, i);
    EXPECT_EQ(result->partition_count, 3);
    EXPECT_EQ(result->partitions_recorded, i + 1);
    EXPECT_EQ(result->published, i == 2);
    EXPECT_EQ(fs::exists(out), i == 2);
    EXPECT_FALSE(result->files.empty()) << "every partition has files here";
  }
  ExpectSameAsSingle(out);
  // A worker rerun after publishing finds its split's output.
  auto rerun = RunAnyConversion(Spec(out, 0, 3));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->found_published);
  ExpectSameAsSingle(out);
}

TEST_F(PartitionedConversionTest, ConcurrentWorkersPublishExactlyOnce) {
  for (int round = 0; round < 3; ++round) {
    const std::string out = root_ + "/concurrent" + std::to_string(round);
    std::vector<absl::StatusOr<ConversionResult>> results(4, absl::UnknownError("not run"));
    std::vector<std::thread> workers;
    for (int i = 0; i < 4; ++i) {
      workers.emplace_back([&, i] { results[i] = RunAnyConversion(Spec(out, i, 4)); });
    }
    for (std::thread& worker : workers) worker.join();
    int published = 0;
    for (const auto& result : results) {
      ASSERT_TRUE(result.ok()) << result.status();
      published += result->published ? 1 : 0;
    }
    EXPECT_EQ(published, 1) << "round " << round;
    ExpectSameAsSingle(out);
  }
}

TEST_F(PartitionedConversionTest, WorkerOfAnotherSplitIsRefused) {
  const std::string out = root_ + "/out";
  ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 2)).ok());
  auto other_count = RunAnyConversion(Spec(out, 1, 3));
  ASSERT_FALSE(other_count.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(other_count.status())) << other_count.status();
  EXPECT_NE(other_count.status().message().find("another partitioned conversion"),
            std::string::npos)
      << other_count.status();
  ConversionSpec other_dtype = Spec(out, 1, 2);
  other_dtype.dtype = DTypePolicy::kBF16;
  EXPECT_TRUE(absl::IsFailedPrecondition(RunAnyConversion(other_dtype).status()));
  // The right worker still completes the split.
  auto last = RunAnyConversion(Spec(out, 1, 2));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->published);
  ExpectSameAsSingle(out);
}

TEST_F(PartitionedConversionTest, InterruptedWorkerRerunReusesItsCommittedFiles) {
  const std::string out = root_ + "/out";
  std::atomic<bool> cancelled{false};
  int committed = 0;
  RunControl control;
  control.cancelled = &cancelled;
  control.on_file_committed = [&](const WrittenFile&) {
    if (++committed == 2) cancelled.store(true);
  };
  auto interrupted = RunAnyConversion(Spec(out, 1, 2), control);
  ASSERT_FALSE(interrupted.ok());
  EXPECT_TRUE(absl::IsCancelled(interrupted.status())) << interrupted.status();
  const std::string area = PartitionAreaPathFor(out);
  EXPECT_TRUE(fs::exists(area + "/partition-00001-of-00002.journal"));
  EXPECT_FALSE(fs::exists(area + "/partition-00001-of-00002.json"));

  ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 2)).ok());
  EXPECT_FALSE(fs::exists(out)) << "partition 1 has not recorded its files";
  auto rerun = RunAnyConversion(Spec(out, 1, 2));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->published);
  EXPECT_EQ(rerun->verification_failures, 0);
  EXPECT_GT(rerun->data_phases.verify, 0.0) << "the journal's files were checked and reused";
  ExpectSameAsSingle(out);
}

TEST_F(PartitionedConversionTest, CommitRechecksEveryRecordThenPublishes) {
  const std::string out = root_ + "/out";
  const std::string area = PartitionAreaPathFor(out);
  auto missing = CommitPartitionedConversion(out);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();

  ASSERT_TRUE(RunAnyConversion(Spec(out, 1, 2)).ok());
  auto early = CommitPartitionedConversion(out);
  ASSERT_FALSE(early.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
  EXPECT_NE(early.status().message().find("partitions 0 of 2"), std::string::npos)
      << early.status();

  // Another worker holds the claim (as if it were killed while publishing): worker 0 records
  // its files and leaves publishing to it.
  WriteAll(area + "/publish.claim", R"({"partition": 1})");
  auto second = RunAnyConversion(Spec(out, 0, 2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->published);
  EXPECT_EQ(second->partitions_recorded, 2);
  EXPECT_FALSE(fs::exists(out));

  // A data file changed after it was recorded is found by the commit.
  std::string victim;
  for (const auto& entry : fs::directory_iterator(area + "/data")) {
    if (entry.path().extension() == ".safetensors") victim = entry.path().string();
  }
  ASSERT_FALSE(victim.empty());
  std::string bytes = ReadAll(victim);
  bytes[bytes.size() - 1] ^= 0x40;
  WriteAll(victim, bytes);
  auto corrupt = CommitPartitionedConversion(out);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_TRUE(absl::IsDataLoss(corrupt.status())) << corrupt.status();
  EXPECT_NE(corrupt.status().message().find(fs::path(victim).filename().string()),
            std::string::npos)
      << corrupt.status();
  EXPECT_FALSE(fs::exists(out));
  bytes[bytes.size() - 1] ^= 0x40;
  WriteAll(victim, bytes);

  auto committed = CommitPartitionedConversion(out);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->published);
  ExpectSameAsSingle(out);
  auto again = CommitPartitionedConversion(out);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->found_published);
}

TEST_F(PartitionedConversionTest, NonEmptyOutputIsRefusedBeforeWriting) {
  const std::string out = root_ + "/taken";
  fs::create_directories(out);
  WriteAll(out + "/keep.txt", "mine");
  auto result = RunAnyConversion(Spec(out, 0, 2));
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
  EXPECT_FALSE(fs::exists(PartitionAreaPathFor(out)));
  EXPECT_EQ(ReadAll(out + "/keep.txt"), "mine");
}

TEST_F(PartitionedConversionTest, PartitionsOfThePlanCoverEveryFileOnce) {
  ConversionSpec spec = Spec(root_ + "/unused", 0, 0);
  auto planned = PlanConversion(spec);
  ASSERT_TRUE(planned.ok()) << planned.status();
  std::vector<std::string> names;
  std::vector<uint64_t> sizes;
  for (const FilePlan& file : planned->plan.files) {
    names.push_back(file.name);
    sizes.push_back(file.bytes);
  }
  const std::vector<PartitionFiles> partitions = GroupByPartition(names, sizes, 3);
  ASSERT_EQ(partitions.size(), 3u);
  std::vector<std::string> all;
  uint64_t bytes = 0;
  for (const PartitionFiles& partition : partitions) {
    all.insert(all.end(), partition.files.begin(), partition.files.end());
    bytes += partition.bytes;
  }
  EXPECT_EQ(all.size(), planned->plan.files.size());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::unique(all.begin(), all.end()), all.end());
  EXPECT_EQ(bytes, planned->plan.total_bytes);
}

}  // namespace
}  // namespace reshard
