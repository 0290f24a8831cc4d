#include "client/reports.h"

#include <fstream>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/exit_codes.h"
#include "client/progress_bar.h"
#include "google/protobuf/util/json_util.h"
#include "lib/engine/partition_spec.h"
#include "lib/engine/spec_codec.h"

namespace reshard {
namespace {

// Paths and messages may hold bytes that are not UTF-8; they print as U+FFFD, never abort.
std::string DumpDocument(const Json& doc) {
  return doc.dump(2, ' ', false, Json::error_handler_t::replace);
}

Json TensorEntry(const std::string& name, const std::string& dtype, const Json& shape,
                 uint64_t bytes, int64_t pieces) {
  return Json{
      {"name", name}, {"dtype", dtype}, {"shape", shape}, {"bytes", bytes}, {"pieces", pieces}};
}

std::string JobStateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  return absl::AsciiStrToLower(name.substr(std::string("JOB_STATE_").size()));
}

}  // namespace

std::string StatusCodeName(absl::StatusCode code) {
  const std::string name = absl::StatusCodeToString(code);  // "INVALID_ARGUMENT", "" if unknown
  return name.empty() ? "UNKNOWN" : name;
}

Json InspectDocument(const std::string& input, const LoadedInput& loaded,
                     const std::vector<ModelFile>& model_files) {
  const InputModel& model = loaded.model;
  const Catalog& shown = loaded.merged ? loaded.catalog : model.parts[0];
  Json doc;
  doc["path"] = input;
  doc["format"] = model.format;
  doc["layout"] = model.arrangement;
  doc["description"] = model.description;
  doc["parts"] = model.parts.size();
  doc["merged"] = loaded.merged;
  doc["files"] = Json::array();
  for (const Catalog& part : model.parts) {
    for (const SourceFile& file : part.files) {
      doc["files"].push_back({{"path", file.path}, {"bytes", file.size}});
    }
  }
  doc["tensors"] = Json::array();
  uint64_t total = 0;
  for (const CatalogTensor& tensor : shown.tensors) {
    doc["tensors"].push_back(TensorEntry(tensor.name, std::string(DTypeName(tensor.dtype)),
                                         tensor.shape, TensorBytes(tensor), tensor.pieces.size()));
    total += TensorBytes(tensor);
  }
  doc["tensor_count"] = shown.tensors.size();
  doc["total_bytes"] = total;
  doc["metadata"] = shown.metadata;
  doc["other_entries"] = shown.other_entries;
  doc["hf_export"] = nullptr;  // a Megatron checkpoint's: RunInspect sets it
  doc["model_files"] = Json::array();
  for (const ModelFile& file : model_files) {
    doc["model_files"].push_back({{"path", file.path}, {"bytes", file.size}});
  }
  return doc;
}

Json InspectDocument(const std::string& input, const v1::InspectResponse& response) {
  Json doc;
  doc["path"] = input;
  doc["format"] = response.format();
  doc["layout"] = response.layout();
  doc["description"] = response.description();
  doc["parts"] = response.parts();
  doc["merged"] = response.merged();
  doc["files"] = Json::array();
  for (const v1::InputFile& file : response.files()) {
    doc["files"].push_back({{"path", file.path()}, {"bytes", file.bytes()}});
  }
  doc["tensors"] = Json::array();
  for (const v1::TensorInfo& tensor : response.tensors()) {
    doc["tensors"].push_back(
        TensorEntry(tensor.name(), tensor.dtype(),
                    std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end()),
                    tensor.bytes(), tensor.pieces()));
  }
  doc["tensor_count"] = response.tensors_size();
  doc["total_bytes"] = response.total_bytes();
  doc["metadata"] =
      std::map<std::string, std::string>(response.metadata().begin(), response.metadata().end());
  doc["model_files"] = Json::array();
  for (const v1::InputFile& file : response.model_files()) {
    doc["model_files"].push_back({{"path", file.path()}, {"bytes", file.bytes()}});
  }
  doc["hf_export"] = response.hf_export_note().empty()
                         ? Json()
                         : HfExportJson(response.hf_export_family(), response.hf_export_note());
  return doc;
}

Json HfExportJson(const std::string& family, const std::string& note) {
  return {{"family", family.empty() ? Json() : Json(family)}, {"note", note}};
}

Json PlanDocument(const std::string& input, bool reshard, const PlannedConversion& planned) {
  Json doc;
  doc["kind"] = reshard ? "reshard" : "consolidate";
  doc["input"] = input;
  doc["files"] = Json::array();
  for (const FilePlan& file : planned.plan.files) {
    doc["files"].push_back(
        {{"name", file.name}, {"bytes", file.bytes}, {"tensors", file.tensors.size()}});
  }
  for (const auto& [name, contents] : planned.companion_files) {
    doc["files"].push_back({{"name", name}, {"bytes", contents.size()}, {"tensors", 0}});
  }
  doc["total_bytes"] = planned.plan.total_bytes;
  doc["source_bytes_read"] = planned.plan.source_bytes_read;
  doc["memory_bytes"] = planned.memory_bytes;
  return doc;
}

void AddPartitions(Json& plan_doc, size_t data_files, int count) {
  std::vector<std::string> names;
  std::vector<uint64_t> bytes;
  for (size_t f = 0; f < data_files && f < plan_doc["files"].size(); ++f) {
    names.push_back(plan_doc["files"][f]["name"].get<std::string>());
    bytes.push_back(plan_doc["files"][f]["bytes"].get<uint64_t>());
  }
  Json partitions = Json::array();
  int index = 0;
  for (const PartitionFiles& partition : GroupByPartition(names, bytes, count)) {
    partitions.push_back(
        {{"partition", index++}, {"files", partition.files}, {"bytes", partition.bytes}});
  }
  plan_doc["partitions"] = std::move(partitions);
}

Json PlanDocument(const std::string& input, bool reshard, const v1::PlanResponse& response) {
  Json doc;
  doc["kind"] = reshard ? "reshard" : "consolidate";
  doc["input"] = input;
  doc["files"] = Json::array();
  for (const v1::PlannedFile& file : response.files()) {
    doc["files"].push_back(
        {{"name", file.name()}, {"bytes", file.bytes()}, {"tensors", file.tensors()}});
  }
  doc["total_bytes"] = response.total_bytes();
  doc["source_bytes_read"] = response.source_bytes_read();
  doc["memory_bytes"] = response.memory_bytes();
  return doc;
}

Json ConversionDocument(const std::string& input, bool reshard, const ConversionResult& result) {
  Json doc;
  doc["kind"] = reshard ? "reshard" : "consolidate";
  doc["input"] = input;
  doc["output"] = result.output;
  doc["files"] = Json::array();
  for (const WrittenFile& file : result.files) {
    doc["files"].push_back({{"name", file.name},
                            {"bytes", file.bytes},
                            {"tensors", file.tensors},
                            {"xxh3_64", absl::StrFormat("%016x", file.xxh3_64)}});
  }
  doc["tensors"] = result.tensors;
  doc["bytes_read"] = result.bytes_read;
  doc["bytes_written"] = result.bytes_written;
  doc["seconds"] = result.seconds;
  // How the data files reached the disk: direct I/O, or buffered (--io buffered, or a
  // filesystem that refuses direct I/O).
  doc["direct_io_files"] = result.direct_files;
  doc["buffered_io_files"] = result.buffered_files;
  // Data files an earlier attempt had finished, kept instead of written again (counted in
  // "files" and "bytes_written", which describe the output), and the recorded ones that no
  // longer matched and were written again.
  doc["reused_files"] = result.reused_files;
  doc["reused_bytes"] = result.reused_bytes;
  doc["verification_failures"] = result.verification_failures;
  // Whether the output folder now holds the result: false for a worker of a partitioned
  // conversion that recorded its files while others had not yet.
  doc["published"] = result.published;
  if (result.found_published) doc["found_published"] = true;
  if (result.partition_count > 0) {
    doc["partition"] = {{"index", result.partition_index},
                        {"count", result.partition_count},
                        {"recorded", result.partitions_recorded}};
  }
  return doc;
}

Json JobDocument(const v1::Job& job) {
  Json doc;
  doc["job_id"] = job.id();
  doc["state"] = JobStateName(job.state());
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    doc["kind"] = job.spec().kind() == v1::JOB_KIND_RESHARD ? "reshard" : "consolidate";
    doc["input"] = job.spec().input();
    doc["output"] = job.spec().output();
    doc["files"] = Json::array();
    for (const v1::OutputFile& file : job.output_files()) {
      doc["files"].push_back(
          {{"name", file.name()}, {"bytes", file.bytes()}, {"xxh3_64", file.xxh3_64()}});
    }
    doc["tensors"] = job.progress().tensors_total();
    doc["bytes_read"] = job.bytes_read();
    doc["bytes_written"] = job.bytes_written();
    doc["reused_files"] = job.reused_files();
    doc["reused_bytes"] = job.reused_bytes();
    doc["seconds"] = job.finished_unix() - job.started_unix();
  }
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (google::protobuf::util::MessageToJsonString(job, &json, options).ok()) {
    doc["job"] = Json::parse(json);
  }
  return doc;
}

void PrintInspect(const Json& doc, std::ostream& out) {
  std::map<std::string, int> dtypes;
  for (const Json& tensor : doc["tensors"]) ++dtypes[tensor["dtype"].get<std::string>()];
  std::vector<std::string> counts;
  for (const auto& [name, count] : dtypes) counts.push_back(absl::StrCat(name, ": ", count));
  const size_t files = doc["files"].size();
  out << "input:    " << doc["path"].get<std::string>() << "\n";
  out << "format:   " << doc["format"].get<std::string>() << " ("
      << doc["layout"].get<std::string>() << ", " << files << (files == 1 ? " file" : " files")
      << ")\n";
  if (doc.contains("description") && !doc["description"].get<std::string>().empty()) {
    out << "layout:   " << doc["description"].get<std::string>() << "\n";
  }
  if (doc.contains("hf_export") && doc["hf_export"].is_object()) {
    out << "hf:       " << doc["hf_export"]["note"].get<std::string>() << "\n";
  }
  if (doc["parts"].get<int>() > 1) {
    out << "parts:    " << doc["parts"].get<int>() << " model-parallel parts"
        << (doc["merged"].get<bool>() ? ", merged with the rules"
                                      : "; tensors below are part 0's (pass --rules FILE to merge)")
        << "\n";
  }
  out << "tensors:  " << doc["tensors"].size() << ", "
      << HumanBytes(doc["total_bytes"].get<double>()) << " (" << absl::StrJoin(counts, ", ")
      << ")\n";
  if (!doc["metadata"].empty()) {
    std::vector<std::string> pairs;
    for (const auto& item : doc["metadata"].items()) {
      pairs.push_back(absl::StrCat(item.key(), "=", item.value().get<std::string>()));
    }
    out << "metadata: " << absl::StrJoin(pairs, ", ") << "\n";
  }
  if (doc.contains("other_entries") && !doc["other_entries"].empty()) {
    out << "other entries (not tensors; carried to torch output unless noted):\n";
    for (const Json& entry : doc["other_entries"]) out << "  " << entry.get<std::string>() << "\n";
  }
  if (doc.contains("model_files") && !doc["model_files"].empty()) {
    out << "model files (carried into Hugging Face outputs unless --no-extra-files):\n";
    for (const Json& file : doc["model_files"]) {
      out << absl::StrFormat("  %-60s %s\n", file["path"].get<std::string>(),
                             HumanBytes(file["bytes"].get<double>()));
    }
  }
  for (const Json& tensor : doc["tensors"]) {
    out << absl::StrFormat("  %-60s %-8s %-24s %s\n", tensor["name"].get<std::string>(),
                           tensor["dtype"].get<std::string>(),
                           ShapeToString(tensor["shape"].get<std::vector<int64_t>>()),
                           HumanBytes(tensor["bytes"].get<double>()));
  }
}

void PrintPlan(const Json& doc, std::ostream& out) {
  out << doc["kind"].get<std::string>() << " " << doc["input"].get<std::string>() << ": "
      << doc["files"].size() << " output files, " << HumanBytes(doc["total_bytes"].get<double>())
      << "\n";
  for (const Json& file : doc["files"]) {
    out << absl::StrFormat("  %-48s %12s  %d tensors\n", file["name"].get<std::string>(),
                           HumanBytes(file["bytes"].get<double>()), file["tensors"].get<int>());
  }
  if (doc.contains("partitions")) {
    for (const Json& partition : doc["partitions"]) {
      out << absl::StrFormat("  partition %d: %d files, %s\n", partition["partition"].get<int>(),
                             static_cast<int>(partition["files"].size()),
                             HumanBytes(partition["bytes"].get<double>()));
    }
  }
  out << "reads " << HumanBytes(doc["source_bytes_read"].get<double>())
      << " of source data; needs about " << HumanBytes(doc["memory_bytes"].get<double>())
      << " of memory\n";
}

void PrintConversion(const Json& doc, std::ostream& out) {
  const double seconds = doc["seconds"].get<double>();
  const double written = doc["bytes_written"].get<double>();
  if (doc.value("found_published", false)) {
    out << doc["output"].get<std::string>() << " was already published\n";
    return;
  }
  if (doc.contains("partition")) {
    const Json& partition = doc["partition"];
    out << "partition " << partition["index"].get<int>() << "/" << partition["count"].get<int>()
        << ": " << partition["recorded"].get<int>() << " of " << partition["count"].get<int>()
        << " partitions recorded; "
        << (doc["published"].get<bool>()
                ? "this worker published the output\n"
                : "the last worker to finish (or `reshardctl commit OUT`) publishes\n");
  }
  out << "wrote " << doc["output"].get<std::string>() << ": " << doc["files"].size() << " files, "
      << doc["tensors"].get<int64_t>() << " tensors, " << HumanBytes(written) << " in "
      << absl::StrFormat("%.2f", seconds) << " s ("
      << HumanBytes(seconds > 0 ? written / seconds : 0) << "/s)\n";
  for (const Json& file : doc["files"]) {
    out << absl::StrFormat("  %-48s %12s  xxh3 %s\n", file["name"].get<std::string>(),
                           HumanBytes(file["bytes"].get<double>()),
                           file["xxh3_64"].get<std::string>());
  }
  if (doc.value("reused_files", 0) > 0) {
    out << "  kept " << doc["reused_files"].get<int>() << " data files ("
        << HumanBytes(doc["reused_bytes"].get<double>())
        << ") an earlier run had finished; wrote the others\n";
  }
  if (doc.value("verification_failures", 0) > 0) {
    out << "  " << doc["verification_failures"].get<int>()
        << " files an earlier run had finished no longer matched their record and were "
           "written again\n";
  }
  // Object storage has no page cache to speak of: data files went up as multipart uploads.
  const bool object_store = absl::StartsWith(doc.value("output", ""), "s3://");
  if (!object_store && doc.contains("direct_io_files") && doc["buffered_io_files"].get<int>() > 0) {
    out << "  data files written through the page cache: " << doc["buffered_io_files"].get<int>()
        << " (direct I/O: " << doc["direct_io_files"].get<int>() << ")\n";
  }
}

void PrintJob(const Json& doc, std::ostream& out) {
  const Json& job = doc["job"];
  out << "job " << doc["job_id"].get<std::string>() << ": " << doc["state"].get<std::string>();
  const Json& progress = job["progress"];
  if (progress["bytes_total"].get<std::string>() != "0") {
    out << ", " << progress["bytes_done"].get<std::string>() << " of "
        << progress["bytes_total"].get<std::string>() << " bytes";
  }
  out << "\n  " << job["spec"]["kind"].get<std::string>() << " "
      << job["spec"]["input"].get<std::string>() << " -> "
      << job["spec"]["output"].get<std::string>() << "\n";
  if (!job["note"].get<std::string>().empty())
    out << "  note: " << job["note"].get<std::string>() << "\n";
  if (job.contains("error") && job["error"].is_object() &&
      !job["error"]["message"].get<std::string>().empty()) {
    out << "  error: " << job["error"]["code_name"].get<std::string>() << ": "
        << job["error"]["message"].get<std::string>() << "\n";
  }
  if (doc.contains("output")) PrintConversion(doc, out);
}

Json ErrorDocument(const absl::Status& status, int exit_code) {
  Json doc;
  doc["ok"] = false;
  doc["exit_code"] = exit_code;
  doc["error"] = {{"code", StatusCodeName(status.code())},
                  {"message", std::string(status.message())}};
  return doc;
}

namespace {

void WriteResultFile(const std::string& path, const Json& doc, std::ostream& err) {
  if (path.empty()) return;
  const std::string temp = path + ".tmp";
  {
    std::ofstream file(temp, std::ios::trunc);
    file << DumpDocument(doc) << "\n";
    if (!file) {
      err << "reshardctl: cannot write result file " << path << "\n";
      return;
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    err << "reshardctl: cannot write result file " << path << "\n";
  }
}

}  // namespace

int Emit(Json doc, int exit_code, const OutputFlags& flags, const std::string& result_file,
         void (*print)(const Json&, std::ostream&), std::ostream& out, std::ostream& err) {
  Json full;
  full["ok"] = exit_code == kExitOk || (doc.contains("equal") && exit_code == kExitVerifyFailed);
  full["exit_code"] = exit_code;
  for (const auto& item : doc.items()) full[item.key()] = item.value();
  if (flags.json) {
    out << DumpDocument(full) << "\n";
  } else if (print != nullptr) {
    print(full, out);
  }
  WriteResultFile(result_file, full, err);
  return exit_code;
}

int Fail(const absl::Status& status, const OutputFlags& flags, const std::string& result_file,
         std::ostream& out, std::ostream& err, bool usage) {
  // A flag the job does not read is a usage error wherever the engine found it.
  const int code = usage || IsUsageError(status) ? kExitUsage : ExitCodeForStatus(status);
  err << "reshardctl: error: " << status.message() << "\n";
  const Json doc = ErrorDocument(status, code);
  if (flags.json) out << DumpDocument(doc) << "\n";
  WriteResultFile(result_file, doc, err);
  return code;
}

}  // namespace reshard
