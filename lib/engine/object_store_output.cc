#include "lib/engine/object_store_output.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/core/test_faults.h"
#include "lib/core/version.h"
#include "lib/exec/executor.h"
#include "lib/io/s3/default_client.h"
#include "lib/io/s3/s3_client.h"
#include "lib/io/s3/s3_location.h"
#include "lib/io/s3/s3_object_writer.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

// A record is a few hundred bytes; anything larger under the records' prefix is not one.
constexpr uint64_t kMaxRecordBytes = 64 << 10;

// The output: a bucket and the key prefix of its objects.
struct OutputPrefix {
  std::string bucket;
  // "key/" for s3://bucket/key (whole segments: "key2/x" is not under it); empty for a bucket.
  std::string prefix;

  std::string Key(absl::string_view name) const { return absl::StrCat(prefix, name); }
  std::string Url(absl::string_view name) const {
    return absl::StrCat("s3://", bucket, "/", prefix, name);
  }
  // The output as users write it: "s3://bucket/key" (no trailing '/').
  std::string Root() const {
    return absl::StrCat("s3://", bucket, "/",
                        absl::string_view(prefix).substr(0, prefix.size() - 1));
  }
};

absl::StatusOr<OutputPrefix> ParseOutput(const std::string& url) {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url), "output");
  OutputPrefix out;
  out.bucket = std::move(location.bucket);
  std::string key = std::move(location.key);
  while (!key.empty() && key.back() == '/') key.pop_back();
  if (!key.empty()) out.prefix = key + "/";
  return out;
}

// The key name of the record of data file `name` (see object_store_output.h).
std::string RecordName(absl::string_view name) {
  return absl::StrCat(kObjectRecordsFolder, "/", name, ".json");
}

// Writes each data file as a multipart upload of `prefix/name`, and keeps the ETag of each
// object it completes for the file's record.
class S3OutputSink final : public OutputSink {
 public:
  // `cancelled` (may be null) ends a test fault point's wait.
  S3OutputSink(S3Client& client, const OutputPrefix& out, std::map<std::string, std::string> meta,
               const std::atomic<bool>* cancelled)
      : client_(client), out_(out), metadata_(std::move(meta)), cancelled_(cancelled) {}

  absl::StatusOr<std::unique_ptr<ByteWriter>> Open(const std::string& name,
                                                   uint64_t bytes) override {
    S3ObjectWriter::Options options = S3ObjectWriter::OptionsFor(bytes);
    options.metadata = metadata_;
    ASSIGN_OR_RETURN(std::unique_ptr<S3ObjectWriter> writer,
                     S3ObjectWriter::Create(&client_, out_.bucket, out_.Key(name), options));
    // A kill here leaves finished objects and an unfinished upload (crash tests).
    if (committed_.load() > 0) TestFaultPoint("object-upload-started", cancelled_);
    return std::unique_ptr<ByteWriter>(new ETagKeepingWriter(std::move(writer), *this, name));
  }

  // Called when a data file's upload completed (or the file was reused).
  void Committed() { committed_.fetch_add(1); }

  // The ETag of data object `name` when this run completed its upload; empty otherwise (a
  // reused object, or one whose upload failed).
  std::string ETagOf(const std::string& name) const {
    absl::MutexLock lock(&mu_);
    auto it = etags_.find(name);
    return it == etags_.end() ? "" : it->second;
  }

 private:
  // Passes everything to the object's writer; once it has completed the upload, tells the sink
  // the object's ETag.
  class ETagKeepingWriter final : public ByteWriter {
   public:
    ETagKeepingWriter(std::unique_ptr<S3ObjectWriter> object, S3OutputSink& sink, std::string name)
        : object_(std::move(object)), sink_(sink), name_(std::move(name)) {}
    absl::Status Write(absl::string_view data) override { return object_->Write(data); }
    absl::Status Close() override {
      RETURN_IF_ERROR(object_->Close());
      absl::MutexLock lock(&sink_.mu_);
      sink_.etags_[name_] = object_->etag();
      return absl::OkStatus();
    }
    uint64_t pos() const override { return object_->pos(); }

   private:
    const std::unique_ptr<S3ObjectWriter> object_;
    S3OutputSink& sink_;
    const std::string name_;
  };

  S3Client& client_;
  const OutputPrefix& out_;
  const std::map<std::string, std::string> metadata_;
  const std::atomic<bool>* const cancelled_;
  std::atomic<int> committed_{0};
  mutable absl::Mutex mu_;
  std::map<std::string, std::string> etags_ ABSL_GUARDED_BY(mu_);
};

// What the prefix holds before the run.
struct ExistingObjects {
  std::vector<S3ObjectInfo> objects;
  bool manifest = false;
  bool marker = false;
};

absl::StatusOr<ExistingObjects> ListExisting(S3Client& client, const OutputPrefix& out) {
  ExistingObjects existing;
  ASSIGN_OR_RETURN(existing.objects, client.List(out.bucket, out.prefix),
                   absl::StrCat("checking the output ", out.Root()));
  for (const S3ObjectInfo& object : existing.objects) {
    existing.manifest = existing.manifest || object.key == out.Key(kManifestName);
    existing.marker = existing.marker || object.key == out.Key(kInProgressMarkerName);
  }
  return existing;
}

// InvalidArgument when the input is an object or prefix inside the output prefix: preparing
// the prefix would delete it.
absl::Status CheckInputOutside(const ConversionSpec& spec, const OutputPrefix& out) {
  if (!IsS3Url(spec.input)) return absl::OkStatus();
  absl::StatusOr<S3Location> input = ParseS3Url(spec.input);
  if (!input.ok() || input->bucket != out.bucket) return absl::OkStatus();
  if (!absl::StartsWith(absl::StrCat(input->key, "/"), out.prefix)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("output ", out.Root(), " contains the input ",
                                                 spec.input,
                                                 ": writing it would delete the input"));
}

// Refuses a prefix with objects unless overwriting, or unless they are an unfinished run's.
absl::Status CheckUsable(const ConversionSpec& spec, const OutputPrefix& out,
                         const ExistingObjects& existing) {
  if (existing.objects.empty() || spec.overwrite) return absl::OkStatus();
  if (existing.marker && !existing.manifest) return absl::OkStatus();  // taken over
  return absl::FailedPreconditionError(
      absl::StrCat("output ", out.Root(), " is not empty (", existing.objects.size(),
                   " objects, e.g. s3://", out.bucket, "/", existing.objects.front().key,
                   existing.manifest ? "; it holds a finished output" : "",
                   "); pass --overwrite to replace its contents"));
}

std::string MarkerJson(const ConversionSpec& spec) {
  nlohmann::ordered_json marker;
  marker["tool"] = "reshard";
  marker["version"] = kReshardVersion;
  marker["input"] = spec.input;
  marker["started_unix"] = static_cast<int64_t>(std::time(nullptr));
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) marker["host"] = host;
  marker["pid"] = static_cast<int64_t>(getpid());
  return marker.dump(2) + "\n";
}

// The identity of the plan (see object_store_output.h): the request as every run of it must
// see it (ConversionRequestJson) without `overwrite` and `update_latest`, which change no
// object; reshard's version; the data files (name, size) and the sources (path, size).
absl::StatusOr<std::string> PlanId(const ConversionSpec& spec, const OutputPrefix& out,
                                   const CopyPlan& plan) {
  ConversionSpec normalized = spec;
  normalized.output = out.Root();  // "s3://b/out/" is "s3://b/out"
  ASSIGN_OR_RETURN(const std::string request_text, ConversionRequestJson(normalized));
  OrderedJson request = OrderedJson::parse(request_text);
  request.erase("overwrite");
  request.erase("update_latest");
  OrderedJson identity;
  identity["version"] = kReshardVersion;
  identity["request"] = std::move(request);
  OrderedJson files = OrderedJson::array();
  for (const FilePlan& file : plan.files) files.push_back({file.name, file.bytes});
  identity["files"] = std::move(files);
  OrderedJson sources = OrderedJson::array();
  for (const SourceFile& source : plan.sources) {
    // A remote source's version too: objects finished from a replaced input are not kept.
    OrderedJson entry = {source.path, source.size};
    if (!source.version.empty()) entry.push_back(source.version);
    sources.push_back(std::move(entry));
  }
  identity["sources"] = std::move(sources);
  const std::string canonical = identity.dump();
  return absl::StrFormat("%016x", XXH3_64bits(canonical.data(), canonical.size()));
}

// What the record of a finished data object says (see object_store_output.h).
struct ObjectRecord {
  std::string plan_id;
  std::string name;
  uint64_t bytes = 0;
  uint64_t xxh3_64 = 0;
  std::string etag;  // as the server sent it, quotes included
};

std::string RecordJson(const ObjectRecord& record) {
  OrderedJson json;
  json["tool"] = "reshard";
  json["plan_id"] = record.plan_id;
  json["name"] = record.name;
  json["bytes"] = record.bytes;
  json["xxh3_64"] = absl::StrFormat("%016x", record.xxh3_64);
  json["etag"] = record.etag;
  return json.dump(1) + "\n";
}

// The record in `text`; nullopt when it is not one (damaged, foreign, another version).
std::optional<ObjectRecord> ParseRecord(absl::string_view text) {
  const OrderedJson json = OrderedJson::parse(text.begin(), text.end(), nullptr,
                                              /*allow_exceptions=*/false);
  ObjectRecord record;
  if (!json.is_object() || json.value("tool", "") != "reshard" || !json.contains("bytes") ||
      !json["bytes"].is_number_unsigned() ||
      !absl::SimpleHexAtoi(json.value("xxh3_64", ""), &record.xxh3_64)) {
    return std::nullopt;
  }
  record.plan_id = json.value("plan_id", "");
  record.name = json.value("name", "");
  record.bytes = json["bytes"].get<uint64_t>();
  record.etag = json.value("etag", "");
  if (record.plan_id.empty() || record.name.empty() || record.etag.empty()) return std::nullopt;
  return record;
}

// What an earlier run of the same plan finished under the prefix and this run keeps.
struct Reuse {
  // Data file -> its recorded XXH3-64 (ExecutorOptions::completed_files).
  std::map<std::string, uint64_t> files;
  // The keys kept in step 3: those data objects and their records.
  std::set<std::string> keys;
  // Records of this plan whose object is gone or was replaced (uploaded again).
  int mismatches = 0;
};

// Reads the records among `existing` and keeps each data object of plan `plan_id` whose HEAD
// still shows the recorded size and ETag. Records of other plans, of files this plan does not
// have (or of another size), and damaged ones are ignored: step 3 deletes them with every
// other old object. Errors (a record or HEAD that fails other than NotFound) name the object.
absl::StatusOr<Reuse> FindReusableObjects(S3Client& client, const OutputPrefix& out,
                                          const ExistingObjects& existing, const CopyPlan& plan,
                                          const std::string& plan_id) {
  std::map<std::string, uint64_t> planned;
  for (const FilePlan& file : plan.files) planned[file.name] = file.bytes;
  const std::string records = out.Key(absl::StrCat(kObjectRecordsFolder, "/"));
  Reuse reuse;
  for (const S3ObjectInfo& object : existing.objects) {
    if (!absl::StartsWith(object.key, records) || !absl::EndsWith(object.key, ".json") ||
        object.size > kMaxRecordBytes) {
      continue;
    }
    std::string text(object.size, '\0');
    const absl::Status read = client.GetRange(out.bucket, object.key, 0, absl::MakeSpan(text),
                                              S3ObjectVersion{object.etag, object.size});
    if (absl::IsNotFound(read)) continue;  // removed since the listing
    RETURN_IF_ERROR(read, absl::StrCat("reading the record s3://", out.bucket, "/", object.key,
                                       " of a finished data object"));
    const std::optional<ObjectRecord> record = ParseRecord(text);
    if (!record.has_value() || record->plan_id != plan_id) continue;
    auto file = planned.find(record->name);
    if (file == planned.end() || file->second != record->bytes ||
        object.key != out.Key(RecordName(record->name))) {
      continue;
    }
    // The object itself, now: it may have been replaced or removed since it was recorded.
    const absl::StatusOr<S3ObjectInfo> info = client.Head(out.bucket, out.Key(record->name));
    if (!info.ok() && !absl::IsNotFound(info.status())) {
      return Annotate(info.status(), absl::StrCat("checking the finished data object ",
                                                  out.Url(record->name), " for reuse"));
    }
    if (!info.ok() || info->size != record->bytes || info->etag != record->etag) {
      ++reuse.mismatches;
      continue;
    }
    reuse.files[record->name] = record->xxh3_64;
    reuse.keys.insert(object.key);
    reuse.keys.insert(out.Key(record->name));
  }
  return reuse;
}

// Removes the records of the finished data objects (best effort: once the manifest is there
// they mean nothing, and a rerun into a finished prefix is refused or overwrites it).
void RemoveRecords(S3Client& client, const OutputPrefix& out) {
  absl::StatusOr<std::vector<S3ObjectInfo>> records =
      client.List(out.bucket, out.Key(absl::StrCat(kObjectRecordsFolder, "/")));
  if (!records.ok()) return;
  for (const S3ObjectInfo& record : *records) {
    client.Delete(out.bucket, record.key).IgnoreError();
  }
}

// Step 3 of the protocol (object_store_output.h): old manifest, marker, old objects (but the
// ones kept for reuse, `keep`), uploads.
absl::Status PreparePrefix(S3Client& client, const ConversionSpec& spec, const OutputPrefix& out,
                           const ExistingObjects& existing, const std::set<std::string>& keep) {
  const std::string manifest_key = out.Key(kManifestName);
  const std::string marker_key = out.Key(kInProgressMarkerName);
  if (existing.manifest) {
    RETURN_IF_ERROR(client.Delete(out.bucket, manifest_key),
                    "removing the old manifest before replacing the output");
  }
  RETURN_IF_ERROR(client.Put(out.bucket, marker_key, MarkerJson(spec)).status(),
                  "marking the output as being written");
  for (const S3ObjectInfo& object : existing.objects) {
    if (object.key == manifest_key || object.key == marker_key || keep.count(object.key) > 0) {
      continue;
    }
    RETURN_IF_ERROR(client.Delete(out.bucket, object.key),
                    "removing the old contents of the output");
  }
  RETURN_IF_ERROR(AbortStaleUploads(client, out.bucket, out.prefix).status());
  return absl::OkStatus();
}

absl::Status Cancelled(const RunControl& control) {
  if (control.cancelled != nullptr && control.cancelled->load()) {
    return absl::CancelledError("conversion cancelled");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckObjectStoreOutputUsable(const ConversionSpec& spec) {
  ASSIGN_OR_RETURN(S3Client * client, DefaultS3Client(), spec.output);
  ASSIGN_OR_RETURN(const OutputPrefix out, ParseOutput(spec.output));
  RETURN_IF_ERROR(CheckInputOutside(spec, out));
  ASSIGN_OR_RETURN(const ExistingObjects existing, ListExisting(*client, out));
  return CheckUsable(spec, out, existing);
}

absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control) {
  ASSIGN_OR_RETURN(S3Client * client, DefaultS3Client(), spec.output);
  return RunConversionToObjectStore(spec, control, *client);
}

absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control,
                                                            S3Client& client) {
  const Clock::time_point start = Clock::now();
  if (spec.partition_count > 0) {
    return absl::UnimplementedError(
        absl::StrCat("output ", spec.output, ": partitioned conversions write local folders only"));
  }
  // A resumed job (reshardd restarted mid-run) lists the files its first run finished
  // (control.completed_files). They are not needed here: the prefix holds that run's marker and
  // the records of its finished objects, so this run takes it over like any rerun and keeps
  // the objects whose records still hold.
  ASSIGN_OR_RETURN(const OutputPrefix out, ParseOutput(spec.output));
  if (spec.update_latest && out.prefix.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", spec.output,
                     " is a whole bucket: there is no place beside it for the tracker "
                     "file of --update-latest"));
  }
  RETURN_IF_ERROR(CheckInputOutside(spec, out));
  // Refuse a non-empty output before reading anything.
  ASSIGN_OR_RETURN(const ExistingObjects existing, ListExisting(client, out));
  RETURN_IF_ERROR(CheckUsable(spec, out, existing));
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec));
  ASSIGN_OR_RETURN(const std::string plan_id, PlanId(spec, out, planned.plan));
  ASSIGN_OR_RETURN(const Reuse reuse,
                   FindReusableObjects(client, out, existing, planned.plan, plan_id));
  RETURN_IF_ERROR(Cancelled(control));
  RETURN_IF_ERROR(PreparePrefix(client, spec, out, existing, reuse.keys));
  const double plan_seconds = SecondsSince(start);

  const Clock::time_point write_start = Clock::now();
  std::map<std::string, std::string> metadata;
  if (!control.job_id.empty()) metadata["reshard-job"] = control.job_id;
  S3OutputSink sink(client, out, std::move(metadata), control.cancelled);
  ExecutorOptions options = ExecutorOptionsFor(spec, control);
  options.completed_files = reuse.files;
  // The first error recording a finished object; the executor calls on_file_committed
  // serialized.
  absl::Status record_status;
  options.on_file_committed = [&](const WrittenFile& file) {
    // Each object this run uploaded gets its record before it counts as done (a reused one has
    // its record already), so that a rerun after a kill from here on keeps it.
    const std::string etag = sink.ETagOf(file.name);
    if (!etag.empty() && record_status.ok()) {
      const ObjectRecord record{plan_id, file.name, file.bytes, file.xxh3_64, etag};
      record_status = Annotate(
          client.Put(out.bucket, out.Key(RecordName(file.name)), RecordJson(record)).status(),
          absl::StrCat("recording the finished data object ", out.Url(file.name)));
    }
    sink.Committed();
    if (control.on_file_committed) control.on_file_committed(file);
  };
  ASSIGN_OR_RETURN(ExecutionResult executed, Execute(planned.plan, sink, options));
  RETURN_IF_ERROR(record_status);

  const Clock::time_point publish_start = Clock::now();
  ConversionResult result;
  result.output = out.Root();
  result.plan_seconds = plan_seconds;
  result.data_files_seconds = std::chrono::duration<double>(publish_start - write_start).count();
  RecordExecution(executed, result);
  result.verification_failures += reuse.mismatches;
  for (const FilePlan& file : planned.plan.files) result.tensors += file.tensors.size();
  auto put = [&client, &out](const std::string& name, absl::string_view contents) {
    return client.Put(out.bucket, out.Key(name), contents).status();
  };
  // The index after every data object; the manifest, the commit mark, after the index.
  RETURN_IF_ERROR(WriteCompanions(planned, put, result));
  TestFaultPoint("before-publish", control.cancelled);
  RETURN_IF_ERROR(Cancelled(control));
  const std::string manifest = BuildManifest(spec, planned, result.files, control.job_id);
  RETURN_IF_ERROR(put(kManifestName, manifest));
  result.bytes_written += manifest.size();
  TestFaultPoint("after-publish");
  // Best effort: beside a manifest the records and the marker mean nothing.
  RemoveRecords(client, out);
  client.Delete(out.bucket, out.Key(kInProgressMarkerName)).IgnoreError();
  if (spec.update_latest) {
    // Beside the output: under the prefix's parent (the bucket's root for "s3://b/out").
    const std::string own = out.prefix.substr(0, out.prefix.size() - 1);
    const size_t slash = own.rfind('/');
    const std::string parent = slash == std::string::npos ? "" : own.substr(0, slash + 1);
    for (const auto& [name, contents] : planned.beside_output) {
      RETURN_IF_ERROR(client.Put(out.bucket, parent + name, contents).status(),
                      "the output was published; updating the tracker file beside it");
    }
  }
  result.publish_seconds = SecondsSince(publish_start);
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace reshard
