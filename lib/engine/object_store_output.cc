#include "lib/engine/object_store_output.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

// Writes each data file as a multipart upload of `prefix/name`.
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
    return std::unique_ptr<ByteWriter>(std::move(writer));
  }

  // Called when a data file's upload completed.
  void Committed() { committed_.fetch_add(1); }

 private:
  S3Client& client_;
  const OutputPrefix& out_;
  const std::map<std::string, std::string> metadata_;
  const std::atomic<bool>* const cancelled_;
  std::atomic<int> committed_{0};
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

// Step 3 of the protocol (object_store_output.h): old manifest, marker, old objects, uploads.
absl::Status PreparePrefix(S3Client& client, const ConversionSpec& spec, const OutputPrefix& out,
                           const ExistingObjects& existing) {
  const std::string manifest_key = out.Key(kManifestName);
  const std::string marker_key = out.Key(kInProgressMarkerName);
  if (existing.manifest) {
    RETURN_IF_ERROR(client.Delete(out.bucket, manifest_key),
                    "removing the old manifest before replacing the output");
  }
  RETURN_IF_ERROR(client.Put(out.bucket, marker_key, MarkerJson(spec)).status(),
                  "marking the output as being written");
  for (const S3ObjectInfo& object : existing.objects) {
    if (object.key == manifest_key || object.key == marker_key) continue;
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
  // (control.completed_files). They are not reused here: the prefix holds that run's marker, so
  // this run takes it over like a rerun and writes every data object again.
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
  RETURN_IF_ERROR(Cancelled(control));
  RETURN_IF_ERROR(PreparePrefix(client, spec, out, existing));
  const double plan_seconds = SecondsSince(start);

  const Clock::time_point write_start = Clock::now();
  std::map<std::string, std::string> metadata;
  if (!control.job_id.empty()) metadata["reshard-job"] = control.job_id;
  S3OutputSink sink(client, out, std::move(metadata), control.cancelled);
  ExecutorOptions options = ExecutorOptionsFor(spec, control);
  options.on_file_committed = [&sink, &control](const WrittenFile& file) {
    sink.Committed();
    if (control.on_file_committed) control.on_file_committed(file);
  };
  ASSIGN_OR_RETURN(ExecutionResult executed, Execute(planned.plan, sink, options));

  const Clock::time_point publish_start = Clock::now();
  ConversionResult result;
  result.output = out.Root();
  result.plan_seconds = plan_seconds;
  result.data_files_seconds = std::chrono::duration<double>(publish_start - write_start).count();
  RecordExecution(executed, result);
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
  // Best effort: beside a manifest the marker means nothing.
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
