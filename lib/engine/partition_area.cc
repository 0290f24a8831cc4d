#include "lib/engine/partition_area.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "lib/engine/output_commit.h"
#include "lib/io/directory.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/path_confinement.h"
#include "lib/io/staging_dir.h"

namespace reshard {

using OrderedJson = nlohmann::ordered_json;

namespace {

// Records, split.json and the claims are small; a larger one is not reshard's.
constexpr uint64_t kMaxAreaFileBytes = 64ull << 20;

std::string Dump(const OrderedJson& json, int indent) {
  return json.dump(indent, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

std::string DescribeSplit(const OrderedJson& split) {
  const OrderedJson request = FieldOr(split, "request", OrderedJson::object());
  return absl::StrCat(FieldOr(split, "partitions", 0), " partitions of a ",
                      FieldOr<std::string>(request, "kind", "?"), " of ",
                      FieldOr<std::string>(request, "input", "?"), " (",
                      FieldOr<std::string>(request, "output_format", "?"), ", dtype ",
                      FieldOr<std::string>(request, "dtype", "?"), ")");
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
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(comm_end + 1), ' ', absl::SkipEmpty());
  return fields.size() > 19 ? std::string(fields[19]) : "";
}

std::string ExpiryText(absl::Time time) {
  return absl::FormatTime(absl::RFC3339_full, time, absl::UTCTimeZone());
}

// Whether the claim `holder` (read now) may still be held by a running worker.
bool HolderIsLive(const OrderedJson& holder, const ClaimOptions& options) {
  const OrderedJson& self = options.identity;
  const std::string boot_id = FieldOr<std::string>(self, "boot_id", "");
  if (!boot_id.empty() &&
      FieldOr<std::string>(holder, "host", "") == FieldOr<std::string>(self, "host", "") &&
      FieldOr<std::string>(holder, "boot_id", "") == boot_id &&
      FieldOr<std::string>(holder, "pid_ns", "") == FieldOr<std::string>(self, "pid_ns", "")) {
    // On this host: by its process, at once.
    const int64_t pid = FieldOr(holder, "pid", int64_t{-1});
    const std::string started = pid > 0 ? ProcessStartTime(pid) : "";
    return !started.empty() && started == FieldOr<std::string>(holder, "start_time", "");
  }
  // Elsewhere: by its lease. A claim without a readable expiry was not written by a holder
  // that refreshes it.
  absl::Time expires;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, FieldOr<std::string>(holder, "expires", ""), &expires,
                       &error)) {
    return false;
  }
  return options.now() < expires;
}

absl::Status HeldBy(const OrderedJson& holder, int index, int count, const std::string& where,
                    absl::string_view how) {
  return absl::FailedPreconditionError(absl::StrCat(
      "partition ", index, " of ", count, " is being written by another worker (pid ",
      FieldOr(holder, "pid", int64_t{-1}), " on host ", FieldOr<std::string>(holder, "host", "?"),
      ", since ", FieldOr<std::string>(holder, "since", "?"), "; ", where, ")", how));
}

}  // namespace

std::string PartitionArea::PathOf(absl::string_view file) const {
  return absl::StrCat(root, "/", file);
}

absl::StatusOr<PartitionArea> LocatePartitionArea(const std::string& output) {
  ASSIGN_OR_RETURN(const kvstore::Location location, kvstore::ParseLocation(output), "output");
  PartitionArea area;
  area.driver = location.driver;
  if (area.driver->has_folders()) {
    const OutputLocation place = SplitOutputPath(output);
    area.parent = place.parent;
    area.name = place.name;
    area.output = NormalizeOutputPath(output);
  } else {
    ASSIGN_OR_RETURN(area.output, area.driver->ConfinedPath(output, /*must_exist=*/false),
                     "output");
    const size_t scheme_end = area.output.find("://");
    const size_t from = scheme_end == std::string::npos ? 0 : scheme_end + 3;
    const size_t slash = area.output.rfind('/');
    if (slash != std::string::npos && slash >= from) {
      area.parent = area.output.substr(0, slash);
      area.name = area.output.substr(slash + 1);
    }
  }
  if (area.parent.empty() || !CheckPlainName(area.name).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", output,
                     " does not end in a folder name: a partitioned conversion needs a place "
                     "beside the output for its shared area"));
  }
  const std::string area_name = absl::StrCat(".", area.name, ".reshard-partitions");
  area.root = area.driver->has_folders() ? (std::filesystem::path(area.parent) / area_name).string()
                                         : absl::StrCat(area.parent, "/", area_name);
  return area;
}

void RemovePartitionArea(const PartitionArea& area) {
  if (area.driver->has_folders()) {
    absl::StatusOr<Directory> parent = OpenExistingFolder(area.parent);
    if (parent.ok()) {
      parent->RemoveTree(std::filesystem::path(area.root).filename().string()).IgnoreError();
    }
    return;
  }
  const OutputArea files(*area.driver, area.root);
  absl::StatusOr<AreaContents> contents = files.List();
  if (!contents.ok()) return;
  for (const kvstore::FileEntry& file : contents->files) {
    area.driver->Delete(files.PathOf(file.name)).IgnoreError();
  }
  area.driver->AbortUnfinishedWrites(area.root + "/").IgnoreError();
}

absl::StatusOr<std::pair<std::string, kvstore::PathStat>> ReadSmallFile(
    const kvstore::Driver& driver, const std::string& path) {
  ASSIGN_OR_RETURN(const kvstore::PathStat stat, driver.Stat(path));
  if (stat.is_folder || stat.size > kMaxAreaFileBytes) {
    return absl::DataLossError(absl::StrCat(path, " is a folder or larger than ", kMaxAreaFileBytes,
                                            " bytes; not a reshard record"));
  }
  std::string text(stat.size, '\0');
  RETURN_IF_ERROR(driver.ReadRange(path, 0, absl::MakeSpan(text), stat));
  return std::make_pair(std::move(text), stat);
}

absl::StatusOr<OrderedJson> ReadJsonFile(const kvstore::Driver& driver, const std::string& path) {
  ASSIGN_OR_RETURN(const auto read, ReadSmallFile(driver, path));
  OrderedJson json = read.first.empty()
                         ? OrderedJson()
                         : OrderedJson::parse(read.first, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is not a JSON object"));
  }
  return json;
}

std::string Hex16(uint64_t value) { return absl::StrFormat("%016x", value); }

std::string PartitionRecordName(int index, int count) {
  return absl::StrFormat("partition-%05d-of-%05d.json", index, count);
}

std::string PartitionClaimName(int index, int count) {
  return absl::StrFormat("partition-%05d-of-%05d.claim", index, count);
}

std::string RerunHint(int index, int count) {
  return absl::StrCat("rerun partition ", index, " of ", count, " (--partition ", index, "/", count,
                      ")");
}

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
  split.id = Hex16(XXH3_64bits(canonical.data(), canonical.size()));
  split.json["split_id"] = split.id;
  return split;
}

absl::Status JoinSplit(const PartitionArea& area, const Split& split) {
  const std::string path = area.PathOf(kSplitName);
  const absl::Status created = area.driver->CreateExclusive(path, Dump(split.json, 1));
  if (created.ok() || !absl::IsAlreadyExists(created)) return created;
  ASSIGN_OR_RETURN(OrderedJson existing, ReadJsonFile(*area.driver, path));
  if (FieldOr<std::string>(existing, "split_id", "") == split.id) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the output is being assembled by another partitioned conversion (", path, ": ",
      DescribeSplit(existing), "); this worker's is ", DescribeSplit(split.json),
      " with another request or plan. Finish that one (reshardctl commit) or remove ", area.root));
}

absl::Status WritePartitionRecord(const PartitionArea& area, const Split& split, int index,
                                  const RecordedFiles& files) {
  OrderedJson record;
  record["split_id"] = split.id;
  record["partition"] = index;
  record["partitions"] = split.count;
  OrderedJson list = OrderedJson::array();
  for (const auto& [name, facts] : files) {
    list.push_back({{"name", name}, {"bytes", facts.first}, {"xxh3_64", Hex16(facts.second)}});
  }
  record["files"] = std::move(list);
  const std::string path = area.PathOf(PartitionRecordName(index, split.count));
  return Annotate(area.driver->WriteFile(path, Dump(record, 1)).status(),
                  absl::StrCat("recording partition ", index, "'s files in ", path));
}

absl::StatusOr<RecordedFiles> ReadPartitionRecord(const PartitionArea& area, const Split& split,
                                                  int index) {
  const std::string hint = RerunHint(index, split.count);
  const std::string where = area.PathOf(PartitionRecordName(index, split.count));
  absl::StatusOr<OrderedJson> read = ReadJsonFile(*area.driver, where);
  if (absl::IsDataLoss(read.status())) {
    return absl::DataLossError(absl::StrCat(read.status().message(), "; ", hint));
  }
  if (!read.ok()) return read.status();
  const OrderedJson& record = *read;
  if (FieldOr<std::string>(record, "split_id", "") != split.id ||
      FieldOr(record, "partition", -1) != index) {
    return absl::DataLossError(absl::StrCat(where, " belongs to another split or partition than ",
                                            split.id, " partition ", index, "; ", hint));
  }
  if (!record.contains("files") || !record["files"].is_array()) {
    return absl::DataLossError(absl::StrCat(where, " has no \"files\" list; ", hint));
  }
  RecordedFiles files;
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

absl::StatusOr<std::unique_ptr<PartitionClaim>> PartitionClaim::Acquire(const PartitionArea& area,
                                                                        int index, int count,
                                                                        ClaimOptions options) {
  if (options.identity.is_null()) options.identity = ThisProcess();
  const std::string name = PartitionClaimName(index, count);
  const std::string where = area.PathOf(name);
  OrderedJson contents = options.identity;
  contents["partition"] = index;
  contents["partitions"] = count;
  contents["since"] = absl::FormatTime(absl::RFC3339_sec, options.now(), absl::UTCTimeZone());
  contents["token"] = Hex16((uint64_t{std::random_device()()} << 32) | std::random_device()());
  contents["heartbeat"] = 0;
  contents["expires"] = ExpiryText(options.now() + options.lease);
  const std::string text = Dump(contents, -1);
  for (int look = 0; look < 8; ++look) {
    const absl::Status created = area.driver->CreateExclusive(where, text);
    if (created.ok()) {
      return std::unique_ptr<PartitionClaim>(
          new PartitionClaim(area, where, std::move(contents), std::move(options)));
    }
    if (!absl::IsAlreadyExists(created)) {
      return Annotate(created, absl::StrCat("claiming partition ", index, " of ", count));
    }
    absl::StatusOr<std::pair<std::string, kvstore::PathStat>> held =
        ReadSmallFile(*area.driver, where);
    if (absl::IsNotFound(held.status())) continue;  // released meanwhile
    // Rewritten between the Stat and the read: the holder refreshed it.
    if (absl::IsFailedPrecondition(held.status())) continue;
    RETURN_IF_ERROR(held.status(), absl::StrCat("reading the claim ", where));
    const OrderedJson holder = OrderedJson::parse(held->first, nullptr, /*allow_exceptions=*/false);
    if (HolderIsLive(holder, options)) return HeldBy(holder, index, count, where, "");
    if (options.on_stale) options.on_stale();
    // Stale: taken over by the one worker that creates the marker of these bytes.
    const std::string marker =
        absl::StrCat(where, ".taken-", Hex16(XXH3_64bits(held->first.data(), held->first.size())));
    const absl::Status won = area.driver->CreateExclusive(marker, text);
    if (absl::IsAlreadyExists(won)) {
      return absl::FailedPreconditionError(
          absl::StrCat("partition ", index, " of ", count,
                       " is being written by another worker, which took over the stale claim ",
                       where, " first (", marker, "); run one worker per partition"));
    }
    RETURN_IF_ERROR(won, absl::StrCat("taking over the stale claim ", where));
    absl::StatusOr<kvstore::PathStat> now = area.driver->Stat(where);
    if (now.ok() && now->generation != held->second.generation) {
      // Its holder refreshed it after all, or a worker that found none created it.
      return absl::FailedPreconditionError(absl::StrCat(
          "partition ", index, " of ", count, " is being written by another worker: ", where,
          " changed while this worker took it over (generation ", held->second.generation, ", now ",
          now->generation, "); run one worker per partition"));
    }
    if (!now.ok() && !absl::IsNotFound(now.status())) return now.status();
    RETURN_IF_ERROR(area.driver->Delete(where),
                    absl::StrCat("taking over the stale claim ", where));
    const absl::Status replaced = area.driver->CreateExclusive(where, text);
    if (absl::IsAlreadyExists(replaced)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "partition ", index, " of ", count, " is being written by another worker, which created ",
          where, " while this one took over its stale claim; run one worker per partition"));
    }
    RETURN_IF_ERROR(replaced, absl::StrCat("taking over the stale claim ", where));
    return std::unique_ptr<PartitionClaim>(
        new PartitionClaim(area, where, std::move(contents), std::move(options)));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(where, " keeps changing: other workers of partition ", index, " of ", count,
                   " are starting; run one worker per partition"));
}

PartitionClaim::PartitionClaim(const PartitionArea& area, std::string path, OrderedJson contents,
                               ClaimOptions options)
    : driver_(*area.driver),
      path_(std::move(path)),
      token_(FieldOr<std::string>(contents, "token", "")),
      options_(std::move(options)),
      contents_(std::move(contents)) {
  refresher_ = std::thread([this] { RefreshLoop(); });
}

PartitionClaim::~PartitionClaim() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  refresher_.join();
  absl::StatusOr<OrderedJson> held = ReadJsonFile(driver_, path_);
  if (held.ok() && FieldOr<std::string>(*held, "token", "") == token_) {
    driver_.Delete(path_).IgnoreError();
  }
}

std::string PartitionClaim::Text() const { return Dump(contents_, -1); }

absl::Status PartitionClaim::Refresh() {
  absl::MutexLock lock(&mu_);
  if (lost_) return LostStatus();
  absl::StatusOr<OrderedJson> held = ReadJsonFile(driver_, path_);
  // Absent: the area was published and removed.
  if (absl::IsNotFound(held.status())) return absl::OkStatus();
  RETURN_IF_ERROR(held.status(), absl::StrCat("refreshing the claim ", path_));
  if (FieldOr<std::string>(*held, "token", "") != token_) {
    lost_ = true;
    return LostStatus();
  }
  contents_["heartbeat"] = FieldOr(contents_, "heartbeat", int64_t{0}) + 1;
  contents_["expires"] = ExpiryText(options_.now() + options_.lease);
  return Annotate(driver_.WriteFile(path_, Text()).status(),
                  absl::StrCat("refreshing the claim ", path_));
}

absl::Status PartitionClaim::Held() const {
  absl::MutexLock lock(&mu_);
  if (!lost_) return absl::OkStatus();
  return LostStatus();
}

absl::Status PartitionClaim::LostStatus() const {
  return absl::FailedPreconditionError(absl::StrCat(
      path_, " was taken over by another worker while this one wrote (stalled for longer than ",
      absl::FormatDuration(options_.lease), "); its files are that worker's now"));
}

void PartitionClaim::RefreshLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.refresh)) return;
    }
    // A failed refresh is retried next time; a lost claim ends the refreshing.
    if (Refresh().ok()) continue;
    absl::MutexLock lock(&mu_);
    if (lost_) return;
  }
}

}  // namespace reshard
