// The commit protocol's pieces (records, reuse, preparing and cleaning an area) on the memory
// and posix drivers.

#include "lib/engine/output_commit.h"

#include <sys/syscall.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "lib/io/directory.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/kvstore/posix_driver.h"
#include "lib/testing/test_files.h"

// What this process makes durable, and when: while `observing` is set, every fsync(2) and
// every renameat(2) (which AtomicFile publishes files with) is logged with the path it names.
// These definitions take the place of the C library's for the whole test binary; they make
// the same system calls.
namespace {

struct SyscallLog {
  std::atomic<bool> observing{false};
  absl::Mutex mu;
  std::vector<std::string> events ABSL_GUARDED_BY(mu);

  void Add(std::string event) {
    absl::MutexLock lock(&mu);
    events.push_back(std::move(event));
  }
};

SyscallLog& Log() {
  static SyscallLog* log = new SyscallLog;
  return *log;
}

// The path descriptor `fd` is open on.
std::string FdPath(int fd) {
  char target[4096];
  const ssize_t n =
      ::readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), target, sizeof(target) - 1);
  return n < 0 ? absl::StrCat("fd ", fd) : std::string(target, static_cast<size_t>(n));
}

}  // namespace

extern "C" int fsync(int fd) {
  if (Log().observing.load()) Log().Add(absl::StrCat("fsync ", FdPath(fd)));
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

extern "C" int renameat(int old_dir, const char* old_name, int new_dir,
                        const char* new_name) noexcept {
  const int result =
      static_cast<int>(::syscall(SYS_renameat2, old_dir, old_name, new_dir, new_name, 0));
  if (result == 0 && Log().observing.load()) {
    Log().Add(absl::StrCat("rename ", FdPath(new_dir), "/", new_name));
  }
  return result;
}

namespace reshard {
namespace {

enum class Storage { kMemory, kPosix };

std::atomic<int> area_counter{0};

class OutputCommitTest : public ::testing::TestWithParam<Storage> {
 protected:
  void SetUp() override {
    if (GetParam() == Storage::kMemory) {
      driver_ = &kvstore::GetMemoryDriver();
      root_ = absl::StrCat("mem://commit-test/area", area_counter.fetch_add(1));
    } else {
      driver_ = &kvstore::GetPosixDriver();
      root_ = MakeTempDir("area");
    }
    area_ = std::make_unique<OutputArea>(*driver_, root_);
    plan_.files.push_back(FilePlan{"a.bin", {}, {}, 1000});
    plan_.files.push_back(FilePlan{"sub/b.bin", {}, {}, 2000});
  }

  // Writes data file `name` through the sink and records it, as an execution does.
  void WriteAndRecord(OutputAreaSink& sink, const std::string& name, const std::string& data) {
    absl::StatusOr<std::unique_ptr<ByteWriter>> writer = sink.Open(name, data.size());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Write(data).ok());
    ASSERT_TRUE((*writer)->Close().ok());
    const absl::Status recorded =
        sink.Record(WrittenFile{name, data.size(), XXH3_64bits(data.data(), data.size()), 0});
    ASSERT_TRUE(recorded.ok()) << recorded;
  }

  // Replaces file `name` with `data` the way the storage's other writers would.
  void Replace(const std::string& name, const std::string& data) {
    absl::StatusOr<std::string> written = driver_->WriteFile(area_->PathOf(name), data);
    ASSERT_TRUE(written.ok()) << written.status();
  }

  AreaContents List() {
    absl::StatusOr<AreaContents> contents = area_->List();
    EXPECT_TRUE(contents.ok()) << contents.status();
    return contents.ok() ? *contents : AreaContents();
  }

  std::set<std::string> Names() {
    std::set<std::string> names;
    for (const kvstore::FileEntry& file : List().files) names.insert(file.name);
    return names;
  }

  ReusableFiles Reusable(const std::string& plan_id) {
    absl::StatusOr<ReusableFiles> reuse = area_->FindReusable(List(), plan_, plan_id);
    EXPECT_TRUE(reuse.ok()) << reuse.status();
    return reuse.ok() ? *reuse : ReusableFiles();
  }

  const kvstore::Driver* driver_ = nullptr;
  std::string root_;
  std::unique_ptr<OutputArea> area_;
  CopyPlan plan_;
  const std::string a_ = std::string(1000, 'a');
  const std::string b_ = std::string(2000, 'b');
};

TEST_P(OutputCommitTest, RecordRoundTripsAndDamagedRecordsAreNone) {
  const FileRecord record{"0123456789abcdef", "sub/b.bin", 2000, 0xfeedULL, "\"v3\""};
  const std::optional<FileRecord> parsed = ParseFileRecord(FileRecordJson(record));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->plan_id, record.plan_id);
  EXPECT_EQ(parsed->name, record.name);
  EXPECT_EQ(parsed->bytes, record.bytes);
  EXPECT_EQ(parsed->xxh3_64, record.xxh3_64);
  EXPECT_EQ(parsed->generation, record.generation);
  EXPECT_FALSE(ParseFileRecord("{\"tool\": \"reshard\"").has_value());
  EXPECT_FALSE(ParseFileRecord("{\"tool\":\"reshard\",\"plan_id\":\"p\",\"name\":\"a\","
                               "\"bytes\":1,\"xxh3_64\":\"00\"}")
                   .has_value());  // no generation
}

TEST_P(OutputCommitTest, RecordedFilesOfThisPlanAreReused) {
  OutputAreaSink sink(*area_, "plan1", {}, nullptr);
  WriteAndRecord(sink, "a.bin", a_);
  WriteAndRecord(sink, "sub/b.bin", b_);
  EXPECT_EQ(Names(), (std::set<std::string>{"a.bin", "sub/b.bin", ".reshard-progress/a.bin.json",
                                            ".reshard-progress/sub/b.bin.json"}));
  const ReusableFiles reuse = Reusable("plan1");
  EXPECT_EQ(reuse.files, (std::map<std::string, uint64_t>{
                             {"a.bin", XXH3_64bits(a_.data(), a_.size())},
                             {"sub/b.bin", XXH3_64bits(b_.data(), b_.size())}}));
  EXPECT_EQ(reuse.kept.size(), 4u);
  EXPECT_EQ(reuse.mismatches, 0);
  EXPECT_TRUE(Reusable("plan2").files.empty());
}

TEST_P(OutputCommitTest, ReplacedOrMissingFilesAreMismatches) {
  OutputAreaSink sink(*area_, "plan1", {}, nullptr);
  WriteAndRecord(sink, "a.bin", a_);
  WriteAndRecord(sink, "sub/b.bin", b_);
  // Same size, another generation (posix: renamed over, another inode).
  Replace("a.bin", std::string(1000, 'x'));
  ASSERT_TRUE(driver_->Delete(area_->PathOf("sub/b.bin")).ok());
  const ReusableFiles reuse = Reusable("plan1");
  EXPECT_TRUE(reuse.files.empty());
  EXPECT_TRUE(reuse.kept.empty());
  EXPECT_EQ(reuse.mismatches, 2);
}

TEST_P(OutputCommitTest, PrepareKeepsOnlyReusedFilesAndCleanupLeavesTheOutput) {
  OutputAreaSink sink(*area_, "plan1", {}, nullptr);
  WriteAndRecord(sink, "a.bin", a_);
  Replace("stale.bin", "old");
  Replace(kManifestName, "{}");
  const AreaContents before = List();
  EXPECT_TRUE(before.manifest);
  EXPECT_FALSE(before.marker);
  const ReusableFiles reuse = Reusable("plan1");
  ASSERT_TRUE(area_->Prepare(before, reuse.kept, "/in").ok());
  const AreaContents prepared = List();
  EXPECT_FALSE(prepared.manifest);
  EXPECT_TRUE(prepared.marker);
  EXPECT_EQ(Names(), (std::set<std::string>{"a.bin", ".reshard-progress/a.bin.json",
                                            kInProgressMarkerName}));
  WriteAndRecord(sink, "sub/b.bin", b_);
  ASSERT_TRUE(area_->Put(kManifestName, "{}").ok());
  area_->RemoveRecordsAndMarker();
  EXPECT_EQ(Names(), (std::set<std::string>{"a.bin", "sub/b.bin", kManifestName}));
}

TEST_P(OutputCommitTest, MissingAreaListsEmpty) {
  OutputArea missing(*driver_, root_ + "/nothing-here");
  absl::StatusOr<AreaContents> contents = missing.List();
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_TRUE(contents->files.empty());
}

// What a crash of the machine can leave of a record that was never fsynced: nothing, an
// empty file, a file cut short or one of zeros; and a record that names another size. None
// keeps its file, none is an error or a mismatch, and preparing the area deletes each record
// and its file, which the run then writes again.
TEST_P(OutputCommitTest, TornRecordsKeepNothingAndAreNoError) {
  OutputAreaSink sink(*area_, "plan1", {}, nullptr);
  WriteAndRecord(sink, "a.bin", a_);
  WriteAndRecord(sink, "sub/b.bin", b_);
  const absl::StatusOr<kvstore::PathStat> a = driver_->Stat(area_->PathOf("a.bin"));
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string whole =
      FileRecordJson(FileRecord{"plan1", "a.bin", 1000, XXH3_64bits(a_.data(), 1000),
                                a->generation});
  const std::string wrong_size =
      FileRecordJson(FileRecord{"plan1", "a.bin", 999, XXH3_64bits(a_.data(), 1000),
                                a->generation});
  for (const std::string& torn :
       {std::string(), whole.substr(0, whole.size() / 2), std::string(whole.size(), '\0'),
        wrong_size}) {
    SCOPED_TRACE(testing::PrintToString(torn));
    Replace(FileRecordName("a.bin"), torn);
    const AreaContents contents = List();
    absl::StatusOr<ReusableFiles> reuse = area_->FindReusable(contents, plan_, "plan1");
    ASSERT_TRUE(reuse.ok()) << reuse.status();
    EXPECT_EQ(reuse->files, (std::map<std::string, uint64_t>{
                                {"sub/b.bin", XXH3_64bits(b_.data(), b_.size())}}));
    EXPECT_EQ(reuse->kept, (std::set<std::string>{"sub/b.bin", FileRecordName("sub/b.bin")}));
    EXPECT_EQ(reuse->mismatches, 0);
  }
  const AreaContents contents = List();
  const ReusableFiles reuse = Reusable("plan1");
  ASSERT_TRUE(area_->Prepare(contents, reuse.kept, "/in").ok());
  EXPECT_EQ(Names(), (std::set<std::string>{"sub/b.bin", FileRecordName("sub/b.bin"),
                                            kInProgressMarkerName}));
}

INSTANTIATE_TEST_SUITE_P(Drivers, OutputCommitTest,
                         ::testing::Values(Storage::kMemory, Storage::kPosix),
                         [](const ::testing::TestParamInfo<Storage>& info) {
                           return info.param == Storage::kMemory ? "Memory" : "Posix";
                         });

// On posix a record is written after its data file is durable (the file fsynced, renamed into
// place, its folder fsynced) and is itself published with no fsync: of the record's file or
// of the records folder.
TEST(OutputCommitPosixTest, RecordFollowsItsDurableFileWithoutAnFsyncOfItsOwn) {
  const std::string root = std::filesystem::canonical(MakeTempDir("synced")).string();
  const kvstore::Driver& driver = kvstore::GetPosixDriver();
  const OutputArea area(driver, root);
  Log().observing.store(true);
  for (const std::string name : {"a.bin", "sub/b.bin"}) {
    const std::string data(1000, 'x');
    absl::StatusOr<std::unique_ptr<kvstore::Writer>> writer =
        driver.Write(area.PathOf(name), kvstore::WriteOptions());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append(data).ok());
    ASSERT_TRUE((*writer)->Commit().ok());
    const absl::Status recorded = area.RecordCommitted(
        "plan1", WrittenFile{name, data.size(), XXH3_64bits(data.data(), data.size()), 0});
    ASSERT_TRUE(recorded.ok()) << recorded;
  }
  Log().observing.store(false);
  absl::MutexLock lock(&Log().mu);
  EXPECT_EQ(Log().events, (std::vector<std::string>{
                              absl::StrCat("fsync ", root, "/a.bin.partial"),
                              absl::StrCat("rename ", root, "/a.bin"),
                              absl::StrCat("fsync ", root),
                              absl::StrCat("rename ", root, "/.reshard-progress/a.bin.json"),
                              absl::StrCat("fsync ", root, "/sub/b.bin.partial"),
                              absl::StrCat("rename ", root, "/sub/b.bin"),
                              absl::StrCat("fsync ", root, "/sub"),
                              absl::StrCat("rename ", root, "/.reshard-progress/sub/b.bin.json"),
                          }));
}

// The records of a staging folder are lines of one file: appending them creates, renames and
// fsyncs nothing; a rerun keeps the files whose last line matches them, and the log is not
// among the names preparing the area keeps (the run writes it anew from `records`).
TEST(OutputCommitPosixTest, LoggedRecordsAppendNothingButALineAndTheLastLineCounts) {
  const std::string root = std::filesystem::canonical(MakeTempDir("logged")).string();
  const kvstore::Driver& driver = kvstore::GetPosixDriver();
  const OutputArea area(driver, root);
  const std::string a(1000, 'a');
  const std::string b(2000, 'b');
  ASSERT_TRUE(driver.WriteFile(area.PathOf("a.bin"), a).ok());
  ASSERT_TRUE(driver.WriteFile(area.PathOf("sub/b.bin"), b).ok());
  const WrittenFile written_a{"a.bin", a.size(), XXH3_64bits(a.data(), a.size()), 0};
  const WrittenFile written_b{"sub/b.bin", b.size(), XXH3_64bits(b.data(), b.size()), 0};
  absl::StatusOr<FileRecord> record_a = area.CommittedRecord("plan1", written_a);
  absl::StatusOr<FileRecord> record_b = area.CommittedRecord("plan1", written_b);
  ASSERT_TRUE(record_a.ok()) << record_a.status();
  ASSERT_TRUE(record_b.ok()) << record_b.status();
  FileRecord stale_b = *record_b;
  stale_b.generation = "1:2:2000";
  FileRecord other_plan = *record_a;
  other_plan.plan_id = "plan0";

  absl::StatusOr<Directory> dir = Directory::Open(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  {
    {
      absl::MutexLock lock(&Log().mu);
      Log().events.clear();
    }
    Log().observing.store(true);
    absl::StatusOr<FileRecordLog> log = FileRecordLog::Create(*dir, kFileRecordLogName, {other_plan});
    ASSERT_TRUE(log.ok()) << log.status();
    for (const FileRecord& record : {*record_a, *record_b, stale_b}) {
      const absl::Status appended = log->Append(record);
      ASSERT_TRUE(appended.ok()) << appended;
    }
    Log().observing.store(false);
  }
  {
    absl::MutexLock lock(&Log().mu);
    EXPECT_EQ(Log().events, std::vector<std::string>());
  }
  const std::string log_path = area.PathOf(kFileRecordLogName);
  EXPECT_EQ(ReadAll(log_path),
            absl::StrCat(FileRecordLine(other_plan), FileRecordLine(*record_a),
                         FileRecordLine(*record_b), FileRecordLine(stale_b)));

  CopyPlan plan;
  plan.files.push_back(FilePlan{"a.bin", {}, {}, 1000});
  plan.files.push_back(FilePlan{"sub/b.bin", {}, {}, 2000});
  absl::StatusOr<AreaContents> contents = area.List();
  ASSERT_TRUE(contents.ok()) << contents.status();
  absl::StatusOr<ReusableFiles> reuse = area.FindReusable(*contents, plan, "plan1");
  ASSERT_TRUE(reuse.ok()) << reuse.status();
  EXPECT_EQ(reuse->files, (std::map<std::string, uint64_t>{{"a.bin", written_a.xxh3_64}}));
  EXPECT_EQ(reuse->kept, std::set<std::string>{"a.bin"});
  ASSERT_EQ(reuse->records.size(), 1u);
  EXPECT_EQ(FileRecordLine(reuse->records[0]), FileRecordLine(*record_a));
  EXPECT_EQ(reuse->mismatches, 1);  // sub/b.bin: its last line names another generation
}

// A log of ~60,000 records (past 16 MiB), a line longer than any record among them and the
// records of this plan at its end, the last one without its '\n': read to the end, every record
// of the plan counts, and the long line costs nothing but itself.
TEST(OutputCommitPosixTest, LogOfAnyLengthIsReadLineByLine) {
  const std::string root = std::filesystem::canonical(MakeTempDir("long_log")).string();
  const kvstore::Driver& driver = kvstore::GetPosixDriver();
  const OutputArea area(driver, root);
  ASSERT_TRUE(driver.WriteFile(area.PathOf("a.bin"), "a").ok());
  ASSERT_TRUE(driver.WriteFile(area.PathOf("b.bin"), "bb").ok());
  absl::StatusOr<FileRecord> record_a =
      area.CommittedRecord("plan1", WrittenFile{"a.bin", 1, XXH3_64bits("a", 1), 0});
  absl::StatusOr<FileRecord> record_b =
      area.CommittedRecord("plan1", WrittenFile{"b.bin", 2, XXH3_64bits("bb", 2), 0});
  ASSERT_TRUE(record_a.ok()) << record_a.status();
  ASSERT_TRUE(record_b.ok()) << record_b.status();

  std::string log;
  FileRecord other{"plan0", "", 1, 7, "1:2:1"};
  for (int i = 0; log.size() <= (16u << 20); ++i) {
    other.name = absl::StrCat(std::string(200, 'x'), i, ".bin");
    log += FileRecordLine(other);
  }
  log += std::string(kMaxFileRecordBytes + 10, '{') + "\n";
  log += FileRecordLine(*record_a);
  const std::string last = FileRecordLine(*record_b);
  log += last.substr(0, last.size() - 1);
  ASSERT_GT(log.size(), 16u << 20);
  std::filesystem::create_directory(area.PathOf(kFileRecordsFolder));
  WriteAll(area.PathOf(kFileRecordLogName), log);

  CopyPlan plan;
  plan.files.push_back(FilePlan{"a.bin", {}, {}, 1});
  plan.files.push_back(FilePlan{"b.bin", {}, {}, 2});
  absl::StatusOr<AreaContents> contents = area.List();
  ASSERT_TRUE(contents.ok()) << contents.status();
  absl::StatusOr<ReusableFiles> reuse = area.FindReusable(*contents, plan, "plan1");
  ASSERT_TRUE(reuse.ok()) << reuse.status();
  EXPECT_EQ(reuse->files, (std::map<std::string, uint64_t>{{"a.bin", XXH3_64bits("a", 1)},
                                                           {"b.bin", XXH3_64bits("bb", 2)}}));
  EXPECT_EQ(reuse->mismatches, 0);
}

}  // namespace
}  // namespace reshard
