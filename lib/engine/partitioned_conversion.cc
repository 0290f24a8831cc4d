#include "lib/engine/partitioned_conversion.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/core/test_faults.h"
#include "lib/engine/object_store_output.h"
#include "lib/engine/partition_spec.h"
#include "lib/exec/executor.h"
#include "lib/io/atomic_file.h"
#include "lib/io/directory.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"
#include "lib/io/s3/s3_location.h"
#include "lib/io/staging_dir.h"
#include "lib/plan/layout_builders.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr char kSplitName[] = "split.json";
constexpr char kDataName[] = "data";
constexpr char kClaimName[] = "publish.claim";
// Records, journals, split.json and the claim are small; a larger one is not ours.
constexpr uint64_t kMaxRecordBytes = 64ull << 20;

namespace fs = std::filesystem;

// Partitioned conversions coordinate through a shared folder (link, rename); s3:// outputs
// have neither.
absl::Status ObjectStoreUnsupported(const std::string& output) {
  return absl::UnimplementedError(absl::StrCat(
      "output ", output,
      ": partitioned conversions (--partition) write local or mounted folders only; run an "
      "s3:// output as one conversion"));
}

struct OutputPlace {
  std::string parent;
  std::string name;
  std::string area_name;  // the shared area's name in `parent`
};

absl::StatusOr<OutputPlace> PlaceOf(const std::string& output_dir) {
  const OutputLocation location = SplitOutputPath(output_dir);
  if (!CheckPlainName(location.name).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", output_dir, " does not end in a folder name"));
  }
  return OutputPlace{location.parent, location.name,
                     absl::StrCat(".", location.name, ".reshard-partitions")};
}

std::string RecordName(int index, int count) {
  return absl::StrFormat("partition-%05d-of-%05d.json", index, count);
}
std::string JournalName(int index, int count) {
  return absl::StrFormat("partition-%05d-of-%05d.journal", index, count);
}

std::string Hex(uint64_t value) { return absl::StrFormat("%016x", value); }

// Writes `contents` under `name` in `dir` unless the name exists (AlreadyExists then): written
// and synced under a unique temporary name, then link(2)ed to `name`, which is atomic on local
// filesystems, NFS and Lustre alike, and never replaces an existing file.
absl::Status CreateExclusively(const Directory& dir, const std::string& name,
                               absl::string_view contents) {
  static std::atomic<uint64_t> counter{0};
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string temp = absl::StrCat(name, ".", host, ".", ::getpid(), ".", counter.fetch_add(1),
                                        ".", std::random_device()(), ".tmp");
  RETURN_IF_ERROR(WriteFileAtomically(dir, temp, contents));
  const int linked = ::linkat(dir.fd(), temp.c_str(), dir.fd(), name.c_str(), 0);
  const int link_error = errno;
  RETURN_IF_ERROR(dir.RemoveFile(temp));
  if (linked != 0) {
    if (link_error == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(dir.PathOf(name), " exists"));
    }
    return ErrnoToStatus(link_error, absl::StrCat("creating ", dir.PathOf(name)));
  }
  return dir.Sync();
}

absl::StatusOr<OrderedJson> ReadJsonIn(const Directory& dir, const std::string& name) {
  ASSIGN_OR_RETURN(int fd, dir.OpenFile(name, O_RDONLY | O_NONBLOCK));
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Adopt(fd, dir.PathOf(name)));
  if (file.size() > kMaxRecordBytes) {
    return absl::DataLossError(absl::StrCat(dir.PathOf(name), " is larger than ", kMaxRecordBytes,
                                            " bytes; not a reshard record"));
  }
  const char* text = reinterpret_cast<const char*>(file.data());
  OrderedJson json = file.size() == 0 ? OrderedJson()
                                      : OrderedJson::parse(text, text + file.size(), nullptr,
                                                           /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return absl::DataLossError(absl::StrCat(dir.PathOf(name), " is not a JSON object"));
  }
  return json;
}

// The conversion as every worker must see it (ConversionRequestJson).
absl::StatusOr<OrderedJson> SplitRequestJson(const ConversionSpec& spec) {
  ASSIGN_OR_RETURN(const std::string request, ConversionRequestJson(spec));
  return OrderedJson::parse(request);
}

absl::StatusOr<ConversionSpec> SpecFromSplitRequest(const OrderedJson& request,
                                                    const std::string& where) {
  auto bad = [&](absl::string_view field) {
    return absl::DataLossError(
        absl::StrCat(where, ": \"request\".\"", field, "\" is missing or invalid"));
  };
  ConversionSpec spec;
  try {
    const std::string kind = request.at("kind").get<std::string>();
    if (kind != "consolidate" && kind != "reshard") return bad("kind");
    spec.kind =
        kind == "consolidate" ? ConversionSpec::Kind::kConsolidate : ConversionSpec::Kind::kReshard;
    spec.input = request.at("input").get<std::string>();
    spec.output = request.at("output").get<std::string>();
    spec.output_format = request.at("output_format").get<std::string>();
    auto dtype = ParseDTypePolicy(request.at("dtype").get<std::string>());
    if (!dtype.ok()) return bad("dtype");
    spec.dtype = *dtype;
    spec.max_shard_size = request.at("max_shard_size").get<uint64_t>();
    spec.parts = request.at("parts").get<int>();
    spec.pipeline_parts = request.at("pipeline_parts").get<int>();
    spec.rules_json = request.at("rules_json").get<std::string>();
    spec.duplicate_tied = request.at("duplicate_tied").get<bool>();
    spec.read.tag = request.at("tag").get<std::string>();
    spec.read.include_optimizer = request.at("include_optimizer").get<bool>();
    spec.update_latest = request.at("update_latest").get<bool>();
    spec.overwrite = request.at("overwrite").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(where, ": ", e.what()));
  }
  return spec;
}

// split.json: the request, K and the plan's data files. Its XXH3-64 is the split's identity.
struct Split {
  OrderedJson json;
  std::string id;
  int count = 0;
};

Split MakeSplit(OrderedJson request, int count, const CopyPlan& plan) {
  Split split;
  split.count = count;
  OrderedJson files = OrderedJson::array();
  for (const FilePlan& file : plan.files) files.push_back({file.name, file.bytes});
  split.json["request"] = std::move(request);
  split.json["partitions"] = count;
  split.json["files"] = std::move(files);
  const std::string canonical = split.json.dump();
  split.id = Hex(XXH3_64bits(canonical.data(), canonical.size()));
  split.json["split_id"] = split.id;
  return split;
}

std::string DescribeSplit(const OrderedJson& split) {
  const OrderedJson& request = split.value("request", OrderedJson::object());
  return absl::StrCat(split.value("partitions", 0), " partitions of a ", request.value("kind", "?"),
                      " of ", request.value("input", "?"), " (",
                      request.value("output_format", "?"), ", dtype ", request.value("dtype", "?"),
                      ")");
}

// The shared area of one output, opened.
struct Area {
  OutputPlace place;
  Directory parent;
  Directory dir;
  std::string path() const { return parent.PathOf(place.area_name); }
};

// A worker's record, or the files of its journal: name -> (bytes, XXH3-64).
using FileRecords = std::map<std::string, std::pair<uint64_t, uint64_t>>;

std::string RecordJson(const Split& split, int index, const FileRecords& files) {
  OrderedJson record;
  record["split_id"] = split.id;
  record["partition"] = index;
  record["partitions"] = split.count;
  OrderedJson list = OrderedJson::array();
  for (const auto& [name, facts] : files) {
    list.push_back({{"name", name}, {"bytes", facts.first}, {"xxh3_64", Hex(facts.second)}});
  }
  record["files"] = std::move(list);
  return record.dump(1) + "\n";
}

// Reads a record or journal of partition `index`; NotFound when absent.
absl::StatusOr<FileRecords> ReadRecord(const Area& area, const std::string& name,
                                       const Split& split, int index) {
  ASSIGN_OR_RETURN(OrderedJson record, ReadJsonIn(area.dir, name));
  const std::string where = area.dir.PathOf(name);
  if (record.value("split_id", "") != split.id || record.value("partition", -1) != index) {
    return absl::DataLossError(
        absl::StrCat(where, " belongs to another split or partition than ", split.id, " ", index));
  }
  FileRecords files;
  if (!record.contains("files") || !record["files"].is_array()) {
    return absl::DataLossError(absl::StrCat(where, " has no \"files\" list"));
  }
  for (const OrderedJson& file : record["files"]) {
    uint64_t hash = 0;
    if (!file.is_object() || !file.contains("name") || !file["name"].is_string() ||
        !file.contains("bytes") || !file["bytes"].is_number_unsigned() ||
        !absl::SimpleHexAtoi(file.value("xxh3_64", ""), &hash) ||
        !CheckRelativeName(file["name"].get<std::string>()).ok()) {
      return absl::DataLossError(absl::StrCat(where, " has an invalid file entry"));
    }
    files[file["name"].get<std::string>()] = {file["bytes"].get<uint64_t>(), hash};
  }
  return files;
}

absl::StatusOr<Area> OpenArea(const std::string& output_dir, bool create) {
  Area area;
  ASSIGN_OR_RETURN(area.place, PlaceOf(output_dir));
  if (create) {
    ASSIGN_OR_RETURN(area.parent, OpenFolderCreating(area.place.parent));
  } else {
    ASSIGN_OR_RETURN(area.parent, OpenExistingFolder(area.place.parent));
  }
  ASSIGN_OR_RETURN(area.dir, area.parent.OpenChild(area.place.area_name, create));
  return area;
}

// Creates split.json, or checks that the one there is this split.
absl::Status JoinSplit(const Area& area, const Split& split) {
  const absl::Status created = CreateExclusively(area.dir, kSplitName, split.json.dump(1) + "\n");
  if (created.ok() || !absl::IsAlreadyExists(created)) return created;
  ASSIGN_OR_RETURN(OrderedJson existing, ReadJsonIn(area.dir, kSplitName));
  if (existing.value("split_id", "") == split.id) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the output is being assembled by another partitioned conversion (", area.path(),
      "/split.json: ", DescribeSplit(existing), "); this worker's is ", DescribeSplit(split.json),
      " with another request or plan. Finish that one (reshardctl commit) or remove ",
      area.path()));
}

// The split that published `output_dir`, from its manifest; empty when none.
std::string PublishedSplitId(const std::string& output_dir) {
  absl::StatusOr<Directory> out = OpenExistingFolder(output_dir);
  if (!out.ok()) return "";
  absl::StatusOr<OrderedJson> manifest = ReadJsonIn(*out, kManifestName);
  if (!manifest.ok()) return "";
  return manifest->value("split_id", "");
}

// Stat of relative file `name` in `dir`.
absl::StatusOr<struct stat> StatIn(const Directory& dir, const std::string& name) {
  ASSIGN_OR_RETURN(Directory::Place place, dir.OpenParentOf(name));
  return place.folder.StatChild(place.name);
}

// Everything after every worker has recorded its files: checks the records against the plan
// and the files (`rehash`: their XXH3-64 too), writes the companion files and the manifest into
// data/, renames data/ to the output and removes the area.
absl::StatusOr<ConversionResult> Publish(const Area& area, const Split& split,
                                         const ConversionSpec& spec,
                                         const PlannedConversion& planned,
                                         const RunControl& control, bool rehash) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(Directory data, area.dir.OpenChild(kDataName));
  std::vector<uint64_t> bytes;
  for (const FilePlan& file : planned.plan.files) bytes.push_back(file.bytes);
  const std::vector<int> assignment = AssignPartitions(bytes, split.count);
  std::vector<FileRecords> records(static_cast<size_t>(split.count));
  for (int i = 0; i < split.count; ++i) {
    ASSIGN_OR_RETURN(records[i], ReadRecord(area, RecordName(i, split.count), split, i),
                     absl::StrCat("partition ", i, "'s record"));
  }
  ConversionResult result;
  result.output = NormalizeOutputPath(spec.output);
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    const FilePlan& file = planned.plan.files[f];
    const FileRecords& record = records[assignment[f]];
    auto it = record.find(file.name);
    if (it == record.end() || it->second.first != file.bytes) {
      return absl::DataLossError(
          absl::StrCat("partition ", assignment[f], "'s record ",
                       it == record.end() ? "does not list " : "has another size for ", file.name));
    }
    auto st = StatIn(data, file.name);
    if (!st.ok() || !S_ISREG(st->st_mode) || static_cast<uint64_t>(st->st_size) != file.bytes) {
      return absl::DataLossError(absl::StrCat(data.PathOf(file.name), " is missing or not the ",
                                              file.bytes, " bytes partition ", assignment[f],
                                              " recorded"));
    }
    if (rehash) {
      ASSIGN_OR_RETURN(uint64_t hash, HashFile(data, file.name));
      if (hash != it->second.second) {
        return absl::DataLossError(absl::StrCat(data.PathOf(file.name),
                                                " no longer has the XXH3-64 partition ",
                                                assignment[f], " recorded; rerun that partition"));
      }
    }
    result.files.push_back(
        {file.name, file.bytes, it->second.second, static_cast<int>(file.tensors.size())});
    result.bytes_written += file.bytes;
    result.tensors += static_cast<int64_t>(file.tensors.size());
  }
  RETURN_IF_ERROR(data.Sync());  // the data files of every worker
  RETURN_IF_ERROR(WriteCompanionsAndManifest(data, spec, planned, control, split.id, result));
  RETURN_IF_ERROR(data.Sync());
  // As StagingDir::Publish: rename(2) replaces an absent or empty folder atomically; a
  // non-empty one is moved aside first when overwriting.
  const std::string& name = area.place.name;
  std::string replaced;
  auto existing = area.parent.StatChild(name);
  if (existing.ok() && spec.overwrite) {
    replaced = absl::StrCat(".", name, ".reshard-replaced");
    RETURN_IF_ERROR(area.parent.RemoveTree(replaced));
    if (::renameat(area.parent.fd(), name.c_str(), area.parent.fd(), replaced.c_str()) != 0) {
      return ErrnoToStatus(
          errno, absl::StrCat("moving the output ", result.output, " aside to overwrite it"));
    }
  }
  if (::renameat(area.dir.fd(), kDataName, area.parent.fd(), name.c_str()) != 0) {
    if (errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("output folder ", result.output,
                       " is not empty; nothing was published (rerun with "
                       "overwriting allowed, or remove it, then run `reshardctl commit ",
                       result.output, "`)"));
    }
    return ErrnoToStatus(errno, absl::StrCat("renaming ", data.path(), " to ", result.output));
  }
  RETURN_IF_ERROR(area.parent.Sync());
  if (!replaced.empty()) area.parent.RemoveTree(replaced).IgnoreError();
  // The output is published; the records and the claim have served.
  area.parent.RemoveTree(area.place.area_name).IgnoreError();
  TestFaultPoint("after-publish");
  if (spec.update_latest) {
    for (const auto& [file, contents] : planned.beside_output) {
      RETURN_IF_ERROR(WriteFileAtomically(area.parent, file, contents),
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
ConversionResult AlreadyPublished(const ConversionSpec& spec, int count) {
  ConversionResult result;
  result.output = NormalizeOutputPath(spec.output);
  result.found_published = true;
  result.published = true;
  result.partition_index = spec.partition_index;
  result.partition_count = count;
  result.partitions_recorded = count;
  return result;
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
  RETURN_IF_ERROR(CheckLocalPath(spec.output, "output"));
  // A non-empty output is refused before reading anything, unless it is this split's own
  // (a worker rerun after another one published).
  const std::string published_split = PublishedSplitId(spec.output);
  if (!spec.overwrite && published_split.empty()) {
    RETURN_IF_ERROR(CheckOutputDirUsable(spec.output));
  }
  ASSIGN_OR_RETURN(OrderedJson request, SplitRequestJson(spec));
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec));
  const Split split = MakeSplit(std::move(request), count, planned.plan);
  if (published_split == split.id) return AlreadyPublished(spec, count);
  if (!published_split.empty() && !spec.overwrite) {
    RETURN_IF_ERROR(CheckOutputDirUsable(spec.output));
  }

  ASSIGN_OR_RETURN(Area area, OpenArea(spec.output, /*create=*/true));
  RETURN_IF_ERROR(JoinSplit(area, split));
  ASSIGN_OR_RETURN(Directory data, area.dir.OpenChild(kDataName, /*create=*/true));
  const double plan_seconds = SecondsSince(start);

  // This worker's files, and what an earlier attempt of it committed.
  std::vector<uint64_t> bytes;
  for (const FilePlan& file : planned.plan.files) bytes.push_back(file.bytes);
  const std::vector<int> assignment = AssignPartitions(bytes, count);
  const std::string record_name = RecordName(index, count);
  const std::string journal_name = JournalName(index, count);
  FileRecords committed;
  for (const std::string& name : {record_name, journal_name}) {
    absl::StatusOr<FileRecords> earlier = ReadRecord(area, name, split, index);
    if (earlier.ok()) {
      committed.insert(earlier->begin(), earlier->end());
    } else if (!absl::IsNotFound(earlier.status())) {
      return earlier.status();
    }
  }
  CopyPlan mine;
  mine.sources = planned.plan.sources;
  std::map<std::string, uint64_t> completed;
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    if (assignment[f] != index) continue;
    FilePlan& file = planned.plan.files[f];
    // A `.partial` of this worker's file was left by its killed attempt; other workers'
    // are theirs.
    if (auto place = data.OpenParentOf(file.name); place.ok()) {
      RETURN_IF_ERROR(place->folder.RemoveFile(absl::StrCat(place->name, ".partial")));
    }
    if (auto it = committed.find(file.name); it != committed.end()) {
      completed[file.name] = it->second.second;
    }
    mine.total_bytes += file.bytes;
    mine.files.push_back(file);
  }
  mine.source_bytes_read = planned.plan.source_bytes_read;

  ExecutorOptions options = ExecutorOptionsFor(spec, control);
  options.completed_files = completed;
  FileRecords journal;
  absl::Mutex journal_mu;
  absl::Status journal_status;
  options.on_file_committed = [&](const WrittenFile& file) {
    {
      absl::MutexLock lock(&journal_mu);
      journal[file.name] = {file.bytes, file.xxh3_64};
      absl::Status written =
          WriteFileAtomically(area.dir, journal_name, RecordJson(split, index, journal));
      if (!written.ok() && journal_status.ok()) journal_status = written;
    }
    if (control.on_file_committed) control.on_file_committed(file);
    TestFaultPoint("partition-file-committed", control.cancelled);
  };
  const Clock::time_point write_start = Clock::now();
  ASSIGN_OR_RETURN(ExecutionResult executed, Execute(mine, data, options),
                   absl::StrCat("partition ", PartitionName({index, count})));
  RETURN_IF_ERROR(journal_status, "recording the committed files in the journal");

  FileRecords recorded;
  for (const WrittenFile& file : executed.files) recorded[file.name] = {file.bytes, file.xxh3_64};
  RETURN_IF_ERROR(WriteFileAtomically(area.dir, record_name, RecordJson(split, index, recorded)),
                  "recording this partition's files");
  RETURN_IF_ERROR(area.dir.Sync());
  area.dir.RemoveFile(journal_name).IgnoreError();  // the record says it all now
  TestFaultPoint("partition-recorded", control.cancelled);

  ConversionResult result;
  result.output = NormalizeOutputPath(spec.output);
  result.plan_seconds = plan_seconds;
  result.data_files_seconds = SecondsSince(write_start);
  RecordExecution(executed, result);
  for (const FilePlan& file : mine.files) result.tensors += file.tensors.size();
  result.partition_index = index;
  result.partition_count = count;
  result.published = false;

  // Looked for after this worker's record is in: the last worker to finish sees all of them.
  for (int i = 0; i < count; ++i) {
    if (area.dir.StatChild(RecordName(i, count)).ok()) ++result.partitions_recorded;
  }
  if (result.partitions_recorded == count) {
    TestFaultPoint("partition-before-claim", control.cancelled);
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    OrderedJson claim = {{"partition", index}, {"host", host}, {"pid", ::getpid()}};
    absl::Status claimed = CreateExclusively(area.dir, kClaimName, claim.dump() + "\n");
    if (absl::IsAlreadyExists(claimed)) {
      // Another worker publishes, unless the claim is this partition's own from an attempt
      // killed while publishing.
      absl::StatusOr<OrderedJson> holder = ReadJsonIn(area.dir, kClaimName);
      if (holder.ok()) {
        if (holder->value("partition", -1) == index) claimed = absl::OkStatus();
      } else {
        claimed = holder.status();
      }
    }
    // The worker that claimed may publish and remove the area while this one is still
    // claiming or reading its claim: once this split's output is out, that is no error.
    if (!claimed.ok() && !absl::IsAlreadyExists(claimed) &&
        PublishedSplitId(result.output) == split.id) {
      claimed = absl::AlreadyExistsError("published by another worker of this split");
    }
    if (claimed.ok() && PublishedSplitId(result.output) == split.id) {
      // Claimed in the moment between another worker publishing and its removing the area
      // (whose claim was already gone): the output is out; clean up what this claim left.
      area.parent.RemoveTree(area.place.area_name).IgnoreError();
      claimed = absl::AlreadyExistsError("published by another worker of this split");
    }
    if (claimed.ok()) {
      ASSIGN_OR_RETURN(ConversionResult published,
                       Publish(area, split, spec, planned, control, /*rehash=*/false),
                       "publishing the output");
      result.published = true;
      result.publish_seconds = published.publish_seconds;
      // The index and the manifest; the other data files are their workers'.
      uint64_t data_bytes = 0;
      for (const FilePlan& file : planned.plan.files) data_bytes += file.bytes;
      result.bytes_written += published.bytes_written - data_bytes;
    } else if (!absl::IsAlreadyExists(claimed)) {
      return claimed;
    }
  }
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace

std::string PartitionAreaPathFor(const std::string& output_dir) {
  absl::StatusOr<OutputPlace> place = PlaceOf(output_dir);
  if (!place.ok()) return "";
  return (fs::path(place->parent) / place->area_name).string();
}

absl::StatusOr<ConversionResult> RunAnyConversion(const ConversionSpec& spec,
                                                  const RunControl& control) {
  if (IsS3Url(spec.output)) {
    if (spec.partition_count > 0) return ObjectStoreUnsupported(spec.output);
    return RunConversionToObjectStore(spec, control);
  }
  if (spec.partition_count > 0) return RunPartition(spec, control);
  return RunConversion(spec, control);
}

absl::StatusOr<ConversionResult> CommitPartitionedConversion(const std::string& output_dir,
                                                             const RunControl& control) {
  const Clock::time_point start = Clock::now();
  if (IsS3Url(output_dir)) return ObjectStoreUnsupported(output_dir);
  RETURN_IF_ERROR(CheckLocalPath(output_dir, "output"));
  absl::StatusOr<Area> area = OpenArea(output_dir, /*create=*/false);
  if (!area.ok()) {
    if (!absl::IsNotFound(area.status())) return area.status();
    if (!PublishedSplitId(output_dir).empty()) {
      ConversionSpec spec;
      spec.output = output_dir;
      return AlreadyPublished(spec, 0);
    }
    return absl::NotFoundError(absl::StrCat("no partitioned conversion of ", output_dir,
                                            " to commit (", PartitionAreaPathFor(output_dir),
                                            " does not exist)"));
  }
  ASSIGN_OR_RETURN(OrderedJson stored, ReadJsonIn(area->dir, kSplitName));
  const std::string where = area->dir.PathOf(kSplitName);
  const int count = stored.value("partitions", 0);
  if (count < 1 || count > kMaxPartitions || !stored.contains("request")) {
    return absl::DataLossError(absl::StrCat(where, " is not a split record"));
  }
  ASSIGN_OR_RETURN(ConversionSpec spec, SpecFromSplitRequest(stored["request"], where));
  std::vector<int> missing;
  for (int i = 0; i < count; ++i) {
    if (!area->dir.StatChild(RecordName(i, count)).ok()) missing.push_back(i);
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "partitions ", absl::StrJoin(missing, ", "), " of ", count,
        " have not recorded their files yet (", area->path(), "); run them, then commit again"));
  }
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec),
                   absl::StrCat("planning the conversion ", where, " describes"));
  const Split split = MakeSplit(stored["request"], count, planned.plan);
  if (split.id != stored.value("split_id", "")) {
    return absl::FailedPreconditionError(
        absl::StrCat("the input ", spec.input, " no longer plans to the files ", where,
                     " lists (it changed after the workers ran); rerun the conversion"));
  }
  // Explicit: a claim left by a worker killed while publishing is taken over.
  absl::Status claimed =
      CreateExclusively(area->dir, kClaimName, OrderedJson({{"commit", true}}).dump() + "\n");
  if (!claimed.ok() && !absl::IsAlreadyExists(claimed)) return claimed;
  ASSIGN_OR_RETURN(ConversionResult result,
                   Publish(*area, split, spec, planned, control, /*rehash=*/true));
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace reshard
