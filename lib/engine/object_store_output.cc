#include "lib/engine/object_store_output.h"

#include <chrono>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/core/test_faults.h"
#include "lib/engine/output_commit.h"
#include "lib/exec/executor.h"
#include "lib/io/kvstore/location.h"

namespace reshard {
namespace {

// The output as every run spells it: validated by its driver, no trailing '/'.
absl::StatusOr<std::string> OutputRoot(const ConversionSpec& spec, const kvstore::Driver& driver) {
  ASSIGN_OR_RETURN(std::string root, driver.ConfinedPath(spec.output, /*must_exist=*/false),
                   "output");
  return root;
}

// The path of the folder holding `root`; empty for a whole bucket ("s3://b", "mem://b").
std::string ParentOf(const std::string& root) {
  const size_t scheme_end = root.find("://");
  const size_t from = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  const size_t slash = root.rfind('/');
  if (slash == std::string::npos || slash < from) return "";
  return root.substr(0, slash);
}

// InvalidArgument when the input is a file or folder inside the output: preparing the output
// would delete it.
absl::Status CheckInputOutside(const ConversionSpec& spec, const std::string& root) {
  std::string input = spec.input;
  while (absl::EndsWith(input, "/") && !absl::EndsWith(input, "://")) input.pop_back();
  if (input != root && !absl::StartsWith(input, absl::StrCat(root, "/"))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "output ", root, " contains the input ", spec.input, ": writing it would delete the input"));
}

// Refuses an output with files unless overwriting, or unless they are an unfinished run's.
absl::Status CheckUsable(const ConversionSpec& spec, const std::string& root,
                         const AreaContents& existing) {
  if (existing.files.empty() || spec.overwrite) return absl::OkStatus();
  if (existing.marker && !existing.manifest) return absl::OkStatus();  // taken over
  return absl::FailedPreconditionError(
      absl::StrCat("output ", root, " is not empty (", existing.files.size(), " files, e.g. ",
                   root, "/", existing.files.front().name,
                   existing.manifest ? "; it holds a finished output" : "",
                   "); pass --overwrite to replace its contents"));
}

absl::Status Cancelled(const RunControl& control) {
  if (control.cancelled != nullptr && control.cancelled->load()) {
    return absl::CancelledError("conversion cancelled");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckObjectStoreOutputUsable(const ConversionSpec& spec) {
  ASSIGN_OR_RETURN(const kvstore::Location output, kvstore::ParseLocation(spec.output),
                   "output");
  ASSIGN_OR_RETURN(const std::string root, OutputRoot(spec, *output.driver));
  RETURN_IF_ERROR(CheckInputOutside(spec, root));
  const OutputArea area(*output.driver, root);
  ASSIGN_OR_RETURN(const AreaContents existing, area.List());
  return CheckUsable(spec, root, existing);
}

absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control) {
  ASSIGN_OR_RETURN(const kvstore::Location output, kvstore::ParseLocation(spec.output),
                   "output");
  return RunConversionToObjectStore(spec, control, *output.driver);
}

absl::StatusOr<ConversionResult> RunConversionToObjectStore(const ConversionSpec& spec,
                                                            const RunControl& control,
                                                            const kvstore::Driver& driver) {
  const Clock::time_point start = Clock::now();
  if (spec.partition_count > 0) {
    return absl::UnimplementedError(absl::StrCat(
        "output ", spec.output,
        ": a partitioned conversion runs through RunAnyConversion (partitioned_conversion.h)"));
  }
  // A resumed job (reshardd restarted mid-run) finds its first run's marker and records in
  // the output, and takes it over like any rerun.
  ASSIGN_OR_RETURN(const std::string root, OutputRoot(spec, driver));
  const std::string parent = ParentOf(root);
  if (spec.update_latest && parent.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", spec.output,
                     " is a whole bucket: there is no place beside it for the tracker "
                     "file of --update-latest"));
  }
  RETURN_IF_ERROR(CheckInputOutside(spec, root));
  // Refuse a non-empty output before reading anything.
  const OutputArea area(driver, root);
  ASSIGN_OR_RETURN(const AreaContents existing, area.List());
  RETURN_IF_ERROR(CheckUsable(spec, root, existing));
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec));
  ConversionSpec normalized = spec;
  normalized.output = root;
  ASSIGN_OR_RETURN(const std::string request, ConversionRequestJson(normalized));
  const std::string plan_id = OutputPlanId(request, planned.plan);
  ASSIGN_OR_RETURN(const ReusableFiles reuse, area.FindReusable(existing, planned.plan, plan_id));
  RETURN_IF_ERROR(Cancelled(control));
  RETURN_IF_ERROR(area.Prepare(existing, reuse.kept, spec.input));
  const double plan_seconds = SecondsSince(start);

  const Clock::time_point write_start = Clock::now();
  std::map<std::string, std::string> metadata;
  if (!control.job_id.empty()) metadata["reshard-job"] = control.job_id;
  // The window, the spans of remote sources and the upload buffers share the conversion's
  // memory (ShareConversionMemory).
  OutputAreaSink sink(area, plan_id, std::move(metadata), control.cancelled,
                      planned.writer_budget);
  ExecutorOptions options = ExecutorOptionsFor(spec, control);
  options.window_bytes = planned.window_bytes;
  options.remote_span_bytes = planned.remote_span_bytes;
  options.completed_files = reuse.files;
  // The first error recording a finished file; the executor calls on_file_committed
  // serialized.
  absl::Status record_status;
  options.on_file_committed = [&](const WrittenFile& file) {
    // Each file this run wrote gets its record before it counts as done, so that a rerun
    // after a kill from here on keeps it.
    if (record_status.ok()) record_status = sink.Record(file);
    if (control.on_file_committed) control.on_file_committed(file);
  };
  ASSIGN_OR_RETURN(ExecutionResult executed, Execute(planned.plan, sink, options));
  RETURN_IF_ERROR(record_status);

  const Clock::time_point publish_start = Clock::now();
  ConversionResult result;
  result.output = root;
  result.plan_seconds = plan_seconds;
  result.data_files_seconds = std::chrono::duration<double>(publish_start - write_start).count();
  RecordExecution(executed, result);
  result.verification_failures += reuse.mismatches;
  for (const FilePlan& file : planned.plan.files) result.tensors += file.tensors.size();
  auto put = [&area](const std::string& name, absl::string_view contents) {
    return area.Put(name, contents);
  };
  // The index after every data file; the manifest, the commit mark, after the index.
  RETURN_IF_ERROR(WriteCompanions(planned, put, result));
  TestFaultPoint("before-publish", control.cancelled);
  RETURN_IF_ERROR(Cancelled(control));
  const std::string manifest = BuildManifest(spec, planned, result.files, control.job_id);
  RETURN_IF_ERROR(put(kManifestName, manifest));
  result.bytes_written += manifest.size();
  TestFaultPoint("after-publish");
  area.RemoveRecordsAndMarker();
  if (spec.update_latest) {
    for (const auto& [name, contents] : planned.beside_output) {
      RETURN_IF_ERROR(driver.WriteFile(absl::StrCat(parent, "/", name), contents).status(),
                      "the output was published; updating the tracker file beside it");
    }
  }
  result.publish_seconds = SecondsSince(publish_start);
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace reshard
