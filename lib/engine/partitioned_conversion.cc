#include "lib/engine/partitioned_conversion.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/core/test_faults.h"
#include "lib/engine/object_store_output.h"
#include "lib/engine/output_commit.h"
#include "lib/engine/partition_spec.h"
#include "lib/engine/spec_codec.h"
#include "lib/exec/executor.h"
#include "lib/io/atomic_file.h"
#include "lib/io/directory.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/posix_driver.h"
#include "lib/io/staging_dir.h"
#include "lib/plan/layout_builders.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr char kSplitName[] = "split.json";
constexpr char kDataName[] = "data";
constexpr char kClaimName[] = "publish.claim";
// Records, split.json and the claims are small; a larger one is not ours.
constexpr uint64_t kMaxRecordBytes = 64ull << 20;
// A worker's claim on its partition index is refreshed this often; one not refreshed for
// kClaimLease is stale when its worker cannot be checked directly (another host).
constexpr absl::Duration kClaimRefresh = absl::Seconds(30);
constexpr absl::Duration kClaimLease = absl::Seconds(120);

namespace fs = std::filesystem;

// Partitioned conversions coordinate through a shared folder (link, rename); s3:// outputs
// have neither.
// OK when output `path` is on storage with folders of its own (posix), where a partition area
// lives; Unimplemented naming the output otherwise (S3, memory), or when no driver serves it.
absl::Status CheckPartitionedOutput(const std::string& path) {
  ASSIGN_OR_RETURN(const kvstore::Location output, kvstore::ParseLocation(path), "output");
  if (output.driver->has_folders()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "output ", path,
      ": partitioned conversions (--partition) write folders on local or mounted filesystems "
      "only; run an output on ",
      output.driver->scheme(), ":// as one conversion"));
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
std::string ClaimName(int index, int count) {
  return absl::StrFormat("partition-%05d-of-%05d.claim", index, count);
}

// What to run to write partition `index` again, for error messages.
std::string RerunHint(int index, int count) {
  return absl::StrCat("rerun partition ", index, " of ", count, " (--partition ", index, "/", count,
                      ")");
}

std::string Hex(uint64_t value) { return absl::StrFormat("%016x", value); }

// Writes and syncs `contents` under a name for `name` in `dir` that no other process or thread
// uses, and returns that name.
absl::StatusOr<std::string> WriteUniqueTemporary(const Directory& dir, const std::string& name,
                                                 absl::string_view contents) {
  static std::atomic<uint64_t> counter{0};
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string temp = absl::StrCat(name, ".", host, ".", ::getpid(), ".", counter.fetch_add(1),
                                        ".", std::random_device()(), ".tmp");
  RETURN_IF_ERROR(WriteFileAtomically(dir, temp, contents));
  return temp;
}

// The contents of small file `path` of `driver` (a record, split.json, a claim, a manifest):
// NotFound when absent, DataLoss naming it when larger than any of reshard's.
absl::StatusOr<std::string> ReadSmallFileAt(const kvstore::Driver& driver,
                                            const std::string& path) {
  ASSIGN_OR_RETURN(const kvstore::PathStat stat, driver.Stat(path));
  if (stat.is_folder || stat.size > kMaxRecordBytes) {
    return absl::DataLossError(absl::StrCat(path, " is a folder or larger than ", kMaxRecordBytes,
                                            " bytes; not a reshard record"));
  }
  std::string text(stat.size, '\0');
  RETURN_IF_ERROR(driver.ReadRange(path, 0, absl::MakeSpan(text), stat));
  return text;
}

absl::StatusOr<OrderedJson> ReadJsonAt(const kvstore::Driver& driver, const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFileAt(driver, path));
  OrderedJson json =
      text.empty() ? OrderedJson() : OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is not a JSON object"));
  }
  return json;
}

// Field `key` of `json` as a T, or `fallback` when `json` is not an object, lacks the key or
// holds another type there: area files are read from a shared folder and may be anything.
template <typename T>
T FieldOr(const OrderedJson& json, const char* key, T fallback) {
  if (!json.is_object()) return fallback;
  auto it = json.find(key);
  if (it == json.end()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
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
  const std::string canonical =
      split.json.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  split.id = Hex(XXH3_64bits(canonical.data(), canonical.size()));
  split.json["split_id"] = split.id;
  return split;
}

std::string DescribeSplit(const OrderedJson& split) {
  const OrderedJson request = FieldOr(split, "request", OrderedJson::object());
  return absl::StrCat(FieldOr(split, "partitions", 0), " partitions of a ",
                      FieldOr<std::string>(request, "kind", "?"), " of ",
                      FieldOr<std::string>(request, "input", "?"), " (",
                      FieldOr<std::string>(request, "output_format", "?"), ", dtype ",
                      FieldOr<std::string>(request, "dtype", "?"), ")");
}

// The shared area of one output, opened.
// Its small files (split.json, records, claims) are created, read and removed through
// `driver` (CreateExclusive for the ones of which exactly one may exist).
struct Area {
  OutputPlace place;
  Directory parent;
  Directory dir;
  const kvstore::Driver* driver = &kvstore::GetPosixDriver();
  std::string path() const { return parent.PathOf(place.area_name); }
  std::string PathOf(const std::string& name) const { return dir.PathOf(name); }
};

// A worker's record: name -> (bytes, XXH3-64).
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
  return record.dump(1, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

// Reads the record of partition `index`; NotFound when absent, DataLoss naming the
// file and what to rerun when it is not one of this split's records of that partition.
absl::StatusOr<FileRecords> ReadRecord(const Area& area, const std::string& name,
                                       const Split& split, int index) {
  const std::string hint = RerunHint(index, split.count);
  absl::StatusOr<OrderedJson> read = ReadJsonAt(*area.driver, area.PathOf(name));
  if (absl::IsDataLoss(read.status())) {
    return absl::DataLossError(absl::StrCat(read.status().message(), "; ", hint));
  }
  if (!read.ok()) return read.status();
  const OrderedJson& record = *read;
  const std::string where = area.dir.PathOf(name);
  if (FieldOr<std::string>(record, "split_id", "") != split.id ||
      FieldOr(record, "partition", -1) != index) {
    return absl::DataLossError(absl::StrCat(where, " belongs to another split or partition than ",
                                            split.id, " partition ", index, "; ", hint));
  }
  FileRecords files;
  if (!record.contains("files") || !record["files"].is_array()) {
    return absl::DataLossError(absl::StrCat(where, " has no \"files\" list; ", hint));
  }
  for (size_t i = 0; i < record["files"].size(); ++i) {
    const OrderedJson& file = record["files"][i];
    uint64_t hash = 0;
    if (!file.is_object() || !file.contains("name") || !file["name"].is_string() ||
        !file.contains("bytes") || !file["bytes"].is_number_unsigned() ||
        !absl::SimpleHexAtoi(FieldOr<std::string>(file, "xxh3_64", ""), &hash) ||
        !CheckRelativeName(file["name"].get<std::string>()).ok()) {
      return absl::DataLossError(
          absl::StrCat(where, " has an invalid file entry (\"files\"[", i, "]); ", hint));
    }
    const std::string file_name = file["name"].get<std::string>();
    if (!files.emplace(file_name, std::make_pair(file["bytes"].get<uint64_t>(), hash)).second) {
      return absl::DataLossError(absl::StrCat(where, " lists ", file_name, " twice; ", hint));
    }
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
  const absl::Status created = area.driver->CreateExclusive(
      area.PathOf(kSplitName),
      split.json.dump(1, ' ', false, OrderedJson::error_handler_t::replace) + "\n");
  if (created.ok() || !absl::IsAlreadyExists(created)) return created;
  ASSIGN_OR_RETURN(OrderedJson existing, ReadJsonAt(*area.driver, area.PathOf(kSplitName)));
  if (FieldOr<std::string>(existing, "split_id", "") == split.id) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the output is being assembled by another partitioned conversion (", area.path(),
      "/split.json: ", DescribeSplit(existing), "); this worker's is ", DescribeSplit(split.json),
      " with another request or plan. Finish that one (reshardctl commit) or remove ",
      area.path()));
}

// The split that published `output_dir`, from its manifest; empty when none.
std::string PublishedSplitId(const std::string& output_dir) {
  absl::StatusOr<kvstore::Location> out = kvstore::ParseLocation(output_dir);
  if (!out.ok()) return "";
  absl::StatusOr<OrderedJson> manifest = ReadJsonAt(
      *out->driver, absl::StrCat(absl::StripSuffix(output_dir, "/"), "/", kManifestName));
  if (!manifest.ok()) return "";
  return FieldOr<std::string>(*manifest, "split_id", "");
}

// Stat of relative file `name` in `dir`.
absl::StatusOr<struct stat> StatIn(const Directory& dir, const std::string& name) {
  ASSIGN_OR_RETURN(Directory::Place place, dir.OpenParentOf(name));
  return place.folder.StatChild(place.name);
}

// Everything after every worker has recorded its files: checks every record against the plan
// (only the files the plan deals to its partition, each once, at its planned size) and the
// files in data/ (size and XXH3-64), writes the companion files and the manifest into data/,
// renames data/ to the output and removes the area. `hashed` are files the caller hashed
// while writing them in this run (name -> XXH3-64): they are not read again; every other file
// is, since another worker, a rerun or anything else with access to the area may have changed
// it after its record was written.
absl::StatusOr<ConversionResult> Publish(const Area& area, const Split& split,
                                         const ConversionSpec& spec,
                                         const PlannedConversion& planned,
                                         const RunControl& control,
                                         const std::map<std::string, uint64_t>& hashed) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(Directory data, area.dir.OpenChild(kDataName));
  std::vector<uint64_t> bytes;
  std::map<std::string, size_t> planned_index;
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    bytes.push_back(planned.plan.files[f].bytes);
    planned_index[planned.plan.files[f].name] = f;
  }
  const std::vector<int> assignment = AssignPartitions(bytes, split.count);
  std::vector<FileRecords> records(static_cast<size_t>(split.count));
  for (int i = 0; i < split.count; ++i) {
    ASSIGN_OR_RETURN(records[i], ReadRecord(area, RecordName(i, split.count), split, i),
                     absl::StrCat("partition ", i, "'s record"));
    for (const auto& [name, facts] : records[i]) {
      auto f = planned_index.find(name);
      if (f == planned_index.end() || assignment[f->second] != i ||
          facts.first != planned.plan.files[f->second].bytes) {
        return absl::DataLossError(
            absl::StrCat(area.dir.PathOf(RecordName(i, split.count)), " lists ", name, " (",
                         facts.first, " bytes), which is not ",
                         f == planned_index.end() || assignment[f->second] != i
                             ? absl::StrCat("a file the plan in ", area.dir.PathOf(kSplitName),
                                            " deals to partition ", i)
                             : absl::StrCat("the ", planned.plan.files[f->second].bytes,
                                            " bytes the plan gives it"),
                         "; nothing was published; ", RerunHint(i, split.count)));
      }
    }
  }
  ConversionResult result;
  result.output = NormalizeOutputPath(spec.output);
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    const FilePlan& file = planned.plan.files[f];
    const int owner = assignment[f];
    const FileRecords& record = records[owner];
    auto it = record.find(file.name);
    if (it == record.end()) {
      return absl::DataLossError(
          absl::StrCat(area.dir.PathOf(RecordName(owner, split.count)), " does not list ",
                       file.name, "; nothing was published; ", RerunHint(owner, split.count)));
    }
    auto st = StatIn(data, file.name);
    if (!st.ok() || !S_ISREG(st->st_mode) || static_cast<uint64_t>(st->st_size) != file.bytes) {
      return absl::DataLossError(absl::StrCat(
          data.PathOf(file.name), " is missing or not the ", file.bytes, " bytes partition ", owner,
          " recorded; nothing was published; ", RerunHint(owner, split.count)));
    }
    auto own = hashed.find(file.name);
    if (own != hashed.end() && own->second != it->second.second) {
      return absl::DataLossError(absl::StrCat(
          area.dir.PathOf(RecordName(owner, split.count)), " no longer has the XXH3-64 of ",
          file.name, " this worker wrote; nothing was published; ", RerunHint(owner, split.count)));
    }
    if (own == hashed.end()) {
      ASSIGN_OR_RETURN(uint64_t hash,
                       HashFile(kvstore::GetPosixDriver(), data.PathOf(file.name)));
      if (hash != it->second.second) {
        return absl::DataLossError(absl::StrCat(
            data.PathOf(file.name), " no longer has the XXH3-64 partition ", owner, " recorded (",
            Hex(it->second.second), ", now ", Hex(hash), "); nothing was published; ",
            RerunHint(owner, split.count), ", which publishes"));
      }
    }
    result.files.push_back(
        {file.name, file.bytes, it->second.second, static_cast<int>(file.tensors.size())});
    result.bytes_written += file.bytes;
    result.tensors += static_cast<int64_t>(file.tensors.size());
  }
  // The per-file records (output_commit.h) have served once every partition's record is in.
  RETURN_IF_ERROR(data.RemoveTree(kFileRecordsFolder),
                  "removing the records of finished data files before publishing");
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

// A file of /proc (one line), or "" when it cannot be read.
std::string ReadProcLine(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "re");
  if (file == nullptr) return "";
  char line[1024] = {};
  const bool read = std::fgets(line, sizeof(line), file) != nullptr;
  std::fclose(file);
  return read ? std::string(absl::StripAsciiWhitespace(line)) : "";
}

// The start time of process `pid` (clock ticks after boot, field 22 of /proc/PID/stat), which
// tells a process from a later one given the same pid; "" when there is no such process.
std::string ProcessStartTime(int64_t pid) {
  const std::string stat = ReadProcLine(absl::StrCat("/proc/", pid, "/stat"));
  const size_t comm_end = stat.rfind(')');
  if (comm_end == std::string::npos) return "";
  // Field 3 (state) follows the command name; the start time is field 22.
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(comm_end + 1), ' ', absl::SkipEmpty());
  return fields.size() > 19 ? std::string(fields[19]) : "";
}

// What tells this process apart from every other: its host and, for a check by pid, the boot
// and the pid namespace the pid belongs to.
OrderedJson ThisProcess() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  char pid_ns[128] = {};
  if (::readlink("/proc/self/ns/pid", pid_ns, sizeof(pid_ns) - 1) < 0) pid_ns[0] = 0;
  return OrderedJson{{"pid", static_cast<int64_t>(::getpid())},
                     {"host", host},
                     {"boot_id", ReadProcLine("/proc/sys/kernel/random/boot_id")},
                     {"pid_ns", pid_ns},
                     {"start_time", ProcessStartTime(::getpid())}};
}

// A worker's hold on its partition index: `partition-IIIII-of-KKKKK.claim` in the area, so
// that a second worker of the same index stops at once instead of removing the first one's
// `.partial` files. Created with Driver::CreateExclusive (link(2) on posix); its worker touches it
// every kClaimRefresh and removes it when it finishes, successful or not. A claim whose worker is
// gone is taken over: on the same host, boot and pid namespace when its pid is gone or belongs
// to a process started at another time; elsewhere when it was not refreshed for kClaimLease
// (measured against a file written in the area now, so both times come from the file server's
// clock). Of several workers taking over one stale claim, the one that links
// `<claim>.taken-<XXH3-64 of the stale claim>` first wins and renames its claim over it; the
// others see the winner's claim on their next look.
class PartitionClaim {
 public:
  static absl::StatusOr<std::unique_ptr<PartitionClaim>> Acquire(const Area& area, int index,
                                                                 int count) {
    const std::string name = ClaimName(index, count);
    OrderedJson contents = ThisProcess();
    contents["partition"] = index;
    contents["partitions"] = count;
    contents["since"] = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
    contents["token"] = Hex((uint64_t{std::random_device()()} << 32) | std::random_device()());
    const std::string text =
        contents.dump(-1, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
    const std::string where = area.dir.PathOf(name);
    for (int look = 0; look < 8; ++look) {
      const absl::Status created = area.driver->CreateExclusive(area.PathOf(name), text);
      if (created.ok()) {
        return std::unique_ptr<PartitionClaim>(new PartitionClaim(area, name, text));
      }
      if (!absl::IsAlreadyExists(created)) {
        return Annotate(created, absl::StrCat("claiming partition ", index, " of ", count));
      }
      absl::StatusOr<std::string> held = ReadSmallFileAt(*area.driver, area.PathOf(name));
      absl::StatusOr<struct stat> st = area.dir.StatChild(name);
      if (absl::IsNotFound(held.status()) || absl::IsNotFound(st.status())) continue;  // released
      RETURN_IF_ERROR(held.status(), absl::StrCat("reading the claim ", where));
      RETURN_IF_ERROR(st.status());
      const OrderedJson holder = OrderedJson::parse(*held, nullptr, /*allow_exceptions=*/false);
      ASSIGN_OR_RETURN(const bool live, HolderIsLive(area.dir, name, holder, *st));
      if (live) {
        return absl::FailedPreconditionError(absl::StrCat(
            "partition ", index, " of ", count, " is being written by another worker (pid ",
            FieldOr(holder, "pid", int64_t{-1}), " on host ",
            FieldOr<std::string>(holder, "host", "?"), ", since ",
            FieldOr<std::string>(holder, "since", "?"), "; ", where, ")"));
      }
      const std::string marker =
          absl::StrCat(name, ".taken-", Hex(XXH3_64bits(held->data(), held->size())));
      const absl::Status won = area.driver->CreateExclusive(area.PathOf(marker), text);
      if (absl::IsAlreadyExists(won)) continue;  // another worker took it over first
      RETURN_IF_ERROR(won, absl::StrCat("taking over the stale claim ", where));
      ASSIGN_OR_RETURN(const std::string fresh, WriteUniqueTemporary(area.dir, name, text));
      RETURN_IF_ERROR(area.dir.Rename(fresh, name),
                      absl::StrCat("taking over the stale claim ", where));
      RETURN_IF_ERROR(area.dir.Sync());
      return std::unique_ptr<PartitionClaim>(new PartitionClaim(area, name, text));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(where, " keeps changing: other workers of partition ", index, " of ", count,
                     " are starting; run one worker per partition"));
  }

  PartitionClaim(const PartitionClaim&) = delete;
  PartitionClaim& operator=(const PartitionClaim&) = delete;

  // Stops refreshing and removes the claim if it is still this worker's.
  ~PartitionClaim() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    refresher_.join();
    absl::StatusOr<std::string> held = ReadSmallFileAt(*area_.driver, area_.PathOf(name_));
    if (held.ok() && *held == contents_) area_.driver->Delete(area_.PathOf(name_)).IgnoreError();
  }

  // FailedPrecondition when another worker has taken the claim over (this one was judged gone:
  // stalled past the lease).
  absl::Status Held() const {
    absl::MutexLock lock(&mu_);
    if (!lost_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(area_.PathOf(name_),
                     " was taken over by another worker while this one wrote (stalled for "
                     "longer than ",
                     absl::FormatDuration(kClaimLease), "); its files are that worker's now"));
  }

 private:
  PartitionClaim(const Area& area, std::string name, std::string contents)
      : area_(area), name_(std::move(name)), contents_(std::move(contents)) {
    refresher_ = std::thread([this] { Refresh(); });
  }

  // Whether the worker holding claim `name` (`holder`, its stat `st`) may still be writing.
  static absl::StatusOr<bool> HolderIsLive(const Directory& dir, const std::string& name,
                                           const OrderedJson& holder, const struct stat& st) {
    const OrderedJson self = ThisProcess();
    const bool checkable = holder.is_object() && !self["boot_id"].get<std::string>().empty();
    if (checkable && FieldOr<std::string>(holder, "host", "") == self["host"] &&
        FieldOr<std::string>(holder, "boot_id", "") == self["boot_id"] &&
        FieldOr<std::string>(holder, "pid_ns", "") == self["pid_ns"]) {
      const int64_t pid = FieldOr(holder, "pid", int64_t{-1});
      const std::string started = pid > 0 ? ProcessStartTime(pid) : "";
      return !started.empty() && started == FieldOr<std::string>(holder, "start_time", "");
    }
    // Another host: by the lease, on the file server's clock.
    ASSIGN_OR_RETURN(const std::string probe,
                     WriteUniqueTemporary(dir, absl::StrCat(name, ".now"), ""));
    absl::StatusOr<struct stat> now = dir.StatChild(probe);
    dir.RemoveFile(probe).IgnoreError();
    RETURN_IF_ERROR(now.status());
    const absl::Time refreshed = absl::TimeFromTimespec(st.st_mtim);
    return absl::TimeFromTimespec(now->st_mtim) - refreshed < kClaimLease;
  }

  void Refresh() {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), kClaimRefresh)) {
      absl::StatusOr<std::string> held = ReadSmallFileAt(*area_.driver, area_.PathOf(name_));
      if (held.ok() && *held != contents_) {
        lost_ = true;
        return;
      }
      // Absent: the area was published and removed. A failed touch is retried next time.
      if (held.ok()) ::utimensat(area_.dir.fd(), name_.c_str(), nullptr, 0);
    }
  }

  const Area& area_;
  const std::string name_;
  const std::string contents_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::thread refresher_;
};

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
  RETURN_IF_ERROR(CheckPartitionedOutput(spec.output));
  // A non-empty output is refused before reading anything, unless it is this split's own
  // (a worker rerun after another one published).
  const std::string published_split = PublishedSplitId(spec.output);
  if (!spec.overwrite && published_split.empty()) {
    RETURN_IF_ERROR(CheckOutputDirUsable(spec.output));
  }
  ASSIGN_OR_RETURN(OrderedJson request, SpecToRequestJson(spec));
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec));
  const Split split = MakeSplit(std::move(request), count, planned.plan);
  if (published_split == split.id) return AlreadyPublished(spec, count);
  if (!published_split.empty() && !spec.overwrite) {
    RETURN_IF_ERROR(CheckOutputDirUsable(spec.output));
  }

  ASSIGN_OR_RETURN(Area area, OpenArea(spec.output, /*create=*/true));
  RETURN_IF_ERROR(JoinSplit(area, split));
  ASSIGN_OR_RETURN(Directory data, area.dir.OpenChild(kDataName, /*create=*/true));
  // One worker per index at a time: a second one would remove this one's `.partial` files.
  ASSIGN_OR_RETURN(std::unique_ptr<PartitionClaim> claim,
                   PartitionClaim::Acquire(area, index, count));
  const double plan_seconds = SecondsSince(start);

  // This worker's files, and what an earlier attempt of it committed.
  std::vector<uint64_t> bytes;
  for (const FilePlan& file : planned.plan.files) bytes.push_back(file.bytes);
  const std::vector<int> assignment = AssignPartitions(bytes, count);
  const std::string record_name = RecordName(index, count);
  FileRecords committed;
  absl::StatusOr<FileRecords> earlier = ReadRecord(area, record_name, split, index);
  if (earlier.ok()) {
    committed = *std::move(earlier);
  } else if (absl::IsDataLoss(earlier.status())) {
    // A damaged record of this partition: its files are checked and written as if none had
    // been recorded, and the record written again.
    RETURN_IF_ERROR(area.driver->Delete(area.PathOf(record_name)));
  } else if (!absl::IsNotFound(earlier.status())) {
    return earlier.status();
  }
  CopyPlan mine;
  mine.sources = planned.plan.sources;
  for (size_t f = 0; f < planned.plan.files.size(); ++f) {
    if (assignment[f] != index) continue;
    FilePlan& file = planned.plan.files[f];
    // A `.partial` of this worker's file was left by its killed attempt; other workers'
    // are theirs.
    if (auto place = data.OpenParentOf(file.name); place.ok()) {
      RETURN_IF_ERROR(place->folder.RemoveFile(absl::StrCat(place->name, ".partial")));
    }
    mine.total_bytes += file.bytes;
    mine.files.push_back(file);
  }
  mine.source_bytes_read = planned.plan.source_bytes_read;

  // Every data file this worker commits gets its output_commit record in data/ (plan id: the
  // split's), so that a rerun of a killed attempt reuses the files it finished. Records of
  // other partitions' files name no file of `mine` and are left alone.
  const OutputArea records(kvstore::GetPosixDriver(), data.path());
  ASSIGN_OR_RETURN(const AreaContents contents, records.List());
  ASSIGN_OR_RETURN(const ReusableFiles reuse, records.FindReusable(contents, mine, split.id),
                   absl::StrCat("partition ", PartitionName({index, count})));
  // Checked again by the executor, size and XXH3-64, before it reuses them.
  std::map<std::string, uint64_t> completed = reuse.files;
  for (const auto& [name, facts] : committed) completed.emplace(name, facts.second);

  ExecutorOptions options = ExecutorOptionsFor(spec, control);
  options.completed_files = completed;
  // The first error recording a finished file; the executor calls on_file_committed
  // serialized.
  absl::Status record_status;
  options.on_file_committed = [&](const WrittenFile& file) {
    if (record_status.ok()) record_status = records.RecordCommitted(split.id, file);
    if (control.on_file_committed) control.on_file_committed(file);
    TestFaultPoint("partition-file-committed", control.cancelled);
  };
  const Clock::time_point write_start = Clock::now();
  ASSIGN_OR_RETURN(ExecutionResult executed, Execute(mine, data, options),
                   absl::StrCat("partition ", PartitionName({index, count})));
  RETURN_IF_ERROR(record_status);

  FileRecords recorded;
  std::map<std::string, uint64_t> hashed;  // every file of this run was hashed as written or reused
  for (const WrittenFile& file : executed.files) {
    recorded[file.name] = {file.bytes, file.xxh3_64};
    hashed[file.name] = file.xxh3_64;
  }
  RETURN_IF_ERROR(claim->Held());
  RETURN_IF_ERROR(WriteFileAtomically(area.dir, record_name, RecordJson(split, index, recorded)),
                  "recording this partition's files");
  RETURN_IF_ERROR(area.dir.Sync());
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
    if (area.driver->Stat(area.PathOf(RecordName(i, count))).ok()) ++result.partitions_recorded;
  }
  if (result.partitions_recorded == count) {
    TestFaultPoint("partition-before-claim", control.cancelled);
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    OrderedJson claim = {{"partition", index}, {"host", host}, {"pid", ::getpid()}};
    absl::Status claimed = area.driver->CreateExclusive(
        area.PathOf(kClaimName),
        claim.dump(-1, ' ', false, OrderedJson::error_handler_t::replace) + "\n");
    if (absl::IsAlreadyExists(claimed)) {
      // Another worker publishes, unless the claim is this partition's own from an attempt
      // killed while publishing.
      absl::StatusOr<OrderedJson> holder = ReadJsonAt(*area.driver, area.PathOf(kClaimName));
      if (holder.ok()) {
        if (FieldOr(*holder, "partition", -1) == index) claimed = absl::OkStatus();
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
      absl::StatusOr<ConversionResult> published =
          Publish(area, split, spec, planned, control, hashed);
      if (!published.ok()) {
        // Nothing was published: a rerun of the partition the error names publishes.
        if (PublishedSplitId(result.output) != split.id) {
          area.driver->Delete(area.PathOf(kClaimName)).IgnoreError();
        }
        return Annotate(published.status(), "publishing the output");
      }
      result.published = true;
      result.publish_seconds = published->publish_seconds;
      // The index and the manifest; the other data files are their workers'.
      uint64_t data_bytes = 0;
      for (const FilePlan& file : planned.plan.files) data_bytes += file.bytes;
      result.bytes_written += published->bytes_written - data_bytes;
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
  RETURN_IF_ERROR(CheckPartitionedOutput(output_dir));
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
  ASSIGN_OR_RETURN(OrderedJson stored, ReadJsonAt(*area->driver, area->PathOf(kSplitName)));
  const std::string where = area->dir.PathOf(kSplitName);
  const int count = FieldOr(stored, "partitions", 0);
  if (count < 1 || count > kMaxPartitions || !stored.contains("request")) {
    return absl::DataLossError(absl::StrCat(where, " is not a split record"));
  }
  ASSIGN_OR_RETURN(ConversionSpec spec, SpecFromRequestJson(stored["request"], where));
  std::vector<int> missing;
  for (int i = 0; i < count; ++i) {
    if (!area->driver->Stat(area->PathOf(RecordName(i, count))).ok()) missing.push_back(i);
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "partitions ", absl::StrJoin(missing, ", "), " of ", count,
        " have not recorded their files yet (", area->path(), "); run them, then commit again"));
  }
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec),
                   absl::StrCat("planning the conversion ", where, " describes"));
  const Split split = MakeSplit(stored["request"], count, planned.plan);
  if (split.id != FieldOr<std::string>(stored, "split_id", "")) {
    return absl::FailedPreconditionError(
        absl::StrCat("the input ", spec.input, " no longer plans to the files ", where,
                     " lists (it changed after the workers ran); rerun the conversion"));
  }
  // Explicit: a claim left by a worker killed while publishing is taken over.
  absl::Status claimed = area->driver->CreateExclusive(
      area->PathOf(kClaimName), OrderedJson({{"commit", true}}).dump() + "\n");
  if (!claimed.ok() && !absl::IsAlreadyExists(claimed)) return claimed;
  absl::StatusOr<ConversionResult> result = Publish(*area, split, spec, planned, control, {});
  if (!result.ok()) {
    if (PublishedSplitId(output_dir) != split.id) {
      area->driver->Delete(area->PathOf(kClaimName)).IgnoreError();
    }
    return result.status();
  }
  result->seconds = SecondsSince(start);
  return result;
}

}  // namespace reshard
