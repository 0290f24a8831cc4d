// The commit protocol of a conversion's output, on the storage layer (lib/io/kvstore/driver.h):
// the pieces every output shares, whichever driver holds it.
//
// An output is an area of a driver: a folder (posix) or a key prefix (S3, memory) whose files
// are named relative to its root. The manifest `reshard-manifest.json` is the commit mark: an
// area with a manifest holds a finished output, one without holds none. A run:
//
//   1. Lists the area before anything is read. An area with files is refused
//      (FailedPrecondition) unless `overwrite` is set, or unless it holds the leftovers of an
//      unfinished run: the in-progress marker `reshard-in-progress.json` and no manifest.
//   2. Plans the conversion (nothing written yet; a bad input changes nothing) and computes
//      its plan id (OutputPlanId).
//   3. Reads the records of finished data files an earlier run left (OutputArea::
//      FindReusable), then deletes the old manifest first (from here on nothing in the area is
//      taken for a finished output), writes the marker, deletes every other old file except
//      the reused data files and their records, and drops writes a killed run left unfinished
//      (Driver::AbortUnfinishedWrites: S3's multipart uploads).
//   4. Streams every data file through the driver's Writer (OutputAreaSink): a file appears
//      under its name only once whole. Right after it is committed, and before the executor
//      counts it done, its record is written: {plan_id, name, bytes, xxh3_64, generation},
//      as a file of its own, `.reshard-progress/<file>.json` (S3, memory), or as a line
//      appended to a log, FileRecordLog: `.reshard-progress/records.jsonl` in RunConversion's
//      staging folder, `.reshard-progress/records-partition-<i>-of-<n>.jsonl` per worker in a
//      partitioned run's posix data area.
//   5. Writes the companion files (index), then the manifest, which lists every file with its
//      size and XXH3-64.
//   6. Removes the records and the marker (best effort: beside a manifest they mean nothing).
//
// How the files reach their final names is the driver's. On stores without rename (S3,
// memory; lib/engine/object_store_output.h) the area is the output itself and the steps run as
// above. On posix (RunConversion, lib/engine/conversion.h) the area is the staging folder
// beside the output (lib/io/staging_dir.h), whose name and lock mark it as reshard's instead
// of a marker file: step 1 is the output folder's check, step 3 takes a staging folder a
// killed run left over (everything but the reused files and their records is removed), the
// records go before the manifest is written, and one rename publishes the folder after step
// 5, so the output's own name never holds a partial output. A run killed before 5 leaves no
// manifest and no index; before 3 it changes nothing. Rerunning the same command takes the
// unfinished area over and reuses the data files the killed run finished.
//
// Reuse. Every finished data file gets a small record, written once. On S3 and memory it is a
// file of its own (S3 has no append, and rewriting one object per finished file would
// serialize the workers and cost O(files^2) bytes; a partitioned run's publisher in place
// reads each file's record by name). On posix the records are lines of an append-only file,
// FileRecordLog: a file created, renamed and later deleted per data file is filesystem work on
// every file (docs/benchmarks.md, "Output commit records"); an append is one write. Each
// partitioned worker appends to a log of its own, so no two processes share an append.
// FindReusable reads every log and the records of their own, so an area either form left is
// taken over; a log is read line by line in chunks (kFileRecordLogChunkBytes), whatever its
// length, and a line longer than a record (kMaxFileRecordBytes) is skipped. The record's
// XXH3-64 is the one the executor computed while
// streaming the file, its generation the driver's (PathStat::generation: S3's ETag, the memory
// driver's version, posix "<inode>:<mtime ns>:<size>"). `plan_id` is the XXH3-64 of what
// decides the bytes: the request as ConversionRequestJson gives it without overwrite and
// update_latest, reshard's version, the planned data files with their sizes, and the sources
// with their sizes and versions. A rerun keeps a data file only when its record is of this
// plan, names a planned file of the recorded size, and a Stat of the file now shows the
// recorded size and generation. Anything else is written again, never an error: records of
// another plan or damaged ones are deleted with the other old files, a record whose file is
// gone or was replaced counts in verification_failures, and a file whose record was never
// written (killed between the two) is written again. A kept file goes into the manifest with
// its recorded size and XXH3-64, so the finished output and its manifest are those of an
// uninterrupted run. On posix a generation cannot see a rewrite in place that keeps the size
// within the filesystem's timestamp granularity, so the executor also hashes each kept file
// and compares its XXH3-64 with the record before reusing it (ExecutorOptions::
// completed_files into a folder); on S3 and memory the generation is trusted.
//
// Durability. A record is written without waiting for the disk (Driver::WriteFileUnsynced:
// on posix neither the record nor its folder is fsynced, two fsyncs that would cost about what
// the data file's own commit does on many small files; S3 and memory write it as any file;
// FileRecordLog appends with neither fsync nor writeback started).
// Correctness depends only on what a record that exists says, never on its surviving a crash
// of the machine:
//   - its data file is durable before the record is written: the file's commit fsyncs it,
//     renames it into place and fsyncs its folder (posix), or is a completed upload (S3), so a
//     record found after a crash names a file that was whole on disk;
//   - a record a crash lost, emptied or cut short (a file, or a line of the log) is missing or
//     does not parse, and its file is written again (FindReusable skips it and Prepare deletes it),
//     as is a file whose record gives another size or generation, or on posix another XXH3-64 than
//     the file hashes to now: a damaged record costs one file's work, never a wrong output or an
//     error;
//   - no commit mark relies on the records: on posix they are removed before the manifest is
//     written (the manifest's fsync of its folder makes the removal durable), and a partitioned
//     worker's own record, written durably, is what publishing checks.
// A kill -9 loses no record (the kernel has it); a power cut may lose the records written
// shortly before it, and a rerun writes their files again.
//
// Not detected: an input rewritten in place with the same file sizes between the runs on a
// driver without versions (posix; the plan id cannot see its bytes), and two runs writing one
// S3 or memory area at once (no lock: the second deletes the first's files, and the first then
// fails or its output is incomplete without a manifest).

#ifndef RESHARD_LIB_ENGINE_OUTPUT_COMMIT_H_
#define RESHARD_LIB_ENGINE_OUTPUT_COMMIT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/exec/executor_options.h"
#include "lib/io/directory.h"
#include "lib/io/kvstore/driver.h"
#include "lib/plan/layout.h"

namespace reshard {

// The manifest, the commit mark of every output.
inline constexpr char kManifestName[] = "reshard-manifest.json";
// The file that marks an area as being written by a run of reshard.
inline constexpr char kInProgressMarkerName[] = "reshard-in-progress.json";
// The folder of the records of finished data files while a run writes an area.
inline constexpr char kFileRecordsFolder[] = ".reshard-progress";
// A record is a few hundred bytes; anything larger among the records is not one.
inline constexpr uint64_t kMaxFileRecordBytes = 64 << 10;
// The file of RunConversion's FileRecordLog, relative to the area's root. Its name cannot be a
// data file's record (FileRecordName ends in ".json").
inline constexpr char kFileRecordLogName[] = ".reshard-progress/records.jsonl";
// A log is read in chunks of this size, whatever its length.
inline constexpr size_t kFileRecordLogChunkBytes = 64 << 10;

// The log of one writer of an area shared by several (a partitioned worker, `writer` such as
// "partition-00001-of-00003"): ".reshard-progress/records-<writer>.jsonl".
std::string FileRecordLogName(absl::string_view writer);
// Whether `name` (relative to the area's root) is a FileRecordLog: kFileRecordLogName or a
// writer's.
bool IsFileRecordLog(absl::string_view name);

// The identity of the plan (see above), as 16 hex digits. `request_json` is the request as
// ConversionRequestJson gives it (lib/engine/conversion.h), of the spec with the output as
// every run spells it (no trailing '/').
std::string OutputPlanId(const std::string& request_json, const CopyPlan& plan);

// The record of one finished data file.
struct FileRecord {
  std::string plan_id;
  std::string name;  // relative to the area's root
  uint64_t bytes = 0;
  uint64_t xxh3_64 = 0;
  std::string generation;  // PathStat::generation when the file was committed
};

// The record as its file holds it (JSON), and back: nullopt for text that is not a complete
// record (damaged, foreign, another version of reshard's records).
std::string FileRecordJson(const FileRecord& record);
std::optional<FileRecord> ParseFileRecord(absl::string_view text);
// The record as a line of FileRecordLog (compact JSON and '\n').
std::string FileRecordLine(const FileRecord& record);

// The name of the record of data file `name`, relative to the area's root.
std::string FileRecordName(absl::string_view name);

// What an area holds.
struct AreaContents {
  // Every file below the root (in sub-folders too), named relative to it, with its size.
  std::vector<kvstore::FileEntry> files;
  bool manifest = false;
  bool marker = false;
};

// The data files a rerun keeps (see above).
struct ReusableFiles {
  // Data file -> its recorded XXH3-64 (ExecutorOptions::completed_files).
  std::map<std::string, uint64_t> files;
  // Names relative to the root that preparing the area keeps: those data files and their
  // records of their own (not the log: FileRecordLog::Create writes `records` into a new one).
  std::set<std::string> kept;
  // The records of those data files, by name.
  std::vector<FileRecord> records;
  // Records of this plan whose file is gone or was replaced (written again).
  int mismatches = 0;
};

// An output area: `root` (a path of `driver`, no trailing '/') and the files below it. Every
// error names the file's path. Thread safe (const).
class OutputArea {
 public:
  OutputArea(const kvstore::Driver& driver, std::string root);

  const kvstore::Driver& driver() const { return *driver_; }
  const std::string& root() const { return root_; }
  // The path of `name` (relative to the root) for the driver.
  std::string PathOf(absl::string_view name) const;

  // Every file below the root; empty contents when the root does not exist. Errors are
  // annotated "checking the output ROOT".
  absl::StatusOr<AreaContents> List() const;

  // Writes `contents` as file `name`, replacing what is there.
  absl::Status Put(absl::string_view name, absl::string_view contents) const;

  // Writes the marker (who writes the area: tool, version, input, host, pid, start time).
  absl::Status WriteMarker(const std::string& input) const;

  // Writes the record of a finished data file, once that file is durable; the record itself
  // is not made durable (see "Durability" above).
  absl::Status WriteRecord(const FileRecord& record) const;

  // The record of data file `file`, just committed below the root by a writer that gives no
  // generation with its commit (posix), with the generation Stat gives it now.
  absl::StatusOr<FileRecord> CommittedRecord(const std::string& plan_id,
                                             const WrittenFile& file) const;
  // Writes that record as a file of its own.
  absl::Status RecordCommitted(const std::string& plan_id, const WrittenFile& file) const;

  // Reads the records among `contents` (files of their own and the lines of every log; of
  // several records of one data file a log's last line counts) and keeps each data file of
  // plan `plan_id` that `plan` has, of the recorded size, whose Stat now shows the recorded
  // size and generation. Errors (reading a record or a Stat failing other than NotFound) name
  // the file.
  absl::StatusOr<ReusableFiles> FindReusable(const AreaContents& contents, const CopyPlan& plan,
                                             const std::string& plan_id) const;

  // Step 3 (see above): the old manifest, then the marker, then every file of `contents` but
  // `kept`, then unfinished writes below the root.
  absl::Status Prepare(const AreaContents& contents, const std::set<std::string>& kept,
                       const std::string& input) const;

  // Step 6: removes the records and the marker (best effort).
  void RemoveRecordsAndMarker() const;

 private:
  // Calls `on_line` with each line of log `name` below the root, without its '\n', reading it
  // in chunks: a line longer than kMaxFileRecordBytes is skipped, and a log that is gone or
  // shrinks while it is read ends there. Errors name the log and the byte offset.
  absl::Status ForEachLogLine(const std::string& name,
                              const std::function<void(absl::string_view)>& on_line) const;
  // The text of file `name` below the root; nullopt when it is gone, a folder or larger than
  // `max_bytes`. Errors name the file.
  absl::StatusOr<std::optional<std::string>> ReadSmallFile(const std::string& name,
                                                           uint64_t max_bytes) const;

  const kvstore::Driver* driver_;
  std::string root_;
};

// The records of a posix area's finished data files as lines appended to one file of the
// records folder (kFileRecordLogName, or a writer's FileRecordLogName), in the order the files
// were finished; nothing is fsynced (see "Durability" above). Not thread safe: the executor's
// on_file_committed is serialized.
class FileRecordLog {
 public:
  // Creates log `name` (relative to the area's root, inside kFileRecordsFolder) in the area's
  // folder `area`, replacing one there, holding `records`: the records of the data files a
  // rerun keeps (ReusableFiles::records).
  static absl::StatusOr<FileRecordLog> Create(const Directory& area, absl::string_view name,
                                              const std::vector<FileRecord>& records);

  FileRecordLog(FileRecordLog&& other) noexcept;
  FileRecordLog& operator=(FileRecordLog&& other) = delete;
  FileRecordLog(const FileRecordLog&) = delete;
  FileRecordLog& operator=(const FileRecordLog&) = delete;
  ~FileRecordLog();

  // Appends the record of a data file once that file is durable. Errors name the log.
  absl::Status Append(const FileRecord& record);

 private:
  FileRecordLog(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_ = -1;
  std::string path_;
};

// Writes the data files of an execution into an area through the driver's Writer, and after
// each commit the file's record. Open is called from worker threads at once; Record from the
// executor's on_file_committed (serialized).
class OutputAreaSink final : public OutputSink {
 public:
  // `metadata` is kept with every data file where the storage can (WriteOptions::metadata).
  // `cancelled` (may be null) ends a test fault point's wait. `writer_budget` is each file
  // writer's memory budget (WriteOptions::memory_budget; 0: the driver's choice).
  OutputAreaSink(const OutputArea& area, std::string plan_id,
                 std::map<std::string, std::string> metadata, const std::atomic<bool>* cancelled,
                 uint64_t writer_budget = 0);

  absl::StatusOr<std::unique_ptr<ByteWriter>> Open(const std::string& name,
                                                   uint64_t bytes) override;

  // Writes the record of `file` when this run committed it (a reused file has its record
  // already). Errors name the file.
  absl::Status Record(const WrittenFile& file);

 private:
  class FileWriter;
  // Called by a FileWriter once its file is committed, with the generation Commit gave.
  void Committed(const std::string& name, std::string generation);

  const OutputArea& area_;
  const std::string plan_id_;
  const std::map<std::string, std::string> metadata_;
  const std::atomic<bool>* const cancelled_;
  const uint64_t writer_budget_;
  std::atomic<int> committed_{0};
  absl::Mutex mu_;
  // Data file -> the generation its commit gave (empty when the driver gives none with it).
  std::map<std::string, std::string> generations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_OUTPUT_COMMIT_H_
