#include "lib/engine/partitioned_conversion.h"

#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/core/test_faults.h"
#include "lib/engine/object_store_output.h"
#include "lib/engine/output_commit.h"
#include "lib/engine/partition_area.h"
#include "lib/engine/partition_spec.h"
#include "lib/engine/spec_codec.h"
#include "lib/exec/executor.h"
#include "lib/exec/resume.h"
#include "lib/io/atomic_file.h"
#include "lib/io/directory.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/path_confinement.h"
#include "lib/io/staging_dir.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Whether the data files are written in place in the output (stores without rename: S3,
// memory), under its in-progress marker, or assembled in the area's data/ folder and renamed
// into place (posix). This and the publish step are all that differ between drivers.
bool WritesInPlace(const PartitionArea& area) { return !area.driver->has_folders(); }

// The area where the data files and their records (output_commit.h) are written.
OutputArea DataArea(const PartitionArea& area) {
  return OutputArea(*area.driver, WritesInPlace(area) ? area.output : area.PathOf(kAreaDataName));
}

// The split that published the output, from its manifest; empty when none.
std::string PublishedSplitId(const PartitionArea& area) {
  absl::StatusOr<OrderedJson> manifest =
      ReadJsonFile(*area.driver, absl::StrCat(area.output, "/", kManifestName));
  if (!manifest.ok()) return "";
  return FieldOr<std::string>(*manifest, "split_id", "");
}

// OK when the output may be written by the workers: absent or empty (posix), or, in place,
// empty or holding an unfinished run.
absl::Status CheckPartitionedOutputUsable(const ConversionSpec& spec, const PartitionArea& area) {
  if (WritesInPlace(area)) return CheckObjectStoreOutputUsable(spec);
  return CheckOutputDirUsable(spec.output);
}

absl::Status Cancelled(const RunControl& control) {
  if (control.cancelled != nullptr && control.cancelled->load()) {
    return absl::CancelledError("conversion cancelled");
  }
  return absl::OkStatus();
}

// Checks that data file `file`, partition `owner`'s, is the one its record lists (`recorded`
// XXH3-64). `hashed`: the XXH3-64 this worker computed writing it, if it did. Posix rehashes
// every other worker's file (a generation cannot see every rewrite in place); stores with
// versions compare its generation with its per-file record's.
absl::Status CheckRecordedFile(const PartitionArea& area, const Split& split, const FilePlan& file,
                               int owner, uint64_t recorded, const uint64_t* hashed) {
  const OutputArea data = DataArea(area);
  const std::string path = data.PathOf(file.name);
  const std::string tail = absl::StrCat("; nothing was published; ", RerunHint(owner, split.count));
  absl::StatusOr<kvstore::PathStat> stat = area.driver->Stat(path);
  if (!stat.ok() || stat->is_folder || !stat->special.empty() || stat->size != file.bytes) {
    return absl::DataLossError(absl::StrCat(path, " is missing or not the ", file.bytes,
                                            " bytes partition ", owner, " recorded", tail));
  }
  if (hashed != nullptr) {
    if (*hashed == recorded) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(area.PathOf(PartitionRecordName(owner, split.count)),
                                            " no longer has the XXH3-64 of ", file.name,
                                            " this worker wrote", tail));
  }
  if (WritesInPlace(area)) {
    absl::StatusOr<std::pair<std::string, kvstore::PathStat>> text =
        ReadSmallFile(*area.driver, data.PathOf(FileRecordName(file.name)));
    const std::optional<FileRecord> record =
        text.ok() ? ParseFileRecord(text->first) : std::nullopt;
    if (!record || record->plan_id != split.id || record->xxh3_64 != recorded ||
        record->generation != stat->generation) {
      return absl::DataLossError(absl::StrCat(
          path, " is not the file partition ", owner, " recorded (generation ", stat->generation,
          ", its record ", data.PathOf(FileRecordName(file.name)),
          record ? absl::StrCat(" says ", record->generation) : " is missing or damaged", ")", tail,
          ", which publishes"));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const uint64_t hash, HashFile(*area.driver, path));
  if (hash == recorded) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(path, " no longer has the XXH3-64 partition ", owner,
                                          " recorded (", Hex16(recorded), ", now ", Hex16(hash),
                                          ")", tail, ", which publishes"));
}

// The records log of worker `index` of `count` in a posix data area (output_commit.h): each
// worker appends to its own.
std::string WorkerLogName(int index, int count) {
  return FileRecordLogName(absl::StripSuffix(PartitionRecordName(index, count), ".json"));
}

// Posix: writes the index and the manifest into data/ and renames data/ to the output.
absl::Status PublishByRename(const PartitionArea& area, const Split& split,
                             const ConversionSpec& spec, const PlannedConversion& planned,
                             const RunControl& control, ConversionResult& result) {
  ASSIGN_OR_RETURN(Directory parent, OpenExistingFolder(area.parent));
  const std::string area_name = std::filesystem::path(area.root).filename().string();
  ASSIGN_OR_RETURN(Directory dir, parent.OpenChild(area_name));
  ASSIGN_OR_RETURN(Directory data, dir.OpenChild(kAreaDataName));
  // The records of finished data files (output_commit.h) have served once every partition's
  // record is in.
  RETURN_IF_ERROR(data.RemoveTree(kFileRecordsFolder),
                  "removing the records of finished data files before publishing");
  RETURN_IF_ERROR(data.Sync());  // the data files of every worker
  RETURN_IF_ERROR(WriteCompanionsAndManifest(data, spec, planned, control, split.id, result));
  RETURN_IF_ERROR(data.Sync());
  // As StagingDir::Publish: rename(2) replaces an absent or empty folder atomically; a
  // non-empty one is moved aside first when overwriting.
  const std::string& name = area.name;
  std::string replaced;
  if (parent.StatChild(name).ok() && spec.overwrite) {
    replaced = absl::StrCat(".", name, ".reshard-replaced");
    RETURN_IF_ERROR(parent.RemoveTree(replaced));
    if (::renameat(parent.fd(), name.c_str(), parent.fd(), replaced.c_str()) != 0) {
      return ErrnoToStatus(
          errno, absl::StrCat("moving the output ", result.output, " aside to overwrite it"));
    }
  }
  if (::renameat(dir.fd(), kAreaDataName, parent.fd(), name.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("output folder ", result.output,
                       " is not empty; nothing was published (rerun with "
                       "overwriting allowed, or remove it, then run `reshardctl commit ",
                       result.output, "`)"));
    }
    return ErrnoToStatus(errno, absl::StrCat("renaming ", data.path(), " to ", result.output));
  }
  RETURN_IF_ERROR(parent.Sync());
  if (!replaced.empty()) parent.RemoveTree(replaced).IgnoreError();
  return absl::OkStatus();
}

// Stores without rename: the data files are in place; removes what an overwritten earlier
// output left besides them, then writes the index and the manifest, the commit mark.
absl::Status PublishInPlace(const PartitionArea& area, const Split& split,
                            const ConversionSpec& spec, const PlannedConversion& planned,
                            const RunControl& control, ConversionResult& result) {
  const OutputArea data = DataArea(area);
  ASSIGN_OR_RETURN(const AreaContents contents, data.List());
  std::set<std::string> planned_names;
  for (const FilePlan& file : planned.plan.files) planned_names.insert(file.name);
  for (const kvstore::FileEntry& file : contents.files) {
    if (planned_names.count(file.name) || file.name == kInProgressMarkerName ||
        absl::StartsWith(file.name, absl::StrCat(kFileRecordsFolder, "/"))) {
      continue;
    }
    RETURN_IF_ERROR(area.driver->Delete(data.PathOf(file.name)),
                    "removing what the overwritten output left");
  }
  auto put = [&data](const std::string& name, absl::string_view bytes) {
    return data.Put(name, bytes);
  };
  RETURN_IF_ERROR(WriteCompanions(planned, put, result));
  TestFaultPoint("before-publish", control.cancelled);
  RETURN_IF_ERROR(Cancelled(control));
  const std::string manifest = BuildManifest(spec, planned, result.files, control.job_id, split.id);
  RETURN_IF_ERROR(put(kManifestName, manifest));
  result.bytes_written += manifest.size();
  data.RemoveRecordsAndMarker();
  return absl::OkStatus();
}

// Everything after every worker has recorded its files: checks every record against the plan
// (only the files the plan deals to its partition, each once, at its planned size) and every
// data file against its record (CheckRecordedFile), publishes, and removes the area. `hashed`
// are files the caller hashed while writing them in this run (name -> XXH3-64).
absl::StatusOr<ConversionResult> Publish(const PartitionArea& area, const Split& split,
                                         const ConversionSpec& spec,
                                         const PlannedConversion& planned,
                                         const RunControl& control,
                                         const std::map<std::string, uint64_t>& hashed) {
  const Clock::time_point start = Clock::now();
  std::vector<uint64_t> bytes;
  std::map<std::string, size_t> planned_index;
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    bytes.push_back(planned.plan.files[f].bytes);
    planned_index[planned.plan.files[f].name] = f;
  }
  const std::vector<int> assignment = AssignPartitions(bytes, split.count);
  std::vector<RecordedFiles> records(static_cast<size_t>(split.count));
  for (int i = 0; i < split.count; ++i) {
    const std::string where = area.PathOf(PartitionRecordName(i, split.count));
    ASSIGN_OR_RETURN(records[i], ReadPartitionRecord(area, split, i),
                     absl::StrCat("partition ", i, "'s record"));
    for (const auto& [name, facts] : records[i]) {
      auto f = planned_index.find(name);
      if (f == planned_index.end() || assignment[f->second] != i ||
          facts.first != planned.plan.files[f->second].bytes) {
        return absl::DataLossError(
            absl::StrCat(where, " lists ", name, " (", facts.first, " bytes), which is not ",
                         f == planned_index.end() || assignment[f->second] != i
                             ? absl::StrCat("a file the plan in ", area.PathOf(kSplitName),
                                            " deals to partition ", i)
                             : absl::StrCat("the ", planned.plan.files[f->second].bytes,
                                            " bytes the plan gives it"),
                         "; nothing was published; ", RerunHint(i, split.count)));
      }
    }
  }
  ConversionResult result;
  result.output = area.output;
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    const FilePlan& file = planned.plan.files[f];
    const int owner = assignment[f];
    auto it = records[owner].find(file.name);
    if (it == records[owner].end()) {
      return absl::DataLossError(
          absl::StrCat(area.PathOf(PartitionRecordName(owner, split.count)), " does not list ",
                       file.name, "; nothing was published; ", RerunHint(owner, split.count)));
    }
    auto own = hashed.find(file.name);
    RETURN_IF_ERROR(CheckRecordedFile(area, split, file, owner, it->second.second,
                                      own == hashed.end() ? nullptr : &own->second));
    result.files.push_back(
        {file.name, file.bytes, it->second.second, static_cast<int>(file.tensors.size())});
    result.bytes_written += file.bytes;
    result.tensors += static_cast<int64_t>(file.tensors.size());
  }
  if (WritesInPlace(area)) {
    RETURN_IF_ERROR(PublishInPlace(area, split, spec, planned, control, result));
  } else {
    RETURN_IF_ERROR(PublishByRename(area, split, spec, planned, control, result));
  }
  // The output is published; the records and the claims have served.
  RemovePartitionArea(area);
  TestFaultPoint("after-publish");
  if (spec.update_latest) {
    for (const auto& [file, contents] : planned.beside_output) {
      RETURN_IF_ERROR(
          area.driver->WriteFile(absl::StrCat(area.parent, "/", file), contents).status(),
          "the output was published; updating the tracker file beside it");
    }
  }
  result.publish_seconds = SecondsSince(start);
  result.published = true;
  result.partition_count = split.count;
  result.partitions_recorded = split.count;
  return result;
}

// The result of a worker that finds the output already published by its split.
ConversionResult AlreadyPublished(const PartitionArea& area, int index, int count) {
  ConversionResult result;
  result.output = area.output;
  result.found_published = true;
  result.published = true;
  result.partition_index = index;
  result.partition_count = count;
  result.partitions_recorded = count;
  return result;
}

// Prepares the data area for this worker's files `mine`: in place, an overwritten output's
// manifest goes first (nothing there is taken for a finished output from now on) and the
// marker is written; a killed attempt's unfinished writes of `mine` are dropped (posix: its
// `.partial` files; S3: its multipart uploads). Other workers' files are theirs.
absl::Status PrepareData(const PartitionArea& area, const AreaContents& contents,
                         const CopyPlan& mine, const std::string& input) {
  const OutputArea data = DataArea(area);
  if (WritesInPlace(area)) {
    if (contents.manifest) RETURN_IF_ERROR(area.driver->Delete(data.PathOf(kManifestName)));
    if (!contents.marker) RETURN_IF_ERROR(data.WriteMarker(input));
    for (const FilePlan& file : mine.files) {
      RETURN_IF_ERROR(area.driver->AbortUnfinishedWrites(data.PathOf(file.name)));
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Directory dir, OpenFolderCreating(data.root()));
  for (const FilePlan& file : mine.files) {
    if (auto place = dir.OpenParentOf(file.name); place.ok()) {
      RETURN_IF_ERROR(place->folder.RemoveFile(absl::StrCat(place->name, ".partial")));
    }
  }
  return absl::OkStatus();
}

// Writes `mine` into the data area, recording each file as it is committed: in place as a
// record of its own (OutputAreaSink), on posix as a line of this worker's log, which starts
// with `kept`, the records of the files an earlier attempt finished.
absl::StatusOr<ExecutionResult> WriteData(const PartitionArea& area, const Split& split, int index,
                                          const CopyPlan& mine, const std::vector<FileRecord>& kept,
                                          ExecutorOptions options, uint64_t writer_budget,
                                          const RunControl& control) {
  const OutputArea data = DataArea(area);
  // The first error recording a finished file; the executor calls on_file_committed
  // serialized.
  absl::Status record_status;
  std::map<std::string, std::string> metadata;
  if (!control.job_id.empty()) metadata["reshard-job"] = control.job_id;
  OutputAreaSink sink(data, split.id, std::move(metadata), control.cancelled, writer_budget);
  const bool in_place = WritesInPlace(area);
  std::optional<Directory> dir;
  std::optional<FileRecordLog> log;
  if (!in_place) {
    ASSIGN_OR_RETURN(dir, OpenExistingFolder(data.root()));
    absl::StatusOr<FileRecordLog> created =
        FileRecordLog::Create(*dir, WorkerLogName(index, split.count), kept);
    RETURN_IF_ERROR(created.status());
    log.emplace(*std::move(created));
  }
  options.on_file_committed = [&](const WrittenFile& file) {
    if (record_status.ok()) {
      if (in_place) {
        record_status = sink.Record(file);
      } else {
        const absl::StatusOr<FileRecord> record = data.CommittedRecord(split.id, file);
        record_status = record.ok() ? log->Append(*record) : record.status();
      }
    }
    if (control.on_file_committed) control.on_file_committed(file);
    TestFaultPoint("partition-file-committed", control.cancelled);
  };
  absl::StatusOr<ExecutionResult> executed =
      in_place ? Execute(mine, sink, options) : Execute(mine, *dir, options);
  RETURN_IF_ERROR(executed.status());
  RETURN_IF_ERROR(record_status);
  return executed;
}

// Claims publishing once every record is in, and publishes: AlreadyExists when another
// worker of the split publishes (or has published).
absl::StatusOr<ConversionResult> ClaimAndPublish(const PartitionArea& area, const Split& split,
                                                 const ConversionSpec& spec,
                                                 const PlannedConversion& planned,
                                                 const RunControl& control,
                                                 const std::map<std::string, uint64_t>& hashed) {
  const int index = spec.partition_index;
  TestFaultPoint("partition-before-claim", control.cancelled);
  OrderedJson holder = ThisProcess();
  holder["partition"] = index;
  const std::string claim_path = area.PathOf(kPublishClaimName);
  absl::Status claimed = area.driver->CreateExclusive(
      claim_path, holder.dump(-1, ' ', false, OrderedJson::error_handler_t::replace) + "\n");
  if (absl::IsAlreadyExists(claimed)) {
    // Another worker publishes, unless the claim is this partition's own from an attempt
    // killed while publishing.
    absl::StatusOr<OrderedJson> held = ReadJsonFile(*area.driver, claim_path);
    if (held.ok()) {
      if (FieldOr(*held, "partition", -1) == index) claimed = absl::OkStatus();
    } else {
      claimed = held.status();
    }
  }
  // The worker that claimed may publish and remove the area while this one is still
  // claiming or reading its claim: once this split's output is out, that is no error.
  if (!claimed.ok() && !absl::IsAlreadyExists(claimed) && PublishedSplitId(area) == split.id) {
    claimed = absl::AlreadyExistsError("published by another worker of this split");
  }
  if (claimed.ok() && PublishedSplitId(area) == split.id) {
    // Claimed in the moment between another worker publishing and its removing the area
    // (whose claim was already gone): the output is out; clean up what this claim left.
    RemovePartitionArea(area);
    claimed = absl::AlreadyExistsError("published by another worker of this split");
  }
  RETURN_IF_ERROR(claimed);
  absl::StatusOr<ConversionResult> published = Publish(area, split, spec, planned, control, hashed);
  if (!published.ok()) {
    // Nothing was published: a rerun of the partition the error names publishes.
    if (PublishedSplitId(area) != split.id) area.driver->Delete(claim_path).IgnoreError();
    return Annotate(published.status(), "publishing the output");
  }
  return published;
}

absl::StatusOr<ConversionResult> RunPartition(const ConversionSpec& spec,
                                              const RunControl& control) {
  const Clock::time_point start = Clock::now();
  const int index = spec.partition_index;
  const int count = spec.partition_count;
  if (count < 1 || count > kMaxPartitions || index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", index, "/", count,
                                                   " is not an index below a count in [1, ",
                                                   kMaxPartitions, "]"));
  }
  if (spec.output.empty()) return absl::InvalidArgumentError("no output folder given");
  RETURN_IF_ERROR(CheckInputPath(spec.input, "input"));
  ASSIGN_OR_RETURN(const PartitionArea area, LocatePartitionArea(spec.output));
  if (WritesInPlace(area)) {
    // An input inside the output is refused even when overwriting: publishing in place
    // deletes what the plan does not write.
    ConversionSpec overwriting = spec;
    overwriting.overwrite = true;
    RETURN_IF_ERROR(CheckObjectStoreOutputUsable(overwriting));
  }
  // A non-empty output is refused before reading anything, unless it is this split's own
  // (a worker rerun after another one published).
  const std::string published_split = PublishedSplitId(area);
  if (!spec.overwrite && published_split.empty()) {
    RETURN_IF_ERROR(CheckPartitionedOutputUsable(spec, area));
  }
  ASSIGN_OR_RETURN(OrderedJson request, SpecToRequestJson(spec));
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec));
  const Split split = MakeSplit(std::move(request), count, planned.plan);
  if (published_split == split.id) return AlreadyPublished(area, index, count);
  if (!published_split.empty() && !spec.overwrite) {
    RETURN_IF_ERROR(CheckPartitionedOutputUsable(spec, area));
  }

  RETURN_IF_ERROR(JoinSplit(area, split));
  // One worker per index at a time: a second one would drop this one's unfinished writes.
  ASSIGN_OR_RETURN(std::unique_ptr<PartitionClaim> claim,
                   PartitionClaim::Acquire(area, index, count));
  const double plan_seconds = SecondsSince(start);

  // This worker's files, and what an earlier attempt of it committed.
  std::vector<uint64_t> bytes;
  for (const FilePlan& file : planned.plan.files) bytes.push_back(file.bytes);
  const std::vector<int> assignment = AssignPartitions(bytes, count);
  RecordedFiles committed;
  absl::StatusOr<RecordedFiles> earlier = ReadPartitionRecord(area, split, index);
  if (earlier.ok()) {
    committed = *std::move(earlier);
  } else if (absl::IsDataLoss(earlier.status())) {
    // A damaged record of this partition: its files are checked and written as if none had
    // been recorded, and the record written again.
    RETURN_IF_ERROR(area.driver->Delete(area.PathOf(PartitionRecordName(index, count))));
  } else if (!absl::IsNotFound(earlier.status())) {
    return earlier.status();
  }
  CopyPlan mine;
  mine.sources = planned.plan.sources;
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    if (assignment[f] != index) continue;
    mine.total_bytes += planned.plan.files[f].bytes;
    mine.files.push_back(planned.plan.files[f]);
  }
  mine.source_bytes_read = planned.plan.source_bytes_read;

  // Every data file this worker commits gets its output_commit record (plan id: the split's),
  // so that a rerun of a killed attempt reuses the files it finished: on posix a line of this
  // worker's log, in place a record of its own. Records of other partitions' files name no
  // file of `mine` and are left alone.
  const OutputArea data = DataArea(area);
  ASSIGN_OR_RETURN(const AreaContents contents, data.List());
  ASSIGN_OR_RETURN(const ReusableFiles reuse, data.FindReusable(contents, mine, split.id),
                   absl::StrCat("partition ", PartitionName({index, count})));
  RETURN_IF_ERROR(PrepareData(area, contents, mine, spec.input));
  std::map<std::string, uint64_t> completed = reuse.files;
  // Posix: the executor checks size and XXH3-64 of every kept file before reusing it, so the
  // files of the partition's record are offered too.
  if (!WritesInPlace(area)) {
    for (const auto& [name, facts] : committed) completed.emplace(name, facts.second);
  }
  ExecutorOptions options = ExecutorOptionsFor(spec, control);
  options.completed_files = completed;
  // The window, the spans of remote sources and the upload buffers share the worker's memory
  // (ShareConversionMemory).
  const ConversionMemory memory = ShareConversionMemory(spec, mine, *area.driver);
  options.window_bytes = memory.window_bytes;
  options.remote_span_bytes = memory.remote_span_bytes;
  const Clock::time_point write_start = Clock::now();
  ASSIGN_OR_RETURN(
      ExecutionResult executed,
      WriteData(area, split, index, mine, reuse.records, options, memory.writer_budget, control),
      absl::StrCat("partition ", PartitionName({index, count})));

  RecordedFiles recorded;
  std::map<std::string, uint64_t> hashed;  // every file of this run was hashed as written or reused
  for (const WrittenFile& file : executed.files) {
    recorded[file.name] = {file.bytes, file.xxh3_64};
    hashed[file.name] = file.xxh3_64;
  }
  RETURN_IF_ERROR(claim->Held());
  RETURN_IF_ERROR(WritePartitionRecord(area, split, index, recorded));
  TestFaultPoint("partition-recorded", control.cancelled);

  ConversionResult result;
  result.output = area.output;
  result.plan_seconds = plan_seconds;
  result.data_files_seconds = SecondsSince(write_start);
  RecordExecution(executed, result);
  result.verification_failures += reuse.mismatches;
  for (const FilePlan& file : mine.files) result.tensors += file.tensors.size();
  result.partition_index = index;
  result.partition_count = count;
  result.published = false;

  // Looked for after this worker's record is in: the last worker to finish sees all of them.
  for (int i = 0; i < count; ++i) {
    if (area.driver->Stat(area.PathOf(PartitionRecordName(i, count))).ok()) {
      ++result.partitions_recorded;
    }
  }
  if (result.partitions_recorded == count) {
    absl::StatusOr<ConversionResult> published =
        ClaimAndPublish(area, split, spec, planned, control, hashed);
    if (published.ok()) {
      result.published = true;
      result.publish_seconds = published->publish_seconds;
      // The index and the manifest; the other data files are their workers'.
      uint64_t data_bytes = 0;
      for (const FilePlan& file : planned.plan.files) data_bytes += file.bytes;
      result.bytes_written += published->bytes_written - data_bytes;
    } else if (!absl::IsAlreadyExists(published.status())) {
      return published.status();
    }
  }
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace

std::string PartitionAreaPathFor(const std::string& output_dir) {
  absl::StatusOr<PartitionArea> area = LocatePartitionArea(output_dir);
  return area.ok() ? area->root : "";
}

absl::StatusOr<ConversionResult> RunAnyConversion(const ConversionSpec& spec,
                                                  const RunControl& control) {
  ASSIGN_OR_RETURN(const kvstore::Location output, kvstore::ParseLocation(spec.output), "output");
  if (spec.partition_count > 0) return RunPartition(spec, control);
  // Storage without folders has no rename to publish a staging folder with: the output is
  // written in place under its in-progress marker (object_store_output.h).
  if (!output.driver->has_folders()) {
    return RunConversionToObjectStore(spec, control, *output.driver);
  }
  return RunConversion(spec, control);
}

absl::Status CheckOutputUsable(const ConversionSpec& spec) {
  // The output RunAnyConversion chooses for spec.output.
  ASSIGN_OR_RETURN(const kvstore::Location output, kvstore::ParseLocation(spec.output), "output");
  if (!output.driver->has_folders()) return CheckObjectStoreOutputUsable(spec);
  return CheckOutputDirUsable(spec.output);
}

absl::StatusOr<ConversionResult> CommitPartitionedConversion(const std::string& output_dir,
                                                             const RunControl& control) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(const PartitionArea area, LocatePartitionArea(output_dir));
  const std::string where = area.PathOf(kSplitName);
  absl::StatusOr<OrderedJson> stored = ReadJsonFile(*area.driver, where);
  if (absl::IsNotFound(stored.status())) {
    if (!PublishedSplitId(area).empty()) return AlreadyPublished(area, 0, 0);
    return absl::NotFoundError(absl::StrCat("no partitioned conversion of ", output_dir,
                                            " to commit (", where, " does not exist)"));
  }
  RETURN_IF_ERROR(stored.status());
  const int count = FieldOr(*stored, "partitions", 0);
  if (count < 1 || count > kMaxPartitions || !stored->contains("request")) {
    return absl::DataLossError(absl::StrCat(where, " is not a split record"));
  }
  ASSIGN_OR_RETURN(ConversionSpec spec, SpecFromRequestJson((*stored)["request"], where));
  std::vector<int> missing;
  for (int i = 0; i < count; ++i) {
    if (!area.driver->Stat(area.PathOf(PartitionRecordName(i, count))).ok()) missing.push_back(i);
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "partitions ", absl::StrJoin(missing, ", "), " of ", count,
        " have not recorded their files yet (", area.root, "); run them, then commit again"));
  }
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec),
                   absl::StrCat("planning the conversion ", where, " describes"));
  const Split split = MakeSplit((*stored)["request"], count, planned.plan);
  if (split.id != FieldOr<std::string>(*stored, "split_id", "")) {
    return absl::FailedPreconditionError(
        absl::StrCat("the input ", spec.input, " no longer plans to the files ", where,
                     " lists (it changed after the workers ran); rerun the conversion"));
  }
  // Explicit: a claim left by a worker killed while publishing is taken over.
  const std::string claim_path = area.PathOf(kPublishClaimName);
  absl::Status claimed =
      area.driver->CreateExclusive(claim_path, OrderedJson({{"commit", true}}).dump() + "\n");
  if (!claimed.ok() && !absl::IsAlreadyExists(claimed)) return claimed;
  absl::StatusOr<ConversionResult> result = Publish(area, split, spec, planned, control, {});
  if (!result.ok()) {
    if (PublishedSplitId(area) != split.id) area.driver->Delete(claim_path).IgnoreError();
    return result.status();
  }
  result->seconds = SecondsSince(start);
  return result;
}

}  // namespace reshard
