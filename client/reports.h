// The documents reshardctl prints: every command builds one JSON document (what `--json`
// prints and `--result-file` holds) and, for people, renders the same document as text. Local
// and daemon results are turned into the same documents, so both modes print alike.

#ifndef RESHARD_CLIENT_REPORTS_H_
#define RESHARD_CLIENT_REPORTS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "lib/engine/conversion.h"
#include "lib/formats/hf/model_files.h"
#include "nlohmann/json.hpp"
#include "proto/reshard/v1/reshard.pb.h"

namespace reshard {

using Json = nlohmann::ordered_json;

struct OutputFlags {
  bool json = false;        // one JSON document on `out`
  bool progress = true;     // show progress on `err`
  bool terminal = false;    // `err` is a terminal: redraw a bar instead of plain lines
  std::string result_file;  // also write the JSON document here, on success and failure
};

// Documents of local results.
// `model_files`: what a conversion of the input carries beside the weights (InputModelFiles).
Json InspectDocument(const std::string& input, const LoadedInput& loaded,
                     const std::vector<ModelFile>& model_files = {});
Json PlanDocument(const std::string& input, bool reshard, const PlannedConversion& planned);
Json ConversionDocument(const std::string& input, bool reshard, const ConversionResult& result);
// Adds "partitions" to a plan document: the first `data_files` of its "files" dealt to `count`
// partitions as a partitioned conversion deals them, with their bytes.
void AddPartitions(Json& plan_doc, size_t data_files, int count);

// Documents of daemon results, with the same fields.
Json InspectDocument(const std::string& input, const v1::InspectResponse& response);
Json PlanDocument(const std::string& input, bool reshard, const v1::PlanResponse& response);

// inspect's "hf_export" of a Megatron checkpoint: {"family": the family `--format hf` writes it
// as (null when refused), "note": what the text output says of it} (DescribeHfExport,
// lib/formats/hf/hf_output.h). Other input's is null.
Json HfExportJson(const std::string& family, const std::string& note);

// A job: "job_id", "state", "job" (the full reshard.v1.Job as JSON) and, once it succeeded,
// the fields of ConversionDocument.
Json JobDocument(const v1::Job& job);

// Text renderings.
void PrintInspect(const Json& doc, std::ostream& out);
void PrintPlan(const Json& doc, std::ostream& out);
void PrintConversion(const Json& doc, std::ostream& out);
void PrintJob(const Json& doc, std::ostream& out);

// The failure document: {"ok": false, "exit_code": N, "error": {"code", "message"}}.
Json ErrorDocument(const absl::Status& status, int exit_code);

// Prints `doc` (JSON or via `print`), writes it to `result_file` when given, returns
// `exit_code`. `doc` gets "ok" and "exit_code" set.
int Emit(Json doc, int exit_code, const OutputFlags& flags, const std::string& result_file,
         void (*print)(const Json&, std::ostream&), std::ostream& out, std::ostream& err);

// Reports a failure: message on `err`, error document as above. `usage` (or a status that
// IsUsageError, lib/engine/spec_codec.h) makes the exit code 2.
int Fail(const absl::Status& status, const OutputFlags& flags, const std::string& result_file,
         std::ostream& out, std::ostream& err, bool usage = false);

std::string StatusCodeName(absl::StatusCode code);

}  // namespace reshard

#endif  // RESHARD_CLIENT_REPORTS_H_
