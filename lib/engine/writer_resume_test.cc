// Every writer that writes two or more data files, interrupted and rerun: on posix (a child
// process killed with SIGKILL right after its first data file is recorded, as
// engine_test's RerunAfterAKill* does), on mem:// (stopped by cancelling it there: a killed
// process would take the memory driver's files with it, and a cancel leaves the store as a
// kill would, as in object_store_output_test's MemoryOutputTest), and as a partitioned
// conversion on both (the worker with the most files stopped by a cancel after its first file,
// as partitioned_conversion_test's InterruptedWorker* and StoppedWorker* do).
//
// For each writer and storage: after the interrupted run nothing is under a final name but
// what the protocol allows there (exact listings below); the rerun reuses exactly the one
// recorded file (the same inode on posix, the same generation on mem://) and writes the rest;
// and its output is, file by file and byte for byte, the output of an uninterrupted run.
//
// The inputs are the conformance fixtures (lib/formats/format_fixture.h) of the golden
// conversions (golden_outputs_test.cc), written at run time.

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "lib/engine/conversion.h"
#include "lib/engine/output_commit.h"
#include "lib/engine/partition_area.h"
#include "lib/engine/partition_spec.h"
#include "lib/engine/partitioned_conversion.h"
#include "lib/formats/deepspeed/zero_fixture.h"
#include "lib/formats/format_fixture.h"
#include "lib/io/kvstore/driver_testutil.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/staging_dir.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;

// A writer's conversion: its input, written at run time into an empty folder (returning what
// to give the reader), and the spec's fields besides input and output.
struct WriterCase {
  std::string id;
  std::function<std::string(const std::string& dir)> input;
  std::function<void(ConversionSpec&)> configure;
};

// Consolidation to `format` in files of at most 20 bytes of tensors: the single-file
// safetensors fixture (48 + 6 + 16 bytes) gives three, so that one of two partitions has two.
std::function<void(ConversionSpec&)> SmallShards(const std::string& format) {
  return [format](ConversionSpec& spec) {
    spec.kind = ConversionSpec::Kind::kConsolidate;
    spec.output_format = format;
    spec.max_shard_size = 20;
  };
}

// Partition rules for the safetensors fixture (embed.weight [4, 3], ln.weight [3], steps [2])
// that 3 ranks divide: embed.weight by columns, ln.weight by rows.
constexpr char kThreeWayRules[] =
    R"({"rules": [{"pattern": "^embed\\.weight$", "split_dim": 1},)"
    R"( {"pattern": "^ln\\.weight$", "split_dim": 0}, {"pattern": ".*", "replicate": true}]})";

std::function<void(ConversionSpec&)> Parts(const std::string& format, int parts,
                                           int pipeline_parts = 0,
                                           const std::string& rules_json = "") {
  return [format, parts, pipeline_parts, rules_json](ConversionSpec& spec) {
    spec.kind = ConversionSpec::Kind::kReshard;
    spec.output_format = format;
    spec.parts = parts;
    spec.pipeline_parts = pipeline_parts;
    spec.rules_json = rules_json;
  };
}

std::vector<WriterCase> Writers() {
  const auto st = RegisteredFixtureInput("safetensors", "single-file");
  const auto megatron = RegisteredFixtureInput("megatron");
  return {
      {"safetensors", st, SmallShards("safetensors")},
      {"torch_sharded", st, SmallShards("torch")},
      {"torch_parts3", st, Parts("torch", 3, 0, kThreeWayRules)},
      // A consolidation to olmo-safetensors is one file whatever the shard size: parts.
      {"olmo_safetensors_parts3", st, Parts("olmo-safetensors", 3, 0, kThreeWayRules)},
      {"torch_dcp_parts3", st, Parts("torch-dcp", 3, 0, kThreeWayRules)},
      {"megatron_tp2_pp2", megatron, Parts("megatron", 2, 2)},
      {"megatron_torch_dist_tp2", megatron, Parts("megatron-torch-dist", 2)},
      {"deepspeed_universal",
       [](const std::string& dir) { return WriteZeroFolderWithMoments(dir); },
       [](ConversionSpec& spec) {
         spec.kind = ConversionSpec::Kind::kConsolidate;
         spec.output_format = "deepspeed-universal";
         spec.read.include_optimizer = true;
       }},
  };
}

enum class Store { kPosix, kMemory };

struct ResumeCase {
  WriterCase writer;
  Store store;
  int partitions;  // 0: not partitioned
};

std::string CaseName(const ResumeCase& param) {
  return absl::StrCat(param.writer.id, param.store == Store::kPosix ? "_posix" : "_mem",
                      param.partitions > 0 ? "_partitioned" : "");
}

void PrintTo(const ResumeCase& param, std::ostream* os) { *os << CaseName(param); }

std::vector<ResumeCase> Cases() {
  std::vector<ResumeCase> cases;
  for (const WriterCase& writer : Writers()) {
    for (Store store : {Store::kPosix, Store::kMemory}) {
      for (int partitions : {0, 2}) cases.push_back({writer, store, partitions});
    }
  }
  return cases;
}

uint64_t InodeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_ino);
}

// The manifest without the fields that differ between two runs of the same conversion.
std::string StableManifest(const std::string& text) {
  nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(text);
  for (const char* field : {"created_unix", "split_id", "job_id"}) manifest.erase(field);
  return manifest.dump();
}

class WriterResumeTest : public testing::TestWithParam<ResumeCase> {
 protected:
  void SetUp() override {
    const ResumeCase& param = GetParam();
    root_ = MakeTempDir(absl::StrCat("writer_resume_", param.writer.id));
    fs::create_directories(root_ + "/in");
    spec_.input = param.writer.input(root_ + "/in");
    ASSERT_FALSE(spec_.input.empty());
    param.writer.configure(spec_);
    spec_.threads = 1;  // one file at a time, so that exactly one is recorded when stopped
    spec_.window_bytes = kMinWindowBytes;
    spec_.partition_count = param.partitions;
    if (param.store == Store::kPosix) {
      base_ = root_ + "/outputs";
      fs::create_directories(base_);
    } else {
      base_ = absl::StrCat("mem://writer-resume/", CaseName(param));
    }
    spec_.output = base_ + "/out";
    PlanDataFiles();
  }

  void TearDown() override {
    if (GetParam().store == Store::kMemory) kvstore::GetMemoryDriver().RemovePrefix(base_ + "/");
  }

  // Checks that the conversion writes two data files or more; when partitioned, the partition
  // with the most files is the one stopped (the others run whole).
  void PlanDataFiles() {
    ConversionSpec whole = spec_;
    whole.partition_count = 0;
    absl::StatusOr<PlannedConversion> planned = PlanConversion(whole);
    ASSERT_TRUE(planned.ok()) << planned.status();
    ASSERT_GE(planned->plan.files.size(), 2u) << "the writer should write several data files here";
    if (spec_.partition_count == 0) return;
    const std::vector<PartitionFiles> partitions =
        GroupByPartition(planned->plan, spec_.partition_count);
    for (int i = 0; i < static_cast<int>(partitions.size()); ++i) {
      if (partitions[i].files.size() > partitions[stopped_].files.size()) stopped_ = i;
    }
    ASSERT_GE(partitions[stopped_].files.size(), 2u)
        << "the stopped partition should have files left to write after its first";
  }

  ConversionSpec Worker(int index) const {
    ConversionSpec spec = spec_;
    spec.partition_index = index;
    return spec;
  }

  // Every file below `dir` (a posix folder or a mem:// prefix), relative name -> bytes.
  std::map<std::string, std::string> Tree(const std::string& dir) const {
    std::map<std::string, std::string> files;
    if (GetParam().store == Store::kMemory) {
      return kvstore::ReadTree(kvstore::GetMemoryDriver(), dir);
    }
    if (!fs::exists(dir)) return files;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      files[fs::relative(entry.path(), dir).string()] = ReadAll(entry.path().string());
    }
    return files;
  }

  std::set<std::string> Names(const std::string& dir) const {
    std::set<std::string> names;
    for (const auto& [name, bytes] : Tree(dir)) names.insert(name);
    return names;
  }

  // The published output, its manifest made comparable between runs.
  std::map<std::string, std::string> Output() const {
    std::map<std::string, std::string> files = Tree(spec_.output);
    auto manifest = files.find(kManifestName);
    EXPECT_NE(manifest, files.end()) << "no manifest in " << spec_.output;
    if (manifest != files.end()) manifest->second = StableManifest(manifest->second);
    return files;
  }

  // What identifies the stored bytes of data file `name` of the output: its inode on posix,
  // its generation on mem://. `where` is the folder (or prefix) holding it.
  std::string Identity(const std::string& where, const std::string& name) const {
    const std::string path = absl::StrCat(where, "/", name);
    if (GetParam().store == Store::kMemory) return kvstore::GetMemoryDriver().version(path);
    return absl::StrCat(InodeOf(path));
  }

  // Runs the conversion (every worker, one after the other, when partitioned) without
  // interruption.
  void RunWhole() {
    for (int i = 0; i < std::max(spec_.partition_count, 1); ++i) {
      absl::StatusOr<ConversionResult> result = RunAnyConversion(Worker(i));
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->reused_files, 0);
    }
  }

  // Removes the output and anything of its runs beside it.
  void RemoveOutput() {
    if (GetParam().store == Store::kMemory) {
      kvstore::GetMemoryDriver().RemovePrefix(base_ + "/");
    } else {
      fs::remove_all(base_);
      fs::create_directories(base_);
    }
  }

  // Runs the unpartitioned posix conversion in a child process killed (SIGKILL) right after it
  // recorded its first data file; returns that file's name.
  std::string KilledAfterTheFirstFile() {
    int pipe_fds[2];
    EXPECT_EQ(::pipe(pipe_fds), 0);
    const pid_t child = fork();
    EXPECT_GE(child, 0);
    if (child == 0) {
      ::close(pipe_fds[0]);
      RunControl control;
      control.on_file_committed = [&](const WrittenFile& file) {
        const std::string line = file.name + "\n";
        if (::write(pipe_fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          _exit(2);
        }
        ::raise(SIGKILL);
      };
      RunAnyConversion(spec_, control).IgnoreError();
      _exit(0);
    }
    ::close(pipe_fds[1]);
    std::string name;
    char c;
    while (::read(pipe_fds[0], &c, 1) == 1 && c != '\n') name.push_back(c);
    ::close(pipe_fds[0]);
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    return name;
  }

  // Runs `spec` in this process, cancelled once its first data file is recorded; returns that
  // file's name.
  std::string StoppedAfterTheFirstFile(const ConversionSpec& spec) {
    std::atomic<bool> cancelled{false};
    std::vector<std::string> recorded;
    RunControl control;
    control.cancelled = &cancelled;
    control.on_file_committed = [&](const WrittenFile& file) {
      recorded.push_back(file.name);
      cancelled.store(true);
    };
    absl::StatusOr<ConversionResult> stopped = RunAnyConversion(spec, control);
    EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
    EXPECT_EQ(recorded.size(), 1u);
    return recorded.empty() ? "" : recorded[0];
  }

  std::string root_, base_;
  ConversionSpec spec_;
  int stopped_ = 0;  // the partition stopped, when partitioned
};

TEST_P(WriterResumeTest, RerunReusesTheRecordedFileAndWritesAnUninterruptedRunsBytes) {
  const ResumeCase& param = GetParam();
  const bool posix = param.store == Store::kPosix;
  const std::string out = spec_.output;
  const std::string area = PartitionAreaPathFor(out);
  const std::string staging = StagingPathFor(out);

  // Run 1, and what it may leave: the recorded file and its record, where the protocol keeps
  // them until publishing.
  std::string first;
  std::string kept_in;         // the folder or prefix that holds the recorded file until the rerun
  std::set<std::string> left;  // below base_
  if (param.partitions == 0) {
    first = posix ? KilledAfterTheFirstFile() : StoppedAfterTheFirstFile(spec_);
    ASSERT_FALSE(first.empty());
    if (posix) {
      // The staging folder beside the output, the records one log; the output's name unused.
      kept_in = staging;
      const std::string prefix = fs::path(staging).filename().string() + "/";
      left = {prefix + first, prefix + kFileRecordLogName};
    } else {
      // In place under the in-progress marker, one record per file.
      kept_in = out;
      left = {"out/" + std::string(kInProgressMarkerName), "out/" + first,
              "out/" + FileRecordName(first)};
    }
  } else {
    first = StoppedAfterTheFirstFile(Worker(stopped_));
    ASSERT_FALSE(first.empty());
    const std::string area_name = fs::path(area).filename().string();
    left = {area_name + "/split.json"};
    if (posix) {
      // The area's data/ folder, renamed to the output when published; the worker's records
      // are lines of its own log.
      kept_in = area + "/data";
      left.insert(area_name + "/data/" + first);
      left.insert(area_name + "/data/" +
                  FileRecordLogName(absl::StripSuffix(
                      PartitionRecordName(stopped_, param.partitions), ".json")));
    } else {
      kept_in = out;
      left.insert("out/" + std::string(kInProgressMarkerName));
      left.insert("out/" + first);
      left.insert("out/" + FileRecordName(first));
    }
  }
  EXPECT_EQ(Names(base_), left);
  const std::string identity = Identity(kept_in, first);

  // Run 2: the other workers run whole, then the stopped one is rerun (or the conversion is).
  absl::StatusOr<ConversionResult> rerun;
  if (param.partitions == 0) {
    rerun = RunAnyConversion(spec_);
  } else {
    for (int i = 0; i < param.partitions; ++i) {
      if (i == stopped_) continue;
      absl::StatusOr<ConversionResult> other = RunAnyConversion(Worker(i));
      ASSERT_TRUE(other.ok()) << other.status();
      EXPECT_FALSE(other->published) << "partition " << stopped_ << " is not recorded";
    }
    rerun = RunAnyConversion(Worker(stopped_));
  }
  ASSERT_TRUE(rerun.ok()) << rerun.status();
  EXPECT_TRUE(rerun->published);
  EXPECT_EQ(rerun->reused_files, 1);
  EXPECT_EQ(rerun->verification_failures, 0);
  EXPECT_EQ(Identity(out, first), identity) << first << " was written again";
  const std::map<std::string, std::string> resumed = Output();
  // Nothing of the runs is left beside the output.
  std::set<std::string> published;
  for (const auto& [name, bytes] : resumed) published.insert("out/" + name);
  EXPECT_EQ(Names(base_), published);

  RemoveOutput();
  RunWhole();
  if (HasFatalFailure()) return;
  const std::map<std::string, std::string> uninterrupted = Output();
  std::set<std::string> names, uninterrupted_names;
  for (const auto& [name, bytes] : resumed) names.insert(name);
  for (const auto& [name, bytes] : uninterrupted) uninterrupted_names.insert(name);
  ASSERT_EQ(names, uninterrupted_names);
  for (const auto& [name, bytes] : uninterrupted) {
    EXPECT_TRUE(resumed.at(name) == bytes) << name << " differs from an uninterrupted run's";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryWriter, WriterResumeTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<ResumeCase>& info) {
                           return CaseName(info.param);
                         });

}  // namespace
}  // namespace reshard
