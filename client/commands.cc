#include "client/commands.h"

#include <map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/exit_codes.h"
#include "client/progress_bar.h"
#include "client/reports.h"
#include "lib/core/status.h"
#include "lib/engine/conversion.h"
#include "lib/engine/partition_spec.h"
#include "lib/engine/partitioned_conversion.h"
#include "lib/engine/verify.h"
#include "lib/formats/hf/hf_output.h"
#include "lib/io/io_mode.h"

namespace reshard {
namespace {

ReadOptions ReadOptionsFrom(const ConversionFlags& flags) {
  ReadOptions options;
  options.tag = flags.tag;
  options.include_optimizer = flags.include_optimizer;
  return options;
}

}  // namespace

absl::StatusOr<ConversionSpec> ConversionSpecFromFlags(const ConversionFlags& flags, bool reshard,
                                                       bool* usage) {
  absl::StatusOr<ConversionSpec> parsed = ParseConversionFlags(flags, reshard);
  if (usage != nullptr) *usage = !parsed.ok();
  if (!parsed.ok()) return parsed.status();
  ASSIGN_OR_RETURN(ConversionSpec spec, NormalizeSpec(*std::move(parsed)));
  RETURN_IF_ERROR(ValidateSpec(spec, SpecNaming::kFlags));
  return spec;
}

int RunInspect(const ConversionFlags& conversion, const OutputFlags& flags, std::ostream& out,
               std::ostream& err) {
  auto parsed_rules = LoadRules("", conversion.rules);
  if (!parsed_rules.ok()) return Fail(parsed_rules.status(), flags, flags.result_file, out, err);
  auto loaded = LoadInput(conversion.input, *std::move(parsed_rules), /*require_model=*/false,
                          ReadOptionsFrom(conversion));
  if (!loaded.ok()) return Fail(loaded.status(), flags, flags.result_file, out, err);
  auto model_files = InputModelFiles(conversion.input, loaded->model.format);
  if (!model_files.ok()) return Fail(model_files.status(), flags, flags.result_file, out, err);
  loaded->model.description = WithHfFamilyNote(loaded->model, loaded->catalog);
  Json doc = InspectDocument(conversion.input, *loaded, *model_files);
  if (const std::optional<HfExportNote> hf = DescribeHfExport(loaded->model, loaded->catalog, conversion.input)) {
    doc["hf_export"] = HfExportJson(hf->family, hf->note);
  }
  return Emit(std::move(doc), kExitOk, flags, flags.result_file, PrintInspect, out, err);
}

int RunPlan(const ConversionFlags& conversion, const OutputFlags& flags, std::ostream& out,
            std::ostream& err) {
  const bool reshard = conversion.parts > 0;
  bool usage = false;
  auto spec = ConversionSpecFromFlags(conversion, reshard, &usage);
  if (!spec.ok()) return Fail(spec.status(), flags, flags.result_file, out, err, usage);
  if (conversion.partitions < 0 || conversion.partitions > kMaxPartitions) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--partitions must be in [1, ", kMaxPartitions, "]")),
                flags, flags.result_file, out, err, /*usage=*/true);
  }
  auto planned = PlanConversion(*spec);
  if (!planned.ok()) return Fail(planned.status(), flags, flags.result_file, out, err);
  Json doc = PlanDocument(conversion.input, reshard, *planned);
  if (conversion.partitions > 0)
    AddPartitions(doc, planned->plan.files.size(), conversion.partitions);
  return Emit(doc, kExitOk, flags, flags.result_file, PrintPlan, out, err);
}

int RunConvert(const ConversionFlags& conversion, bool reshard, const OutputFlags& flags,
               const std::atomic<bool>* cancelled, std::ostream& out, std::ostream& err) {
  bool usage = false;
  auto spec = ConversionSpecFromFlags(conversion, reshard, &usage);
  if (!spec.ok()) return Fail(spec.status(), flags, flags.result_file, out, err, usage);
  ProgressBar bar(err, flags.terminal);
  RunControl control;
  control.cancelled = cancelled;
  if (flags.progress) control.on_progress = [&bar](const Progress& p) { bar.Update(p); };
  auto result = RunAnyConversion(*spec, control);
  if (flags.progress) bar.Finish();
  if (!result.ok()) return Fail(result.status(), flags, flags.result_file, out, err);
  return Emit(ConversionDocument(conversion.input, reshard, *result), kExitOk, flags,
              flags.result_file, PrintConversion, out, err);
}

int RunCommit(const std::string& output, const OutputFlags& flags, std::ostream& out,
              std::ostream& err) {
  auto result = CommitPartitionedConversion(output);
  if (!result.ok()) return Fail(result.status(), flags, flags.result_file, out, err);
  Json doc = ConversionDocument("", /*reshard=*/false, *result);
  doc["kind"] = "commit";
  return Emit(doc, kExitOk, flags, flags.result_file, PrintConversion, out, err);
}

namespace {

void PrintVerify(const Json& doc, std::ostream& out) {
  if (doc["equal"].get<bool>()) {
    out << "equal: " << doc["tensors_compared"].get<int64_t>() << " tensors, "
        << doc["elements_compared"].get<uint64_t>() << " elements compared ("
        << doc["tolerance"].get<std::string>() << ")\n";
    return;
  }
  out << "DIFFERENT: " << doc["mismatched"].size() << " of "
      << doc["tensors_compared"].get<int64_t>() << " compared tensors differ; "
      << doc["only_in_a"].size() << " only in A, " << doc["only_in_b"].size() << " only in B\n";
  for (const Json& m : doc["mismatched"]) {
    out << "  " << m["name"].get<std::string>() << ": " << m["reason"].get<std::string>();
    if (m.contains("first_index")) {
      out << ", " << m["mismatches"].get<int64_t>() << " element(s), first at flat index "
          << m["first_index"].get<int64_t>() << " (" << m["a"].get<std::string>() << " vs "
          << m["b"].get<std::string>() << ")";
    }
    out << "\n";
  }
  for (const Json& name : doc["only_in_a"])
    out << "  only in A: " << name.get<std::string>() << "\n";
  for (const Json& name : doc["only_in_b"])
    out << "  only in B: " << name.get<std::string>() << "\n";
}

}  // namespace

int RunVerify(const std::string& a, const std::string& b, const ConversionFlags& read,
              const OutputFlags& flags, const std::atomic<bool>* cancelled, std::ostream& out,
              std::ostream& err) {
  VerifyOptions options;
  options.rules_a = read.rules;
  options.rules_b = read.rules;
  options.read = ReadOptionsFrom(read);
  options.cancelled = cancelled;
  auto result = VerifyCheckpoints(a, b, options);
  if (!result.ok()) return Fail(result.status(), flags, flags.result_file, out, err);
  Json doc;
  doc["equal"] = result->equal;
  doc["tensors_compared"] = result->tensors_compared;
  doc["elements_compared"] = result->elements_compared;
  doc["mismatched"] = Json::array();
  for (const TensorMismatch& m : result->mismatched) {
    Json entry{{"name", m.name}, {"reason", m.reason}, {"mismatches", m.mismatches}};
    if (m.first_index >= 0) {
      entry["first_index"] = m.first_index;
      entry["first_byte"] = m.first_byte;
      entry["a"] = m.a_value;
      entry["b"] = m.b_value;
      // Where each side stores the first differing byte, when a piece of it is found.
      auto locate = [&entry](absl::string_view side, const std::string& file, int64_t offset) {
        if (offset < 0) return;
        entry[absl::StrCat(side, "_file")] = file;
        entry[absl::StrCat(side, "_offset")] = offset;
      };
      locate("a", m.a_file, m.a_offset);
      locate("b", m.b_file, m.b_offset);
    }
    doc["mismatched"].push_back(std::move(entry));
  }
  doc["only_in_a"] = result->only_in_a;
  doc["only_in_b"] = result->only_in_b;
  doc["tolerance"] = result->tolerance;
  return Emit(std::move(doc), result->equal ? kExitOk : kExitVerifyFailed, flags, flags.result_file,
              PrintVerify, out, err);
}

}  // namespace reshard
