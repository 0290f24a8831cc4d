#include "lib/engine/output_commit.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "lib/core/status.h"
#include "lib/core/test_faults.h"
#include "lib/core/version.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Adds every file below `path` (named `relative` inside the area, "" for the root) to `files`.
absl::Status ListBelow(const kvstore::Driver& driver, const std::string& path,
                       const std::string& relative, std::vector<kvstore::FileEntry>& files) {
  ASSIGN_OR_RETURN(kvstore::Listing listing, driver.List(path));
  for (kvstore::FileEntry& file : listing.files) {
    file.name = relative.empty() ? file.name : absl::StrCat(relative, "/", file.name);
    files.push_back(std::move(file));
  }
  for (const std::string& folder : listing.folders) {
    RETURN_IF_ERROR(ListBelow(driver, absl::StrCat(path, "/", folder),
                              relative.empty() ? folder : absl::StrCat(relative, "/", folder),
                              files));
  }
  return absl::OkStatus();
}

}  // namespace

std::string OutputPlanId(const std::string& request_json, const CopyPlan& plan) {
  OrderedJson request = OrderedJson::parse(request_json, nullptr, /*allow_exceptions=*/false);
  if (request.is_object()) {
    // They change no byte of the output.
    request.erase("overwrite");
    request.erase("update_latest");
  }
  OrderedJson identity;
  identity["version"] = kReshardVersion;
  identity["request"] = std::move(request);
  OrderedJson files = OrderedJson::array();
  for (const FilePlan& file : plan.files) files.push_back({file.name, file.bytes});
  identity["files"] = std::move(files);
  OrderedJson sources = OrderedJson::array();
  for (const SourceFile& source : plan.sources) {
    // A source's version too, where its storage has them: files finished from a replaced
    // input are not kept.
    OrderedJson entry = {source.path, source.size};
    if (!source.version.empty()) entry.push_back(source.version);
    sources.push_back(std::move(entry));
  }
  identity["sources"] = std::move(sources);
  const std::string canonical =
      identity.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  return absl::StrFormat("%016x", XXH3_64bits(canonical.data(), canonical.size()));
}

namespace {

// The record as JSON, for its own file and for a line of the log.
OrderedJson FileRecordObject(const FileRecord& record) {
  OrderedJson json;
  json["tool"] = "reshard";
  json["plan_id"] = record.plan_id;
  json["name"] = record.name;
  json["bytes"] = record.bytes;
  json["xxh3_64"] = absl::StrFormat("%016x", record.xxh3_64);
  json["generation"] = record.generation;
  return json;
}

}  // namespace

std::string FileRecordJson(const FileRecord& record) {
  return FileRecordObject(record).dump(1, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

std::string FileRecordLine(const FileRecord& record) {
  return FileRecordObject(record).dump(-1, ' ', false, OrderedJson::error_handler_t::replace) +
         "\n";
}

std::optional<FileRecord> ParseFileRecord(absl::string_view text) {
  const OrderedJson json = OrderedJson::parse(text.begin(), text.end(), nullptr,
                                              /*allow_exceptions=*/false);
  FileRecord record;
  if (!json.is_object() || json.value("tool", "") != "reshard" || !json.contains("bytes") ||
      !json["bytes"].is_number_unsigned() || !json.contains("generation") ||
      !json["generation"].is_string() ||
      !absl::SimpleHexAtoi(json.value("xxh3_64", ""), &record.xxh3_64)) {
    return std::nullopt;
  }
  record.plan_id = json.value("plan_id", "");
  record.name = json.value("name", "");
  record.bytes = json["bytes"].get<uint64_t>();
  record.generation = json["generation"].get<std::string>();
  if (record.plan_id.empty() || record.name.empty() || record.generation.empty()) {
    return std::nullopt;
  }
  return record;
}

std::string FileRecordName(absl::string_view name) {
  return absl::StrCat(kFileRecordsFolder, "/", name, ".json");
}

std::string FileRecordLogName(absl::string_view writer) {
  return absl::StrCat(kFileRecordsFolder, "/records-", writer, ".jsonl");
}

bool IsFileRecordLog(absl::string_view name) {
  if (name == kFileRecordLogName) return true;
  return absl::ConsumePrefix(&name, absl::StrCat(kFileRecordsFolder, "/records-")) &&
         absl::ConsumeSuffix(&name, ".jsonl") && !name.empty() &&
         name.find('/') == absl::string_view::npos;
}

OutputArea::OutputArea(const kvstore::Driver& driver, std::string root)
    : driver_(&driver), root_(std::move(root)) {}

std::string OutputArea::PathOf(absl::string_view name) const {
  return absl::StrCat(root_, "/", name);
}

absl::StatusOr<AreaContents> OutputArea::List() const {
  AreaContents contents;
  const absl::Status listed = ListBelow(*driver_, root_, "", contents.files);
  if (absl::IsNotFound(listed)) return AreaContents();
  RETURN_IF_ERROR(listed, absl::StrCat("checking the output ", root_));
  for (const kvstore::FileEntry& file : contents.files) {
    contents.manifest = contents.manifest || file.name == kManifestName;
    contents.marker = contents.marker || file.name == kInProgressMarkerName;
  }
  return contents;
}

absl::Status OutputArea::Put(absl::string_view name, absl::string_view contents) const {
  return driver_->WriteFile(PathOf(name), contents).status();
}

absl::Status OutputArea::WriteMarker(const std::string& input) const {
  OrderedJson marker;
  marker["tool"] = "reshard";
  marker["version"] = kReshardVersion;
  marker["input"] = input;
  marker["started_unix"] = static_cast<int64_t>(std::time(nullptr));
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) marker["host"] = host;
  marker["pid"] = static_cast<int64_t>(getpid());
  return Annotate(Put(kInProgressMarkerName,
                      marker.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n"),
                  "marking the output as being written");
}

absl::Status OutputArea::WriteRecord(const FileRecord& record) const {
  return Annotate(
      driver_->WriteFileUnsynced(PathOf(FileRecordName(record.name)), FileRecordJson(record))
          .status(),
      absl::StrCat("recording the finished data file ", PathOf(record.name)));
}

absl::StatusOr<FileRecord> OutputArea::CommittedRecord(const std::string& plan_id,
                                                       const WrittenFile& file) const {
  ASSIGN_OR_RETURN(const kvstore::PathStat stat, driver_->Stat(PathOf(file.name)),
                   absl::StrCat("recording the finished data file ", PathOf(file.name)));
  return FileRecord{plan_id, file.name, file.bytes, file.xxh3_64, stat.generation};
}

absl::Status OutputArea::RecordCommitted(const std::string& plan_id,
                                         const WrittenFile& file) const {
  ASSIGN_OR_RETURN(const FileRecord record, CommittedRecord(plan_id, file));
  return WriteRecord(record);
}

absl::StatusOr<std::optional<std::string>> OutputArea::ReadSmallFile(const std::string& name,
                                                                     uint64_t max_bytes) const {
  const std::string path = PathOf(name);
  const absl::StatusOr<kvstore::PathStat> stat = driver_->Stat(path);
  if (absl::IsNotFound(stat.status())) return std::nullopt;  // removed since the listing
  RETURN_IF_ERROR(stat.status(), absl::StrCat("reading the record ", path));
  if (stat->is_folder || stat->size > max_bytes) return std::nullopt;
  std::string text(stat->size, '\0');
  const absl::Status read = driver_->ReadRange(path, 0, absl::MakeSpan(text), *stat);
  if (absl::IsNotFound(read)) return std::nullopt;
  RETURN_IF_ERROR(read, absl::StrCat("reading the record ", path, " of finished data files"));
  return text;
}

absl::Status OutputArea::ForEachLogLine(
    const std::string& name, const std::function<void(absl::string_view)>& on_line) const {
  const std::string path = PathOf(name);
  const absl::StatusOr<kvstore::PathStat> stat = driver_->Stat(path);
  if (absl::IsNotFound(stat.status())) return absl::OkStatus();  // removed since the listing
  RETURN_IF_ERROR(stat.status(), absl::StrCat("reading the records log ", path));
  if (stat->is_folder) return absl::OkStatus();
  std::string chunk(kFileRecordLogChunkBytes, '\0');
  std::string line;       // the line read so far, at most kMaxFileRecordBytes
  bool too_long = false;  // the line read so far is longer: skipped up to its '\n'
  for (uint64_t offset = 0; offset < stat->size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), stat->size - offset));
    const absl::Status read =
        driver_->ReadRange(path, offset, absl::MakeSpan(chunk.data(), n), *stat);
    // Gone, or cut short by its writer starting it anew: its records are that writer's.
    if (absl::IsNotFound(read) || absl::IsDataLoss(read)) return absl::OkStatus();
    RETURN_IF_ERROR(read,
                    absl::StrCat("reading the records log ", path, " at byte offset ", offset));
    offset += n;
    absl::string_view rest(chunk.data(), n);
    while (!rest.empty()) {
      const size_t end = rest.find('\n');
      const absl::string_view piece = rest.substr(0, end);
      if (!too_long && line.size() + piece.size() > kMaxFileRecordBytes) {
        too_long = true;
        line.clear();
      }
      if (!too_long) line.append(piece.data(), piece.size());
      if (end == absl::string_view::npos) break;
      if (!too_long && !line.empty()) on_line(line);
      line.clear();
      too_long = false;
      rest.remove_prefix(end + 1);
    }
  }
  // A last line without its '\n' (torn, or written by a writer still running).
  if (!too_long && !line.empty()) on_line(line);
  return absl::OkStatus();
}

absl::StatusOr<ReusableFiles> OutputArea::FindReusable(const AreaContents& contents,
                                                       const CopyPlan& plan,
                                                       const std::string& plan_id) const {
  std::map<std::string, uint64_t> planned;
  for (const FilePlan& file : plan.files) planned[file.name] = file.bytes;
  // Data file -> its record of this plan and the record's own file ("" for a line of the log).
  std::map<std::string, std::pair<FileRecord, std::string>> recorded;
  std::map<std::string, FileRecord> logged;
  const std::string records = absl::StrCat(kFileRecordsFolder, "/");
  for (const kvstore::FileEntry& entry : contents.files) {
    if (IsFileRecordLog(entry.name)) {
      RETURN_IF_ERROR(ForEachLogLine(entry.name, [&](absl::string_view line) {
        std::optional<FileRecord> record = ParseFileRecord(line);
        if (record.has_value() && record->plan_id == plan_id) {
          std::string name = record->name;
          logged.insert_or_assign(std::move(name), *std::move(record));
        }
      }));
      continue;
    }
    if (!absl::StartsWith(entry.name, records) || !absl::EndsWith(entry.name, ".json") ||
        entry.size > kMaxFileRecordBytes) {
      continue;
    }
    ASSIGN_OR_RETURN(const std::optional<std::string> text,
                     ReadSmallFile(entry.name, kMaxFileRecordBytes));
    if (!text.has_value()) continue;
    std::optional<FileRecord> record = ParseFileRecord(*text);
    if (!record.has_value() || record->plan_id != plan_id ||
        entry.name != FileRecordName(record->name)) {
      continue;
    }
    std::string name = record->name;
    recorded.insert_or_assign(std::move(name), std::make_pair(*std::move(record), entry.name));
  }
  for (auto& [name, record] : logged) {
    recorded.insert_or_assign(name, std::make_pair(std::move(record), std::string()));
  }
  ReusableFiles reuse;
  for (const auto& [name, entry] : recorded) {
    const FileRecord* const record = &entry.first;
    auto file = planned.find(record->name);
    if (file == planned.end() || file->second != record->bytes) continue;
    // The file itself, now: it may have been replaced or removed since it was recorded.
    const absl::StatusOr<kvstore::PathStat> now = driver_->Stat(PathOf(record->name));
    if (!now.ok() && !absl::IsNotFound(now.status())) {
      return Annotate(now.status(), absl::StrCat("checking the finished data file ",
                                                 PathOf(record->name), " for reuse"));
    }
    if (!now.ok() || now->is_folder || now->size != record->bytes ||
        now->generation != record->generation) {
      ++reuse.mismatches;
      continue;
    }
    reuse.files[record->name] = record->xxh3_64;
    if (!entry.second.empty()) reuse.kept.insert(entry.second);
    reuse.kept.insert(record->name);
    reuse.records.push_back(*record);
  }
  return reuse;
}

absl::Status OutputArea::Prepare(const AreaContents& contents, const std::set<std::string>& kept,
                                 const std::string& input) const {
  if (contents.manifest) {
    RETURN_IF_ERROR(driver_->Delete(PathOf(kManifestName)),
                    "removing the old manifest before replacing the output");
  }
  RETURN_IF_ERROR(WriteMarker(input));
  for (const kvstore::FileEntry& file : contents.files) {
    if (file.name == kManifestName || file.name == kInProgressMarkerName ||
        kept.count(file.name) > 0) {
      continue;
    }
    RETURN_IF_ERROR(driver_->Delete(PathOf(file.name)), "removing the old contents of the output");
  }
  return Annotate(driver_->AbortUnfinishedWrites(absl::StrCat(root_, "/")),
                  absl::StrCat("dropping unfinished writes under ", root_));
}

void OutputArea::RemoveRecordsAndMarker() const {
  std::vector<kvstore::FileEntry> records;
  if (ListBelow(*driver_, PathOf(kFileRecordsFolder), kFileRecordsFolder, records).ok()) {
    for (const kvstore::FileEntry& record : records) {
      driver_->Delete(PathOf(record.name)).IgnoreError();
    }
  }
  driver_->Delete(PathOf(kInProgressMarkerName)).IgnoreError();
}

absl::StatusOr<FileRecordLog> FileRecordLog::Create(const Directory& area, absl::string_view name,
                                                    const std::vector<FileRecord>& records) {
  const std::string path = area.PathOf(name);
  absl::string_view inside = name;  // the log's name inside the records folder
  if (!absl::ConsumePrefix(&inside, absl::StrCat(kFileRecordsFolder, "/")) || inside.empty() ||
      inside.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the records log ", path, " is not a file of ", kFileRecordsFolder));
  }
  ASSIGN_OR_RETURN(const Directory folder, area.OpenChild(kFileRecordsFolder, /*create=*/true),
                   absl::StrCat("creating the records of finished data files ", path));
  ASSIGN_OR_RETURN(const int fd, folder.OpenFile(inside, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND),
                   absl::StrCat("creating the records of finished data files ", path));
  FileRecordLog log(fd, path);
  for (const FileRecord& record : records) RETURN_IF_ERROR(log.Append(record));
  return log;
}

FileRecordLog::FileRecordLog(FileRecordLog&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

FileRecordLog::~FileRecordLog() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileRecordLog::Append(const FileRecord& record) {
  // One write of a few hundred bytes: a killed process leaves the line whole or absent.
  const std::string line = FileRecordLine(record);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return ErrnoToStatus(n < 0 ? errno : EIO, absl::StrCat("recording the finished data file ",
                                                             record.name, " in ", path_));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Streams into the driver's Writer; Close commits the file and tells the sink its generation.
class OutputAreaSink::FileWriter final : public ByteWriter {
 public:
  FileWriter(std::unique_ptr<kvstore::Writer> file, OutputAreaSink& sink, std::string name)
      : file_(std::move(file)), sink_(sink), name_(std::move(name)) {}
  // A file not committed leaves nothing under its name.
  ~FileWriter() override {
    if (!closed_) file_->Abort();
  }

  absl::Status Write(absl::string_view data) override {
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(name_, ": written after Close"));
    return file_->Append(data);
  }
  absl::Status Close() override {
    if (closed_) return absl::FailedPreconditionError(absl::StrCat(name_, ": closed twice"));
    closed_ = true;
    ASSIGN_OR_RETURN(std::string generation, file_->Commit());
    sink_.Committed(name_, std::move(generation));
    return absl::OkStatus();
  }
  uint64_t pos() const override { return file_->pos(); }

 private:
  const std::unique_ptr<kvstore::Writer> file_;
  OutputAreaSink& sink_;
  const std::string name_;
  bool closed_ = false;
};

OutputAreaSink::OutputAreaSink(const OutputArea& area, std::string plan_id,
                               std::map<std::string, std::string> metadata,
                               const std::atomic<bool>* cancelled, uint64_t writer_budget)
    : area_(area),
      plan_id_(std::move(plan_id)),
      metadata_(std::move(metadata)),
      cancelled_(cancelled),
      writer_budget_(writer_budget) {}

absl::StatusOr<std::unique_ptr<ByteWriter>> OutputAreaSink::Open(const std::string& name,
                                                                 uint64_t bytes) {
  kvstore::WriteOptions options;
  options.size_hint = bytes;
  options.memory_budget = writer_budget_;
  options.metadata = metadata_;
  ASSIGN_OR_RETURN(std::unique_ptr<kvstore::Writer> file,
                   area_.driver().Write(area_.PathOf(name), options));
  // A kill here leaves finished files and an unfinished write (crash tests).
  if (committed_.load() > 0) TestFaultPoint("object-upload-started", cancelled_);
  return std::unique_ptr<ByteWriter>(new FileWriter(std::move(file), *this, name));
}

void OutputAreaSink::Committed(const std::string& name, std::string generation) {
  absl::MutexLock lock(&mu_);
  generations_[name] = std::move(generation);
}

absl::Status OutputAreaSink::Record(const WrittenFile& file) {
  committed_.fetch_add(1);
  std::optional<std::string> generation;
  {
    absl::MutexLock lock(&mu_);
    auto it = generations_.find(file.name);
    if (it != generations_.end()) generation = it->second;
  }
  if (!generation.has_value()) return absl::OkStatus();  // reused: recorded already
  if (generation->empty()) {
    // The driver gives it only on a Stat (posix).
    ASSIGN_OR_RETURN(const kvstore::PathStat stat, area_.driver().Stat(area_.PathOf(file.name)),
                     absl::StrCat("recording the finished data file ", area_.PathOf(file.name)));
    generation = stat.generation;
  }
  return area_.WriteRecord(FileRecord{plan_id_, file.name, file.bytes, file.xxh3_64, *generation});
}

}  // namespace reshard
