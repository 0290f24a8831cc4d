#include "lib/engine/partitioned_conversion.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/engine/output_commit.h"
#include "lib/engine/partition_spec.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/io/kvstore/driver_testutil.h"
#include "lib/io/kvstore/memory_driver.h"
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

// The first line of a /proc file.
std::string ProcLine(const std::string& path) {
  const std::string text = ReadAll(path);
  return std::string(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
}

// Field 22 of /proc/PID/stat: when the process started.
std::string StartTimeOf(pid_t pid) {
  const std::string stat = ProcLine(absl::StrCat("/proc/", pid, "/stat"));
  std::vector<std::string> fields =
      absl::StrSplit(stat.substr(stat.rfind(')') + 1), ' ', absl::SkipEmpty());
  return fields.at(19);
}

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// A worker's claim on partition `index` of `count` as another process would have written it,
// its lease ending at `expires`.
std::string ClaimOf(pid_t pid, const std::string& host, const std::string& start_time, int index,
                    int count, absl::Time expires = absl::Now() + absl::Hours(1)) {
  char pid_ns[128] = {};
  EXPECT_GT(readlink("/proc/self/ns/pid", pid_ns, sizeof(pid_ns) - 1), 0);
  return nlohmann::json{{"pid", pid},
                        {"host", host},
                        {"boot_id", ProcLine("/proc/sys/kernel/random/boot_id")},
                        {"pid_ns", pid_ns},
                        {"start_time", start_time},
                        {"partition", index},
                        {"partitions", count},
                        {"since", "2026-01-01T00:00:00Z"},
                        {"token", "00000000000000aa"},
                        {"heartbeat", 7},
                        {"expires", absl::FormatTime(absl::RFC3339_full, expires,
                                                     absl::UTCTimeZone())}}
      .dump();
}

// The pid of a process that has exited and been reaped.
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  return child;
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

// The files of the records folder of the posix data area `area`.
std::set<std::string> RecordsFolderFiles(const std::string& area) {
  std::set<std::string> files;
  for (const auto& entry :
       fs::directory_iterator(absl::StrCat(area, "/data/", kFileRecordsFolder))) {
    files.insert(entry.path().filename().string());
  }
  return files;
}

// The records log of worker `index` of `count` in the posix data area `area`.
std::string WorkerLogPath(const std::string& area, int index, int count) {
  return absl::StrCat(area, "/data/",
                      FileRecordLogName(absl::StrFormat("partition-%05d-of-%05d", index, count)));
}

// The data files that worker's log records, line by line (a line that is no record: "?").
std::vector<std::string> LoggedNames(const std::string& area, int index, int count) {
  std::vector<std::string> names;
  for (absl::string_view line :
       absl::StrSplit(ReadAll(WorkerLogPath(area, index, count)), '\n', absl::SkipEmpty())) {
    const std::optional<FileRecord> record = ParseFileRecord(line);
    names.push_back(record.has_value() ? record->name : "?");
  }
  return names;
}

uint64_t InodeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_ino);
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

  // Runs worker `index` of `count`, which completes the set: it publishes the same output as
  // the single-worker run.
  void ExpectPublishes(const std::string& out, int index, int count) {
    auto result = RunAnyConversion(Spec(out, index, count));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(result->published);
    ExpectSameAsSingle(out);
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
  std::vector<std::string> finished;
  control.on_file_committed = [&](const WrittenFile& file) {
    finished.push_back(file.name);
    if (++committed == 2) cancelled.store(true);
  };
  auto interrupted = RunAnyConversion(Spec(out, 1, 2), control);
  ASSERT_FALSE(interrupted.ok());
  EXPECT_TRUE(absl::IsCancelled(interrupted.status())) << interrupted.status();
  const std::string area = PartitionAreaPathFor(out);
  // Each finished file has its output_commit record (output_commit.h), a line of the worker's
  // log, and no journal.
  ASSERT_FALSE(finished.empty());
  EXPECT_EQ(RecordsFolderFiles(area),
            std::set<std::string>{"records-partition-00001-of-00002.jsonl"});
  EXPECT_EQ(LoggedNames(area, 1, 2), finished);
  EXPECT_FALSE(fs::exists(area + "/partition-00001-of-00002.journal"));
  EXPECT_FALSE(fs::exists(area + "/partition-00001-of-00002.json"));

  ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 2)).ok());
  EXPECT_FALSE(fs::exists(out)) << "partition 1 has not recorded its files";
  auto rerun = RunAnyConversion(Spec(out, 1, 2));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->published);
  EXPECT_EQ(rerun->verification_failures, 0);
  EXPECT_GT(rerun->data_phases.verify, 0.0) << "the recorded files were checked and reused";
  ExpectSameAsSingle(out);
}

// A worker killed (SIGKILL) after three files: its log holds their three records, the records
// folder nothing else. The last line torn (as a crash can leave it), the rerun keeps exactly
// the first two files (the same inodes are published) and writes the third again.
TEST_F(PartitionedConversionTest, RerunAfterAKillReusesTheLoggedFilesAndRewritesATornLastLine) {
  const std::string out = root_ + "/out";
  ConversionSpec spec = Spec(out, 1, 2);
  spec.threads = 1;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int committed = 0;
    RunControl control;
    control.on_file_committed = [&committed](const WrittenFile&) {
      if (++committed == 3) ::raise(SIGKILL);
    };
    RunAnyConversion(spec, control).IgnoreError();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;

  const std::string area = PartitionAreaPathFor(out);
  EXPECT_EQ(RecordsFolderFiles(area),
            std::set<std::string>{"records-partition-00001-of-00002.jsonl"});
  const std::vector<std::string> logged = LoggedNames(area, 1, 2);
  ASSERT_EQ(logged.size(), 3u);
  // The files the killed worker finished are exactly those its log names.
  std::set<std::string> finished;
  for (const auto& entry : fs::directory_iterator(area + "/data")) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && !absl::EndsWith(name, ".partial")) finished.insert(name);
  }
  EXPECT_EQ(finished, std::set<std::string>(logged.begin(), logged.end()));
  // Links that keep the killed run's files, so that a file written again cannot get a freed
  // inode back.
  fs::create_directory(root_ + "/killed");
  std::map<std::string, uint64_t> inodes;
  for (const std::string& name : logged) {
    fs::create_hard_link(area + "/data/" + name, root_ + "/killed/" + name);
    inodes[name] = InodeOf(area + "/data/" + name);
  }
  const std::string log = WorkerLogPath(area, 1, 2);
  const std::string text = ReadAll(log);
  const size_t last = text.rfind('\n', text.size() - 2) + 1;
  WriteAll(log, text.substr(0, last + (text.size() - last) / 2));
  ASSERT_EQ(LoggedNames(area, 1, 2), (std::vector<std::string>{logged[0], logged[1], "?"}));

  ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 2)).ok());
  auto rerun = RunAnyConversion(spec);
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->published);
  EXPECT_EQ(rerun->reused_files, 2);
  EXPECT_EQ(rerun->verification_failures, 0);
  EXPECT_EQ(InodeOf(out + "/" + logged[0]), inodes[logged[0]]) << logged[0];
  EXPECT_EQ(InodeOf(out + "/" + logged[1]), inodes[logged[1]]) << logged[1];
  EXPECT_NE(InodeOf(out + "/" + logged[2]), inodes[logged[2]]) << logged[2] << " was kept";
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
  const std::vector<PartitionFiles> partitions = GroupByPartition(planned->plan, 3);
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

// The data files partition `index` of `count` recorded, from its record in the area of `out`.
std::vector<std::string> RecordedFiles(const std::string& out, int index, int count) {
  char name[64];
  std::snprintf(name, sizeof(name), "/partition-%05d-of-%05d.json", index, count);
  auto record = nlohmann::json::parse(ReadAll(PartitionAreaPathFor(out) + name));
  std::vector<std::string> files;
  for (const auto& file : record["files"]) files.push_back(file["name"]);
  return files;
}

TEST_F(PartitionedConversionTest, LastWorkerRehashesOtherPartitionsFilesBeforePublishing) {
  const std::string out = root_ + "/out";
  const std::string area = PartitionAreaPathFor(out);
  ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 3)).ok());
  ASSERT_TRUE(RunAnyConversion(Spec(out, 1, 3)).ok());
  const std::vector<std::string> recorded = RecordedFiles(out, 0, 3);
  ASSERT_FALSE(recorded.empty());
  const std::string victim = area + "/data/" + recorded[0];
  std::string bytes = ReadAll(victim);
  bytes[bytes.size() - 3] ^= 0x01;  // in the last tensor's data: same size, other contents
  WriteAll(victim, bytes);

  auto last = RunAnyConversion(Spec(out, 2, 3));
  ASSERT_FALSE(last.ok());
  EXPECT_TRUE(absl::IsDataLoss(last.status())) << last.status();
  EXPECT_NE(
      last.status().message().find(victim + " no longer has the XXH3-64 partition 0 recorded"),
      std::string::npos)
      << last.status();
  EXPECT_NE(last.status().message().find("rerun partition 0 of 3 (--partition 0/3)"),
            std::string::npos)
      << last.status();
  EXPECT_FALSE(fs::exists(out)) << "nothing is published";
  EXPECT_FALSE(fs::exists(area + "/publish.claim")) << "a rerun may publish";
  EXPECT_FALSE(fs::exists(area + "/partition-00002-of-00003.claim")) << "released on failure";

  // Rerunning the partition named rewrites the damaged file and publishes.
  ExpectPublishes(out, 0, 3);
}

TEST_F(PartitionedConversionTest, TamperedRecordIsRefusedAndRepairedByItsRerun) {
  using Json = nlohmann::json;
  const std::map<std::string, std::function<std::string(Json)>> tamperings = {
      {"malformed", [](Json) { return std::string("{\"split_id\": "); }},
      {"a number for the split id",
       [](Json record) {
         record["split_id"] = 5;
         return record.dump();
       }},
      {"outside the plan",
       [](Json record) {
         record["files"].push_back(
             {{"name", "extra.safetensors"}, {"bytes", 8}, {"xxh3_64", "0000000000000001"}});
         return record.dump();
       }},
      {"another size",
       [](Json record) {
         record["files"][0]["bytes"] = record["files"][0]["bytes"].get<uint64_t>() + 1;
         return record.dump();
       }},
      {"another split",
       [](Json record) {
         record["split_id"] = "0123456789abcdef";
         return record.dump();
       }},
      {"listed twice", [](Json record) {
         record["files"].push_back(record["files"][0]);
         return record.dump();
       }}};
  int round = 0;
  for (const auto& [what, tamper] : tamperings) {
    SCOPED_TRACE(what);
    const std::string out = root_ + "/record" + std::to_string(round++);
    const std::string record = PartitionAreaPathFor(out) + "/partition-00000-of-00003.json";
    ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 3)).ok());
    ASSERT_TRUE(RunAnyConversion(Spec(out, 1, 3)).ok());
    WriteAll(record, tamper(Json::parse(ReadAll(record))));

    auto last = RunAnyConversion(Spec(out, 2, 3));
    ASSERT_FALSE(last.ok());
    EXPECT_TRUE(absl::IsDataLoss(last.status())) << last.status();
    EXPECT_NE(last.status().message().find(record), std::string::npos) << last.status();
    EXPECT_NE(last.status().message().find("rerun partition 0 of 3"), std::string::npos)
        << last.status();
    EXPECT_FALSE(fs::exists(out)) << "nothing is published";

    ExpectPublishes(out, 0, 3);
  }
}

TEST_F(PartitionedConversionTest, DamagedFileRecordIsWrittenAgainByItsRerun) {
  const std::string out = root_ + "/out";
  std::atomic<bool> cancelled{false};
  RunControl control;
  control.cancelled = &cancelled;
  control.on_file_committed = [&](const WrittenFile&) { cancelled.store(true); };
  ASSERT_TRUE(absl::IsCancelled(RunAnyConversion(Spec(out, 1, 2), control).status()));
  const std::string log = WorkerLogPath(PartitionAreaPathFor(out), 1, 2);
  ASSERT_TRUE(fs::exists(log));
  WriteAll(log, "{\"files\": [");
  ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 2)).ok());

  ExpectPublishes(out, 1, 2);
}

TEST_F(PartitionedConversionTest, SecondWorkerOfAnIndexStopsAtOnce) {
  const std::string out = root_ + "/out";
  const std::string claim = PartitionAreaPathFor(out) + "/partition-00000-of-00002.claim";
  absl::Notification first_writing, second_done;
  RunControl hold;
  hold.on_file_committed = [&](const WrittenFile&) {
    if (!first_writing.HasBeenNotified()) first_writing.Notify();
    second_done.WaitForNotificationWithTimeout(absl::Seconds(60));
  };
  absl::StatusOr<ConversionResult> first = absl::UnknownError("not run");
  std::thread worker([&] { first = RunAnyConversion(Spec(out, 0, 2), hold); });
  ASSERT_TRUE(first_writing.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(fs::exists(claim));

  auto second = RunAnyConversion(Spec(out, 0, 2));
  second_done.Notify();
  worker.join();
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_NE(second.status().message().find(
                absl::StrCat("partition 0 of 2 is being written by another worker (pid ", getpid(),
                             " on host ", HostName(), ", since ")),
            std::string::npos)
      << second.status();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(fs::exists(claim)) << "released when the worker finished";

  ExpectPublishes(out, 1, 2);
}

TEST_F(PartitionedConversionTest, ClaimOfAGoneWorkerIsTakenOver) {
  const std::string out = root_ + "/out";
  const std::string area = PartitionAreaPathFor(out);
  fs::create_directories(area);
  // Partition 0's worker died on this host; the lease of partition 1's, on another host,
  // ended an hour ago.
  WriteAll(area + "/partition-00000-of-00002.claim", ClaimOf(DeadPid(), HostName(), "1", 0, 2));
  WriteAll(area + "/partition-00001-of-00002.claim",
           ClaimOf(1, "elsewhere.example", "1", 1, 2, absl::Now() - absl::Hours(1)));

  auto first = RunAnyConversion(Spec(out, 0, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(fs::exists(area + "/partition-00000-of-00002.claim"));
  ExpectPublishes(out, 1, 2);
}

TEST_F(PartitionedConversionTest, ConcurrentTakeoversOfAStaleClaimHaveOneWinner) {
  const std::string out = root_ + "/out";
  const std::string area = PartitionAreaPathFor(out);
  fs::create_directories(area);
  WriteAll(area + "/partition-00000-of-00002.claim", ClaimOf(DeadPid(), HostName(), "1", 0, 2));
  // The worker that wins holds on until every other has returned: were two to win, neither
  // would see that and both would finish (after the bounded wait).
  constexpr int kTakers = 4;
  std::atomic<int> returned{0};
  absl::Notification others_returned;
  RunControl hold;
  hold.on_file_committed = [&](const WrittenFile&) {
    others_returned.WaitForNotificationWithTimeout(absl::Seconds(30));
  };
  std::vector<absl::StatusOr<ConversionResult>> results(kTakers, absl::UnknownError("not run"));
  std::vector<std::thread> takers;
  for (int t = 0; t < kTakers; ++t) {
    takers.emplace_back([&, t] {
      results[t] = RunAnyConversion(Spec(out, 0, 2), hold);
      if (!results[t].ok() && ++returned == kTakers - 1) others_returned.Notify();
    });
  }
  for (std::thread& taker : takers) taker.join();
  int won = 0;
  for (const auto& result : results) {
    if (result.ok()) {
      ++won;
    } else {
      EXPECT_TRUE(absl::IsFailedPrecondition(result.status())) << result.status();
      EXPECT_NE(result.status().message().find("partition 0 of 2 is being written by another"),
                std::string::npos)
          << result.status();
    }
  }
  EXPECT_EQ(won, 1);
  EXPECT_TRUE(others_returned.HasBeenNotified());
  ExpectPublishes(out, 1, 2);
}

TEST_F(PartitionedConversionTest, ClaimOfALiveWorkerIsRefused) {
  const std::string out = root_ + "/out";
  const std::string area = PartitionAreaPathFor(out);
  fs::create_directories(area);
  const pid_t parent = getppid();
  const std::string live = area + "/partition-00000-of-00002.claim";
  WriteAll(live, ClaimOf(parent, HostName(), StartTimeOf(parent), 0, 2));
  auto refused = RunAnyConversion(Spec(out, 0, 2));
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find(
                absl::StrCat("partition 0 of 2 is being written by another worker (pid ", parent,
                             " on host ", HostName(), ", since 2026-01-01T00:00:00Z")),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(fs::exists(live)) << "a live worker's claim stays";

  // A worker on another host whose lease has not ended is live too.
  WriteAll(area + "/partition-00001-of-00002.claim", ClaimOf(1, "elsewhere.example", "1", 1, 2));
  auto other_host = RunAnyConversion(Spec(out, 1, 2));
  ASSERT_FALSE(other_host.ok());
  EXPECT_NE(other_host.status().message().find(
                "partition 1 of 2 is being written by another worker (pid 1 on host "
                "elsewhere.example, since 2026-01-01T00:00:00Z"),
            std::string::npos)
      << other_host.status();
}

// name -> contents of every file below `root` of the memory driver (mem://...).
std::map<std::string, std::string> MemoryFiles(const std::string& root) {
  return kvstore::ReadTree(kvstore::GetMemoryDriver(), root);
}

// Partitioned conversions into mem:// (the memory driver: no folders, no rename): the data
// files are written in place and the manifest is the commit mark.
class MemoryPartitionsTest : public PartitionedConversionTest {
 protected:
  void SetUp() override {
    PartitionedConversionTest::SetUp();
    const std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    base_ = absl::StrCat("mem://partitions/", name);
    auto single = RunAnyConversion(Spec(base_ + "/single", 0, 0));
    ASSERT_TRUE(single.ok()) << single.status();
    memory_single_ = MemoryFiles(base_ + "/single");
    ASSERT_EQ(memory_single_.size(), single_files_.size());
  }

  // The published output equals the unpartitioned run into mem://: every data file and the
  // index byte for byte, the manifest's files, tensors and request; the area is gone.
  void ExpectSameAsMemorySingle(const std::string& out) {
    std::map<std::string, std::string> files = MemoryFiles(out);
    std::set<std::string> names, single_names;
    for (const auto& [name, contents] : files) names.insert(name);
    for (const auto& [name, contents] : memory_single_) single_names.insert(name);
    ASSERT_EQ(names, single_names);
    for (const auto& [name, contents] : memory_single_) {
      if (name == kManifestName) {
        auto a = nlohmann::json::parse(contents);
        auto b = nlohmann::json::parse(files[name]);
        EXPECT_EQ(a["files"], b["files"]);
        EXPECT_EQ(a["tensors"], b["tensors"]);
        EXPECT_EQ(b["split_id"].get<std::string>().size(), 16u);
        continue;
      }
      EXPECT_TRUE(files[name] == contents) << name << " differs from the single-worker run";
    }
    EXPECT_TRUE(MemoryFiles(PartitionAreaPathFor(out)).empty()) << "the shared area is removed";
  }

  std::string base_;
  std::map<std::string, std::string> memory_single_;
};

TEST_F(MemoryPartitionsTest, ThreeWorkersPublishTheUnpartitionedOutput) {
  const std::string out = base_ + "/out";
  EXPECT_EQ(PartitionAreaPathFor(out), base_ + "/.out.reshard-partitions");
  for (int i = 0; i < 3; ++i) {
    auto result = RunAnyConversion(Spec(out, i, 3));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->output, out);
    EXPECT_EQ(result->partitions_recorded, i + 1);
    EXPECT_EQ(result->published, i == 2);
    EXPECT_EQ(MemoryFiles(out).count(kManifestName), i == 2 ? 1u : 0u);
    EXPECT_EQ(MemoryFiles(out).count(kInProgressMarkerName), i == 2 ? 0u : 1u);
  }
  ExpectSameAsMemorySingle(out);
  auto rerun = RunAnyConversion(Spec(out, 0, 3));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->found_published);
  ExpectSameAsMemorySingle(out);
}

TEST_F(MemoryPartitionsTest, ConcurrentWorkersPublishExactlyOnce) {
  const std::string out = base_ + "/out";
  std::vector<absl::StatusOr<ConversionResult>> results(3, absl::UnknownError("not run"));
  std::vector<std::thread> workers;
  for (int i = 0; i < 3; ++i) {
    workers.emplace_back([&, i] { results[i] = RunAnyConversion(Spec(out, i, 3)); });
  }
  for (std::thread& worker : workers) worker.join();
  int published = 0;
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    published += result->published ? 1 : 0;
  }
  EXPECT_EQ(published, 1);
  ExpectSameAsMemorySingle(out);
}

// A worker stopped after committing two files (the memory driver's files die with a killed
// process, so it is cancelled there, which leaves the store as a kill would) and rerun keeps
// exactly those two files (same versions) and writes the rest.
TEST_F(MemoryPartitionsTest, StoppedWorkerRerunReusesExactlyTheRecordedFiles) {
  const std::string out = base_ + "/out";
  std::atomic<bool> cancelled{false};
  RunControl control;
  control.cancelled = &cancelled;
  std::vector<std::string> finished;
  control.on_file_committed = [&](const WrittenFile& file) {
    finished.push_back(file.name);
    if (finished.size() == 2) cancelled.store(true);
  };
  ConversionSpec stopped_spec = Spec(out, 1, 3);
  stopped_spec.threads = 1;
  auto stopped = RunAnyConversion(stopped_spec, control);
  ASSERT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  ASSERT_EQ(finished.size(), 2u);
  kvstore::MemoryDriver& driver = kvstore::GetMemoryDriver();
  std::map<std::string, std::string> versions;
  for (const std::string& name : finished) {
    versions[name] = driver.version(absl::StrCat(out, "/", name));
    EXPECT_FALSE(versions[name].empty()) << name;
    EXPECT_TRUE(MemoryFiles(out).count(FileRecordName(name))) << name;
  }
  EXPECT_TRUE(MemoryFiles(PartitionAreaPathFor(out)).count("partition-00001-of-00003.claim") == 0)
      << "released when the worker stopped";

  ASSERT_TRUE(RunAnyConversion(Spec(out, 0, 3)).ok());
  ASSERT_TRUE(RunAnyConversion(Spec(out, 2, 3)).ok());
  auto rerun = RunAnyConversion(Spec(out, 1, 3));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->published);
  EXPECT_EQ(rerun->reused_files, 2);
  EXPECT_EQ(rerun->verification_failures, 0);
  for (const auto& [name, version] : versions) {
    EXPECT_EQ(driver.version(absl::StrCat(out, "/", name)), version) << name << " was rewritten";
  }
  ExpectSameAsMemorySingle(out);
}

// A file replaced after its worker recorded it is refused at publishing (nothing published,
// the partition to rerun named), and the rerun of that partition writes it again and
// publishes.
TEST_F(MemoryPartitionsTest, ReplacedFileIsRefusedAtPublishAndRewrittenByItsRerun) {
  const std::string out = base_ + "/out";
  auto first = RunAnyConversion(Spec(out, 0, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->files.empty());
  const std::string replaced = absl::StrCat(out, "/", first->files.front().name);
  kvstore::GetMemoryDriver().Put(replaced, MemoryFiles(out)[first->files.front().name]);
  auto last = RunAnyConversion(Spec(out, 1, 2));
  ASSERT_EQ(last.status().code(), absl::StatusCode::kDataLoss) << last.status();
  EXPECT_NE(
      last.status().message().find(absl::StrCat(replaced, " is not the file partition 0 recorded")),
      std::string::npos)
      << last.status();
  EXPECT_NE(last.status().message().find("rerun partition 0 of 2 (--partition 0/2)"),
            std::string::npos)
      << last.status();
  EXPECT_EQ(MemoryFiles(out).count(kManifestName), 0u);
  auto rerun = RunAnyConversion(Spec(out, 0, 2));
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->published);
  EXPECT_EQ(rerun->reused_files, static_cast<int>(first->files.size()) - 1);
  ExpectSameAsMemorySingle(out);
}

// An input inside the output is refused before anything is written, even when overwriting:
// publishing in place deletes what the plan does not write.
TEST_F(MemoryPartitionsTest, InputInsideTheOutputIsRefused) {
  const std::string out = base_ + "/holding";
  kvstore::GetMemoryDriver().Put(out + "/model.safetensors", ReadAll(input_));
  ConversionSpec spec = Spec(out, 0, 2);
  spec.input = out + "/model.safetensors";
  spec.overwrite = true;
  auto refused = RunAnyConversion(spec);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find(
                absl::StrCat("output ", out, " contains the input ", spec.input)),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(MemoryFiles(out).size(), 1u);
  EXPECT_TRUE(MemoryFiles(PartitionAreaPathFor(out)).empty());
}

// Overwriting an earlier output: its manifest goes before any data file is written, and what
// it held beyond this plan's files is removed when the new one is published.
TEST_F(MemoryPartitionsTest, OverwriteReplacesAnEarlierOutput) {
  const std::string out = base_ + "/out";
  kvstore::GetMemoryDriver().Put(out + "/stray.bin", "old");
  kvstore::GetMemoryDriver().Put(absl::StrCat(out, "/", kManifestName), "{}");
  auto refused = RunAnyConversion(Spec(out, 0, 2));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  for (int i = 0; i < 2; ++i) {
    ConversionSpec spec = Spec(out, i, 2);
    spec.overwrite = true;
    auto result = RunAnyConversion(spec);
    ASSERT_TRUE(result.ok()) << result.status();
    if (i == 0) EXPECT_EQ(MemoryFiles(out).count(kManifestName), 0u);
  }
  ExpectSameAsMemorySingle(out);
}

}  // namespace
}  // namespace reshard
