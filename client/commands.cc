#include "client/commands.h"

#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/exit_codes.h"
#include "client/progress_bar.h"
#include "lib/core/status.h"
#include "lib/engine/conversion.h"
#include "lib/engine/verify.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Json = nlohmann::ordered_json;

std::string_view CodeName(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return "OK";
    case absl::StatusCode::kCancelled: return "CANCELLED";
    case absl::StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound: return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted: return "ABORTED";
    case absl::StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case absl::StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal: return "INTERNAL";
    case absl::StatusCode::kUnavailable: return "UNAVAILABLE";
    case absl::StatusCode::kDataLoss: return "DATA_LOSS";
    case absl::StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

// Reports a failure and returns its exit code. `usage` marks bad flags (exit 2).
int Fail(const absl::Status& status, const OutputFlags& flags, std::ostream& out,
         std::ostream& err, bool usage = false) {
  const int code = usage ? kExitUsage : ExitCodeForStatus(status);
  err << "reshardctl: error: " << status.message() << "\n";
  if (flags.json) {
    Json doc;
    doc["ok"] = false;
    doc["exit_code"] = code;
    doc["error"] = {{"code", CodeName(status.code())}, {"message", std::string(status.message())}};
    out << doc.dump(2) << "\n";
  }
  return code;
}

absl::StatusOr<ConversionSpec> BuildSpec(const ConversionFlags& flags, bool reshard) {
  ConversionSpec spec;
  spec.kind = reshard ? ConversionSpec::Kind::kReshard : ConversionSpec::Kind::kConsolidate;
  spec.input = flags.input;
  spec.output = flags.output;
  ASSIGN_OR_RETURN(spec.dtype, ParseDTypePolicy(flags.dtype));
  ASSIGN_OR_RETURN(spec.max_shard_size, ParseByteSize(flags.max_shard_size));
  ASSIGN_OR_RETURN(spec.window_bytes, ParseByteSize(flags.window_size));
  spec.parts = flags.parts;
  spec.rules_file = flags.rules;
  spec.threads = flags.threads;
  if (reshard && spec.parts < 1) {
    return absl::InvalidArgumentError("reshard needs --parts M (M >= 1)");
  }
  if (reshard && spec.rules_file.empty()) {
    return absl::InvalidArgumentError("reshard needs partition rules: pass --rules FILE");
  }
  return spec;
}

Json TensorJson(const CatalogTensor& tensor) {
  return Json{{"name", tensor.name},
              {"dtype", std::string(DTypeName(tensor.dtype))},
              {"shape", tensor.shape},
              {"bytes", TensorBytes(tensor)},
              {"pieces", tensor.pieces.size()}};
}

std::string DTypeSummary(const Catalog& catalog) {
  std::map<std::string, int> counts;
  for (const CatalogTensor& tensor : catalog.tensors) ++counts[std::string(DTypeName(tensor.dtype))];
  std::vector<std::string> parts;
  for (const auto& [name, count] : counts) parts.push_back(absl::StrCat(name, ": ", count));
  return absl::StrJoin(parts, ", ");
}

uint64_t CatalogBytes(const Catalog& catalog) {
  uint64_t total = 0;
  for (const CatalogTensor& tensor : catalog.tensors) total += TensorBytes(tensor);
  return total;
}

}  // namespace

int RunInspect(const std::string& input, const std::string& rules, const OutputFlags& flags,
               std::ostream& out, std::ostream& err) {
  auto parsed_rules = LoadRules("", rules);
  if (!parsed_rules.ok()) return Fail(parsed_rules.status(), flags, out, err);
  auto loaded = LoadInput(input, *parsed_rules, /*require_model=*/false);
  if (!loaded.ok()) return Fail(loaded.status(), flags, out, err);
  const InputModel& model = loaded->model;
  // The catalog shown: the whole model when known, else part 0 (with a note).
  const Catalog& shown = loaded->merged ? loaded->catalog : model.parts[0];
  std::vector<const SourceFile*> files;
  for (const Catalog& part : model.parts) {
    for (const SourceFile& file : part.files) files.push_back(&file);
  }
  if (flags.json) {
    Json doc;
    doc["ok"] = true;
    doc["path"] = input;
    doc["format"] = model.format;
    doc["layout"] = model.layout;
    doc["parts"] = model.parts.size();
    doc["merged"] = loaded->merged;
    doc["files"] = Json::array();
    for (const SourceFile* file : files) {
      doc["files"].push_back({{"path", file->path}, {"bytes", file->size}});
    }
    doc["tensors"] = Json::array();
    for (const CatalogTensor& tensor : shown.tensors) doc["tensors"].push_back(TensorJson(tensor));
    doc["tensor_count"] = shown.tensors.size();
    doc["total_bytes"] = CatalogBytes(shown);
    doc["metadata"] = shown.metadata;
    out << doc.dump(2) << "\n";
    return kExitOk;
  }
  out << "input:    " << input << "\n";
  out << "format:   " << model.format << " (" << model.layout << ", " << files.size()
      << (files.size() == 1 ? " file" : " files") << ")\n";
  if (model.parts.size() > 1) {
    out << "parts:    " << model.parts.size() << " model-parallel parts"
        << (loaded->merged ? ", merged with the rules" : "; tensors below are part 0's (pass --rules FILE to merge)")
        << "\n";
  }
  out << "tensors:  " << shown.tensors.size() << ", " << HumanBytes(CatalogBytes(shown)) << " ("
      << DTypeSummary(shown) << ")\n";
  if (!shown.metadata.empty()) {
    std::vector<std::string> pairs;
    for (const auto& [key, value] : shown.metadata) pairs.push_back(absl::StrCat(key, "=", value));
    out << "metadata: " << absl::StrJoin(pairs, ", ") << "\n";
  }
  for (const CatalogTensor& tensor : shown.tensors) {
    out << absl::StrFormat("  %-60s %-8s %-24s %s\n", tensor.name, DTypeName(tensor.dtype),
                           ShapeToString(tensor.shape), HumanBytes(TensorBytes(tensor)));
  }
  return kExitOk;
}

int RunPlan(const ConversionFlags& conversion, const OutputFlags& flags, std::ostream& out,
            std::ostream& err) {
  const bool reshard = conversion.parts > 0;
  auto spec = BuildSpec(conversion, reshard);
  if (!spec.ok()) return Fail(spec.status(), flags, out, err, /*usage=*/true);
  auto planned = PlanConversion(*spec);
  if (!planned.ok()) return Fail(planned.status(), flags, out, err);
  const CopyPlan& plan = planned->plan;
  if (flags.json) {
    Json doc;
    doc["ok"] = true;
    doc["kind"] = reshard ? "reshard" : "consolidate";
    doc["input"] = conversion.input;
    doc["files"] = Json::array();
    for (const FilePlan& file : plan.files) {
      doc["files"].push_back({{"name", file.name}, {"bytes", file.bytes}, {"tensors", file.tensors.size()}});
    }
    for (const auto& [name, contents] : planned->companion_files) {
      doc["files"].push_back({{"name", name}, {"bytes", contents.size()}, {"tensors", 0}});
    }
    doc["total_bytes"] = plan.total_bytes;
    doc["source_bytes_read"] = plan.source_bytes_read;
    doc["memory_bytes"] = planned->memory_bytes;
    out << doc.dump(2) << "\n";
    return kExitOk;
  }
  out << (reshard ? "reshard" : "consolidate") << " " << conversion.input << ": "
      << plan.files.size() << (plan.files.size() == 1 ? " output file" : " output files") << ", "
      << HumanBytes(plan.total_bytes) << "\n";
  for (const FilePlan& file : plan.files) {
    out << absl::StrFormat("  %-48s %12s  %d tensors\n", file.name, HumanBytes(file.bytes),
                           file.tensors.size());
  }
  for (const auto& [name, contents] : planned->companion_files) {
    out << absl::StrFormat("  %-48s %12s\n", name, HumanBytes(contents.size()));
  }
  out << "reads " << HumanBytes(plan.source_bytes_read) << " of source data; needs about "
      << HumanBytes(planned->memory_bytes) << " of memory\n";
  return kExitOk;
}

int RunConvert(const ConversionFlags& conversion, bool reshard, const OutputFlags& flags,
               const std::atomic<bool>* cancelled, std::ostream& out, std::ostream& err) {
  auto spec = BuildSpec(conversion, reshard);
  if (!spec.ok()) return Fail(spec.status(), flags, out, err, /*usage=*/true);
  ProgressBar bar(err, flags.terminal);
  RunControl control;
  control.cancelled = cancelled;
  if (flags.progress) control.on_progress = [&bar](const Progress& p) { bar.Update(p); };
  auto result = RunConversion(*spec, control);
  if (flags.progress) bar.Finish();
  if (!result.ok()) return Fail(result.status(), flags, out, err);
  if (flags.json) {
    Json doc;
    doc["ok"] = true;
    doc["kind"] = reshard ? "reshard" : "consolidate";
    doc["input"] = conversion.input;
    doc["output"] = result->output;
    doc["files"] = Json::array();
    for (const WrittenFile& file : result->files) {
      doc["files"].push_back({{"name", file.name},
                              {"bytes", file.bytes},
                              {"tensors", file.tensors},
                              {"xxh3_64", absl::StrFormat("%016x", file.xxh3_64)}});
    }
    doc["tensors"] = result->tensors;
    doc["bytes_read"] = result->bytes_read;
    doc["bytes_written"] = result->bytes_written;
    doc["seconds"] = result->seconds;
    out << doc.dump(2) << "\n";
    return kExitOk;
  }
  const double rate = result->seconds > 0 ? result->bytes_written / result->seconds : 0;
  out << "wrote " << result->output << ": " << result->files.size() << " files, "
      << result->tensors << " tensors, " << HumanBytes(result->bytes_written) << " in "
      << absl::StrFormat("%.2f", result->seconds) << " s (" << HumanBytes(rate) << "/s)\n";
  for (const WrittenFile& file : result->files) {
    out << absl::StrFormat("  %-48s %12s  xxh3 %016x\n", file.name, HumanBytes(file.bytes),
                           file.xxh3_64);
  }
  return kExitOk;
}

int RunVerify(const std::string& a, const std::string& b, const std::string& rules,
              const OutputFlags& flags, const std::atomic<bool>* cancelled, std::ostream& out,
              std::ostream& err) {
  VerifyOptions options;
  options.rules_a = rules;
  options.rules_b = rules;
  options.cancelled = cancelled;
  auto result = VerifyCheckpoints(a, b, options);
  if (!result.ok()) return Fail(result.status(), flags, out, err);
  const int code = result->equal ? kExitOk : kExitVerifyFailed;
  if (flags.json) {
    Json doc;
    doc["ok"] = true;
    doc["equal"] = result->equal;
    doc["exit_code"] = code;
    doc["tensors_compared"] = result->tensors_compared;
    doc["elements_compared"] = result->elements_compared;
    doc["mismatched"] = Json::array();
    for (const TensorMismatch& m : result->mismatched) {
      Json entry{{"name", m.name}, {"reason", m.reason}, {"mismatches", m.mismatches}};
      if (m.first_index >= 0) {
        entry["first_index"] = m.first_index;
        entry["a"] = m.a_value;
        entry["b"] = m.b_value;
      }
      doc["mismatched"].push_back(std::move(entry));
    }
    doc["only_in_a"] = result->only_in_a;
    doc["only_in_b"] = result->only_in_b;
    doc["tolerance"] = result->tolerance;
    out << doc.dump(2) << "\n";
    return code;
  }
  if (result->equal) {
    out << "equal: " << result->tensors_compared << " tensors, " << result->elements_compared
        << " elements compared (" << result->tolerance << ")\n";
    return code;
  }
  out << "DIFFERENT: " << result->mismatched.size() << " of " << result->tensors_compared
      << " compared tensors differ; " << result->only_in_a.size() << " only in " << a << ", "
      << result->only_in_b.size() << " only in " << b << "\n";
  for (const TensorMismatch& m : result->mismatched) {
    out << "  " << m.name << ": " << m.reason;
    if (m.first_index >= 0) {
      out << ", " << m.mismatches << " element(s), first at flat index " << m.first_index << " ("
          << m.a_value << " vs " << m.b_value << ")";
    }
    out << "\n";
  }
  for (const std::string& name : result->only_in_a) out << "  only in A: " << name << "\n";
  for (const std::string& name : result->only_in_b) out << "  only in B: " << name << "\n";
  return code;
}

}  // namespace reshard
