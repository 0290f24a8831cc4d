#include "lib/engine/spec_codec.h"

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "lib/core/status.h"
#include "lib/engine/partition_spec.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/format.h"
#include "lib/formats/hf/hf_family.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"
#include "lib/plan/partition_rules.h"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Fails to compile when ConversionSpec or ReadOptions gains or loses a member: give the new
// member a row in SpecFields() (flag, JobSpec field, JSON key) and list it here.
[[maybe_unused]] void EveryMemberHasARow(const ConversionSpec& spec) {
  [[maybe_unused]] const auto& [kind, input, output, dtype, max_shard_size, parts, pipeline_parts,
               expert_parts, update_latest, no_extra_files, tokenizer, rules_json, rules_file, overwrite, duplicate_tied,
               output_format, read, hf, threads, window_bytes, skip_crc_check, io, partition_index,
               partition_count] = spec;
  [[maybe_unused]] const auto& [tag, include_optimizer] = read;
  [[maybe_unused]] const auto& [family, config_file, vocab_size] = hf;
}
// ConversionSpec's, with ReadOptions' two for `read` and HfExportOptions' three for `hf`.
constexpr size_t kSpecMembers = 27;

absl::string_view KindName(ConversionSpec::Kind kind) {
  return kind == ConversionSpec::Kind::kConsolidate ? "consolidate" : "reshard";
}

absl::Status Invalid(const SpecField& field, SpecNaming naming, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(SpecFieldLabel(field, naming), " ", what));
}

// Invalid, marked as a usage error (IsUsageError): `field` is given to a job that ignores it.
absl::Status NotRead(const SpecField& field, SpecNaming naming, absl::string_view what) {
  return MarkUsageError(Invalid(field, naming, what), field.flag);
}

// The outputs that write pipeline stages (--pipeline-parts) and expert-parallel ranks
// (--expert-parts), and import Hugging Face models
// (PresentHfModelAsMegatron: they read --family and --config of a Hugging Face input).
bool IsMegatronOutput(absl::string_view output_format) {
  return output_format == "megatron" || output_format == "megatron-torch-dist";
}

absl::string_view ReshardKindName(SpecNaming naming) {
  return naming == SpecNaming::kProto ? "JOB_KIND_RESHARD" : "reshard";
}

absl::Status CheckParts(const ConversionSpec& spec, const SpecField& field, SpecNaming naming) {
  if (spec.kind == ConversionSpec::Kind::kReshard && (spec.parts < 1 || spec.parts > kMaxParts)) {
    return Invalid(field, naming, absl::StrCat("must be in [1, ", kMaxParts, "] for a reshard"));
  }
  if (spec.kind == ConversionSpec::Kind::kConsolidate && spec.parts != 0) {
    return Invalid(field, naming, absl::StrCat("is only for ", ReshardKindName(naming)));
  }
  return absl::OkStatus();
}

absl::Status CheckPipelineParts(const ConversionSpec& spec, const SpecField& field,
                                SpecNaming naming) {
  if (spec.pipeline_parts < 0 || spec.pipeline_parts > kMaxParts ||
      (spec.kind == ConversionSpec::Kind::kConsolidate && spec.pipeline_parts != 0)) {
    return Invalid(field, naming,
                   absl::StrCat("must be in [0, ", kMaxParts, "], and only for ",
                                ReshardKindName(naming)));
  }
  if (spec.pipeline_parts != 0 && !IsMegatronOutput(spec.output_format)) {
    return NotRead(
        field, naming,
        absl::StrCat("is only for ", SpecFieldLabel(SpecFieldNamed("output_format"), naming),
                     " megatron and megatron-torch-dist (the outputs with pipeline stages); not "
                     "for output format ",
                     spec.output_format.empty() ? "safetensors" : spec.output_format));
  }
  return absl::OkStatus();
}

absl::Status CheckExpertParts(const ConversionSpec& spec, const SpecField& field,
                              SpecNaming naming) {
  if (spec.expert_parts < 0 || spec.expert_parts > kMaxParts ||
      (spec.kind == ConversionSpec::Kind::kConsolidate && spec.expert_parts != 0)) {
    return Invalid(field, naming,
                   absl::StrCat("must be in [0, ", kMaxParts, "], and only for ",
                                ReshardKindName(naming)));
  }
  // Only the Megatron outputs distribute experts over expert-parallel ranks.
  if (spec.expert_parts != 0 && !IsMegatronOutput(spec.output_format)) {
    return NotRead(field, naming,
                   absl::StrCat("is only for output formats megatron and megatron-torch-dist, not ",
                                spec.output_format.empty() ? "safetensors" : spec.output_format));
  }
  return absl::OkStatus();
}

absl::Status CheckRulesJson(const ConversionSpec& spec, const SpecField& field,
                            SpecNaming naming) {
  // On the command line the rules come from --rules FILE.
  const SpecField& named = naming == SpecNaming::kFlags ? SpecFieldNamed("rules_file") : field;
  if (spec.rules_json.size() > kMaxRulesJsonBytes) {
    return Invalid(named, naming, "is larger than 1 MiB");
  }
  // A reshard without rules is the input format's to judge (Megatron checkpoints bring their
  // own); PlanConversion refuses it naming --rules when it has none.
  if (spec.rules_json.empty()) return absl::OkStatus();
  return PartitionRules::FromJson(spec.rules_json, SpecFieldLabel(named, naming)).status();
}

absl::Status CheckThreads(const ConversionSpec& spec, const SpecField& field, SpecNaming naming) {
  if (spec.threads < 1 || spec.threads > kMaxConversionThreads) {
    return Invalid(field, naming,
                   absl::StrCat("must be in [1, ", kMaxConversionThreads, "] (0: 2), got ",
                                spec.threads));
  }
  return absl::OkStatus();
}

absl::Status CheckWindow(const ConversionSpec& spec, const SpecField& field, SpecNaming naming) {
  if (spec.window_bytes < kMinWindowBytes || spec.window_bytes > kMaxWindowBytes) {
    return Invalid(field, naming, "must be in [4 KiB, 4 GiB] (0: 32 MiB)");
  }
  return absl::OkStatus();
}

absl::Status CheckOutputFormat(const ConversionSpec& spec, const SpecField& field,
                               SpecNaming naming) {
  absl::Status found = FindOutputFormat(spec.output_format).status();
  if (!found.ok()) return Annotate(found, SpecFieldLabel(field, naming));
  return absl::OkStatus();
}

absl::Status CheckTagField(const ConversionSpec& spec, const SpecField& field,
                           SpecNaming naming) {
  // A folder name inside the input, never a path: tag "../x" (from --tag) is not a plain ...
  if (spec.read.tag.empty()) return absl::OkStatus();
  return CheckTag(spec.read.tag, absl::StrCat("from ", SpecFieldLabel(field, naming)));
}

absl::Status CheckPartition(const ConversionSpec& spec, const SpecField& field,
                            SpecNaming naming) {
  if (spec.partition_count < 0 || spec.partition_count > kMaxPartitions ||
      spec.partition_index < 0 ||
      (spec.partition_count > 0 ? spec.partition_index >= spec.partition_count
                                : spec.partition_index != 0)) {
    if (naming == SpecNaming::kFlags) {  // both come from --partition I/K
      return Invalid(SpecFieldNamed("partition_index"), naming,
                     absl::StrCat("I/K needs 0 <= I < K <= ", kMaxPartitions, ", got ",
                                  spec.partition_index, "/", spec.partition_count));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.partition_index must be below spec.partition_count, which must be in [0, ",
        kMaxPartitions, "] (0: not partitioned)"));
  }
  return absl::OkStatus();
}

bool Always(const ConversionSpec&) { return true; }
bool WhenConsolidating(const ConversionSpec& spec) {
  return spec.kind == ConversionSpec::Kind::kConsolidate;
}
bool WhenResharding(const ConversionSpec& spec) {
  return spec.kind == ConversionSpec::Kind::kReshard;
}
bool WhenPipelined(const ConversionSpec& spec) {
  return WhenResharding(spec) && spec.pipeline_parts > 0;
}
bool WhenExpertParallel(const ConversionSpec& spec) {
  return WhenResharding(spec) && spec.expert_parts > 0;
}
bool WhenNoExtraFiles(const ConversionSpec& spec) { return spec.no_extra_files; }
bool WhenTokenizer(const ConversionSpec& spec) { return !spec.tokenizer.empty(); }

bool WhenHfOutput(const ConversionSpec& spec) { return spec.output_format == "hf"; }
// --family and --config also say how a Hugging Face input is imported into Megatron.
bool WhenHfModelDescribed(const ConversionSpec& spec) {
  return WhenHfOutput(spec) || !spec.hf.family.empty() || !spec.hf.config_file.empty();
}


// InvalidArgument, marked as a usage error: `field` is given to a job that ignores it; says
// which jobs read it and why this one is not among them (`not_because`).
absl::Status NotForThisJob(const SpecField& field, SpecNaming naming,
                           absl::string_view not_because) {
  const std::string format = SpecFieldLabel(SpecFieldNamed("output_format"), naming);
  const bool imports = field.name != "hf_vocab_size";
  return NotRead(
      field, naming,
      absl::StrCat("is only for ", format, " hf (a Hugging Face model written from a Megatron "
                   "checkpoint)",
                   imports ? absl::StrCat(" and for a Hugging Face model imported with ", format,
                                          " megatron or megatron-torch-dist")
                           : "",
                   "; ", not_because));
}

// --family, --config and --vocab-size: given only to the jobs that read them (WhenHfOutput,
// ImportsHfModels); whether the input is a Hugging Face model is CheckHfImportFlags' to say.
absl::Status CheckHfModelFlag(const ConversionSpec& spec, const SpecField& field,
                              SpecNaming naming) {
  const bool given = std::visit(
      Overloaded{[&](SpecMember<std::string> m) { return !ReadSpecMember(spec, m).empty(); },
                 [&](SpecMember<int> m) { return ReadSpecMember(spec, m) != 0; },
                 [](auto) { return true; }},
      field.access);
  if (!given || WhenHfOutput(spec)) return absl::OkStatus();
  if (field.name != "hf_vocab_size" && IsMegatronOutput(spec.output_format)) {
    return absl::OkStatus();
  }
  return NotForThisJob(field, naming,
                       absl::StrCat("not for output format ",
                                    spec.output_format.empty() ? "safetensors"
                                                               : spec.output_format));
}

absl::Status CheckHfVocabSize(const ConversionSpec& spec, const SpecField& field,
                              SpecNaming naming) {
  if (spec.hf.vocab_size < 0) return Invalid(field, naming, "must not be negative (0: from the args)");
  return CheckHfModelFlag(spec, field, naming);
}

// Every run (worker, rerun, daemon) must name the same folders, wherever it was started from.
// A path no driver here serves is kept as given: whoever runs the spec refuses it by name.
std::string AbsolutePath(const std::string& path) {
  absl::StatusOr<kvstore::Location> location = kvstore::ParseLocation(path);
  return location.ok() ? location->driver->AbsolutePath(path) : path;
}

// The rules a `--rules` value names: a file's text, or a preset's rules as JSON when no such
// file exists; checked, so that a mistake is reported naming the file.
absl::StatusOr<std::string> ReadRulesFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::string preset = PartitionRulePreset(path);
    if (!preset.empty()) return preset;
    const std::vector<std::string> presets = PartitionRulePresetNames();
    return absl::NotFoundError(absl::StrCat(
        "cannot open partition rules file ", path,
        presets.empty() ? "" : absl::StrCat(" (nor is it a preset: ", absl::StrJoin(presets, ", "), ")")));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > kMaxRulesJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("partition rules file ", path, " is larger than 1 MiB"));
  }
  RETURN_IF_ERROR(PartitionRules::FromJson(text.str(), path).status());
  return text.str();
}

// The JSON value of `field` in `spec`: enums by name, the rest as they are.
OrderedJson FieldJson(const ConversionSpec& spec, const SpecField& field) {
  return std::visit(
      Overloaded{[&](SpecMember<ConversionSpec::Kind> m) -> OrderedJson {
                   return KindName(ReadSpecMember(spec, m));
                 },
                 [&](SpecMember<DTypePolicy> m) -> OrderedJson {
                   return DTypePolicyName(ReadSpecMember(spec, m));
                 },
                 [&](SpecMember<IoMode> m) -> OrderedJson {
                   return IoModeName(ReadSpecMember(spec, m));
                 },
                 [&](auto m) -> OrderedJson { return ReadSpecMember(spec, m); }},
      field.access);
}

// Sets the member of `field` from its flag's text (or value) in `flags`.
absl::Status ParseFlag(const SpecField& field, const ConversionFlags& flags,
                       ConversionSpec& spec) {
  return std::visit(
      Overloaded{
          [](std::monostate) { return absl::OkStatus(); },
          [&](std::string ConversionFlags::*text) -> absl::Status {
            const std::string& value = flags.*text;
            return std::visit(
                Overloaded{
                    [&](SpecMember<std::string> m) -> absl::Status {
                      m(spec) = value;
                      return absl::OkStatus();
                    },
                    [&](SpecMember<DTypePolicy> m) -> absl::Status {
                      ASSIGN_OR_RETURN(m(spec), ParseDTypePolicy(value));
                      return absl::OkStatus();
                    },
                    [&](SpecMember<uint64_t> m) -> absl::Status {
                      ASSIGN_OR_RETURN(m(spec), ParseByteSize(value), field.flag);
                      return absl::OkStatus();
                    },
                    [&](SpecMember<IoMode> m) -> absl::Status {
                      ASSIGN_OR_RETURN(m(spec), ParseIoMode(value), field.flag);
                      return absl::OkStatus();
                    },
                    [&](SpecMember<int>) -> absl::Status {
                      // Only --partition I/K is text for ints: it sets index and count.
                      if (field.name != "partition_index") {
                        return absl::InternalError(
                            absl::StrCat(field.name, ": an int member typed as text"));
                      }
                      if (value.empty()) return absl::OkStatus();
                      ASSIGN_OR_RETURN(const PartitionId partition, ParsePartition(value));
                      spec.partition_index = partition.index;
                      spec.partition_count = partition.count;
                      return absl::OkStatus();
                    },
                    [&](auto) -> absl::Status {
                      return absl::InternalError(
                          absl::StrCat(field.name, ": no text form for this member"));
                    }},
                field.access);
          },
          [&](int ConversionFlags::*number) -> absl::Status {
            if (auto* m = std::get_if<SpecMember<int>>(&field.access)) {
              (*m)(spec) = flags.*number;
              return absl::OkStatus();
            }
            return absl::InternalError(absl::StrCat(field.name, ": not an int member"));
          },
          [&](bool ConversionFlags::*flag) -> absl::Status {
            if (auto* m = std::get_if<SpecMember<bool>>(&field.access)) {
              (*m)(spec) = flags.*flag;
              return absl::OkStatus();
            }
            return absl::InternalError(absl::StrCat(field.name, ": not a bool member"));
          }},
      field.flag_value);
}

// ConversionSpec's default for `field` where the spec holds zero or an empty value.
void ApplyDefault(const SpecField& field, ConversionSpec& spec) {
  if (!field.zero_is_default) return;
  static const ConversionSpec* const kDefaults = new ConversionSpec();
  std::visit(
      [&](auto member) {
        auto& value = member(spec);
        using T = std::decay_t<decltype(value)>;
        if (value == T{}) value = ReadSpecMember(*kDefaults, member);
      },
      field.access);
}

using Kind = ConversionSpec::Kind;
using S = ConversionSpec;
using F = ConversionFlags;

constexpr SpecField kFields[] = {
    // name, flag, help, JobSpec field, JSON key, member, flag's value.
    {"kind",
     "",
     "",
     "kind",
     "kind",
     +[](S& s) -> Kind& { return s.kind; },
     {},
     false,
     false,
     nullptr,
     &Always},
    {"input", "", "input file, folder or s3:// URL (any format read)", "input", "input",
     +[](S& s) -> std::string& { return s.input; }, &F::input},
    {"output", "", "output folder or s3://bucket/prefix (must not exist or be empty)", "output",
     "output", +[](S& s) -> std::string& { return s.output; }, &F::output},
    {"output_format", "--format", "output format: {output_formats}", "output_format",
     "output_format",
     +[](S& s) -> std::string& { return s.output_format; }, &F::output_format, false, true,
     &CheckOutputFormat, &Always},
    {"dtype", "--dtype", "keep | fp32 | bf16 | fp16 (floating tensors)", "dtype", "dtype",
     +[](S& s) -> DTypePolicy& { return s.dtype; }, &F::dtype, false, false, nullptr, &Always},
    {"max_shard_size", "--max-shard-size", "largest output file", "max_shard_size",
     "max_shard_size", +[](S& s) -> uint64_t& { return s.max_shard_size; }, &F::max_shard_size,
     true, true, nullptr, &WhenConsolidating},
    {"parts", "--parts",
     "output tensor-parallel parts M, split or merged by the partition rules (torch-dcp: M "
     "ranks' files; megatron: TP; megatron-torch-dist: M ranks' files, TP M in its args)",
     "parts", "parts",
     +[](S& s) -> int& { return s.parts; }, &F::parts, false, false, &CheckParts, &WhenResharding},
    {"pipeline_parts", "--pipeline-parts",
     "pipeline stages PP (default 1; must divide the layers): --format megatron writes TP x PP "
     "rank folders, from Megatron input (Megatron-LM, Megatron-DeepSpeed, torch_dist) or a "
     "Hugging Face model imported; --format megatron-torch-dist records PP in its args (it "
     "loads at any TP x PP)",
     "pipeline_parts",
     "pipeline_parts", +[](S& s) -> int& { return s.pipeline_parts; }, &F::pipeline_parts, false,
     false, &CheckPipelineParts, &WhenPipelined},
    {"expert_parts", "--expert-parts",
     "expert-parallel ranks EP of a mixture-of-experts model (--format megatron: rank folders "
     "mp_rank_TT[_PPP]_EEE; megatron-torch-dist: the files of EP rank e's ranks hold its "
     "experts; default 1; must divide the experts)",
     "expert_parts", "expert_parts", +[](S& s) -> int& { return s.expert_parts; },
     &F::expert_parts, false, false, &CheckExpertParts, &WhenExpertParallel},
    {"rules_json",
     "",
     "",
     "rules_json",
     "rules_json",
     +[](S& s) -> std::string& { return s.rules_json; },
     {},
     false,
     false,
     &CheckRulesJson},
    {"duplicate_tied", "--duplicate-tied",
     "write tied weights under every name instead of once plus aliases", "duplicate_tied",
     "duplicate_tied", +[](S& s) -> bool& { return s.duplicate_tied; }, &F::duplicate_tied},
    {"tag", "--tag", "DeepSpeed checkpoint tag to read (default: the folder's `latest` file)",
     "tag", "tag", +[](S& s) -> std::string& { return s.read.tag; }, &F::tag, false, false,
     &CheckTagField},
    {"include_optimizer", "--include-optimizer",
     "also read the Adam moments (<param>.exp_avg, <param>.exp_avg_sq)", "include_optimizer",
     "include_optimizer", +[](S& s) -> bool& { return s.read.include_optimizer; },
     &F::include_optimizer},
    {"hf_family", "--family",
     "model family, auto | {hf_families}: --format hf: the family written (auto: from the "
     "args and tensor names); a Hugging Face input written as megatron or megatron-torch-dist: "
     "the family its weights are read as (auto: config.json's model_type, else architectures); "
     "refused for other jobs",
     "hf_family", "hf_family", +[](S& s) -> std::string& { return s.hf.family; }, &F::hf_family,
     false, false, &CheckHfModelFlag, &WhenHfModelDescribed},
    {"hf_config_file", "--config",
     "JSON file FILE: --format hf: keys overriding or completing the config.json made from the "
     "checkpoint's args; a Hugging Face input written as megatron or megatron-torch-dist: the "
     "config.json read in place of the input folder's; refused for other jobs",
     "hf_config_file", "hf_config_file", +[](S& s) -> std::string& { return s.hf.config_file; },
     &F::hf_config_file, false, false, &CheckHfModelFlag, &WhenHfModelDescribed},
    {"hf_vocab_size", "--vocab-size",
     "--format hf only: the true vocabulary N (the tokenizer's size; default: the args'); "
     "padded rows past it are dropped",
     "hf_vocab_size", "hf_vocab_size", +[](S& s) -> int& { return s.hf.vocab_size; },
     &F::hf_vocab_size, false, false, &CheckHfVocabSize, &WhenHfOutput},
    {"update_latest", "--update-latest",
     "also write the format's tracker file beside OUT (deepspeed-universal: latest_universal)",
     "update_latest", "update_latest", +[](S& s) -> bool& { return s.update_latest; },
     &F::update_latest},
    {"no_extra_files", "--no-extra-files",
     "leave out a Hugging Face input's other files (config.json, tokenizer, README, licence)",
     "no_extra_files", "no_extra_files", +[](S& s) -> bool& { return s.no_extra_files; },
     &F::no_extra_files, false, false, nullptr, &WhenNoExtraFiles},
    {"tokenizer", "--tokenizer",
     "also carry the tokenizer files of folder DIR into an output that is a Hugging Face model "
     "(safetensors, consolidated torch, hf; with --format hf in place of the tokenizer beside "
     "the checkpoint)",
     "tokenizer", "tokenizer", +[](S& s) -> std::string& { return s.tokenizer; }, &F::tokenizer,
     false, false, nullptr, &WhenTokenizer},
    {"overwrite", "--overwrite", "replace a non-empty output folder or s3:// prefix", "overwrite",
     "overwrite", +[](S& s) -> bool& { return s.overwrite; }, &F::overwrite},
    // Not part of the request's identity: they change no output byte.
    {"threads", "--threads", "output files written in parallel", "threads", "",
     +[](S& s) -> int& { return s.threads; }, &F::threads, false, true, &CheckThreads},
    {"window_bytes", "--window-size", "copy buffer of the conversion, shared by its threads",
     "window_bytes", "", +[](S& s) -> uint64_t& { return s.window_bytes; }, &F::window_size, true,
     true, &CheckWindow},
    {"skip_crc_check", "--no-crc-check", "do not check the CRC-32s of the torch.save records read",
     "skip_crc_check", "", +[](S& s) -> bool& { return s.skip_crc_check; }, &F::no_crc_check},
    {"io", "--io",
     "auto: direct I/O where the filesystem takes it, page cache left as it was | direct: "
     "direct I/O or fail | buffered: through the page cache",
     "io", "", +[](S& s) -> IoMode& { return s.io; }, &F::io, false, true},
    {"partition_index", "--partition",
     "write only partition I of K (I/K, 0-based; auto: from the Slurm array task, srun step or "
     "Kubernetes Indexed Job; auto/K: K given); the last worker to finish publishes OUT",
     "partition_index", "", +[](S& s) -> int& { return s.partition_index; }, &F::partition},
    {"partition_count",
     "",
     "",
     "partition_count",
     "",
     +[](S& s) -> int& { return s.partition_count; },
     {},
     false,
     false,
     &CheckPartition},
    // A rules file or preset on this machine; NormalizeSpec turns it into rules_json.
    {"rules_file", "--rules", "partition rules JSON file, or a preset: metaseq | megatron", "", "",
     +[](S& s) -> std::string& { return s.rules_file; }, &F::rules},
};
static_assert(std::size(kFields) == kSpecMembers, "a ConversionSpec member without a row");

}  // namespace

absl::Span<const SpecField> SpecFields() { return kFields; }

const SpecField& SpecFieldNamed(absl::string_view name) {
  for (const SpecField& field : SpecFields()) {
    if (field.name == name) return field;
  }
  std::cerr << "reshard: no ConversionSpec field " << name << "\n";
  std::abort();
}

std::string SpecFieldHelp(const SpecField& field) {
  std::vector<std::string> families;
  for (const HfFamily& family : HfFamilies()) families.emplace_back(family.id);
  return absl::StrReplaceAll(
      field.help, {{"{output_formats}", absl::StrJoin(OutputFormatIds(), " | ")},
                   {"{hf_families}", absl::StrJoin(families, " | ")}});
}

std::string SpecFieldLabel(const SpecField& field, SpecNaming naming) {
  if (naming == SpecNaming::kProto && !field.proto.empty()) {
    return absl::StrCat("spec.", field.proto);
  }
  if (!field.flag.empty()) return std::string(field.flag);
  return std::string(field.name);
}

std::string SpecFieldText(const ConversionSpec& spec, const SpecField& field) {
  return std::visit(
      Overloaded{
          [&](SpecMember<ConversionSpec::Kind> m) {
            return std::string(KindName(ReadSpecMember(spec, m)));
          },
          [&](SpecMember<std::string> m) { return ReadSpecMember(spec, m); },
          [&](SpecMember<DTypePolicy> m) {
            return std::string(DTypePolicyName(ReadSpecMember(spec, m)));
          },
          [&](SpecMember<uint64_t> m) { return absl::StrCat(ReadSpecMember(spec, m)); },
          [&](SpecMember<int> m) { return absl::StrCat(ReadSpecMember(spec, m)); },
          [&](SpecMember<bool> m) { return std::string(ReadSpecMember(spec, m) ? "true" : "false"); },
          [&](SpecMember<IoMode> m) { return std::string(IoModeName(ReadSpecMember(spec, m))); }},
      field.access);
}

absl::StatusOr<ConversionSpec> ParseConversionFlags(const ConversionFlags& flags, bool reshard) {
  ConversionSpec spec;
  spec.kind = reshard ? ConversionSpec::Kind::kReshard : ConversionSpec::Kind::kConsolidate;
  for (const SpecField& field : SpecFields()) {
    RETURN_IF_ERROR(ParseFlag(field, flags, spec));
  }
  if (reshard && spec.parts < 1) {
    return absl::InvalidArgumentError("reshard needs --parts M (M >= 1)");
  }
  return spec;
}

absl::StatusOr<ConversionSpec> NormalizeSpec(ConversionSpec spec) {
  spec.input = AbsolutePath(spec.input);
  spec.output = AbsolutePath(spec.output);
  if (!spec.tokenizer.empty()) spec.tokenizer = AbsolutePath(spec.tokenizer);
  if (!spec.hf.config_file.empty()) spec.hf.config_file = AbsolutePath(spec.hf.config_file);
  if (!spec.rules_file.empty()) {
    if (spec.rules_json.empty()) {
      ASSIGN_OR_RETURN(spec.rules_json, ReadRulesFile(spec.rules_file));
    }
    spec.rules_file.clear();
  }
  for (const SpecField& field : SpecFields()) ApplyDefault(field, spec);
  return spec;
}

absl::Status ValidateSpec(const ConversionSpec& spec, SpecNaming naming) {
  for (const SpecField& field : SpecFields()) {
    if (field.check != nullptr) RETURN_IF_ERROR(field.check(spec, field, naming));
  }
  return absl::OkStatus();
}

absl::Status CheckHfImportFlags(const ConversionSpec& spec, bool hf_model_imported,
                                absl::string_view input_format, SpecNaming naming) {
  if (WhenHfOutput(spec) || hf_model_imported) return absl::OkStatus();
  for (absl::string_view name : {"hf_family", "hf_config_file"}) {
    const SpecField& field = SpecFieldNamed(name);
    if (SpecFieldText(spec, field).empty()) continue;
    return NotForThisJob(field, naming,
                         absl::StrCat("the input is ", input_format,
                                      ", not a Hugging Face model folder"));
  }
  return absl::OkStatus();
}

absl::StatusOr<OrderedJson> SpecToRequestJson(const ConversionSpec& spec) {
  ASSIGN_OR_RETURN(const ConversionSpec normal, NormalizeSpec(spec));
  OrderedJson request;
  for (const SpecField& field : SpecFields()) {
    if (!field.json.empty()) request[std::string(field.json)] = FieldJson(normal, field);
  }
  return request;
}

OrderedJson SpecToManifestRequest(const ConversionSpec& spec) {
  OrderedJson request;
  for (const SpecField& field : SpecFields()) {
    if (field.in_manifest != nullptr && field.in_manifest(spec)) {
      request[std::string(field.json)] = FieldJson(spec, field);
    }
  }
  return request;
}

absl::StatusOr<ConversionSpec> SpecFromRequestJson(const OrderedJson& request,
                                                   absl::string_view where) {
  ConversionSpec spec;
  for (const SpecField& field : SpecFields()) {
    if (field.json.empty()) continue;
    const std::string key(field.json);
    auto bad = [&] {
      return absl::DataLossError(
          absl::StrCat(where, ": \"request\".\"", key, "\" is missing or invalid"));
    };
    if (!request.is_object() || !request.contains(key)) return bad();
    const OrderedJson& value = request[key];
    const bool ok = std::visit(
        Overloaded{[&](SpecMember<ConversionSpec::Kind> m) {
                     if (value == "consolidate") {
                       m(spec) = ConversionSpec::Kind::kConsolidate;
                     } else if (value == "reshard") {
                       m(spec) = ConversionSpec::Kind::kReshard;
                     } else {
                       return false;
                     }
                     return true;
                   },
                   [&](SpecMember<DTypePolicy> m) {
                     if (!value.is_string()) return false;
                     auto dtype = ParseDTypePolicy(value.get<std::string>());
                     if (!dtype.ok()) return false;
                     m(spec) = *dtype;
                     return true;
                   },
                   [&](SpecMember<IoMode> m) {
                     if (!value.is_string()) return false;
                     auto io = ParseIoMode(value.get<std::string>());
                     if (!io.ok()) return false;
                     m(spec) = *io;
                     return true;
                   },
                   [&](SpecMember<std::string> m) {
                     if (!value.is_string()) return false;
                     m(spec) = value.get<std::string>();
                     return true;
                   },
                   [&](SpecMember<bool> m) {
                     if (!value.is_boolean()) return false;
                     m(spec) = value.get<bool>();
                     return true;
                   },
                   [&](SpecMember<int> m) {
                     if (!value.is_number_integer()) return false;
                     const int64_t number = value.get<int64_t>();
                     if (number < INT32_MIN || number > INT32_MAX) return false;
                     m(spec) = static_cast<int>(number);
                     return true;
                   },
                   [&](SpecMember<uint64_t> m) {
                     if (!value.is_number_unsigned()) return false;
                     m(spec) = value.get<uint64_t>();
                     return true;
                   }},
        field.access);
    if (!ok) return bad();
  }
  return spec;
}

}  // namespace reshard
