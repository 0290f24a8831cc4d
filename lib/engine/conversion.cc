#include "lib/engine/conversion.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/core/test_faults.h"
#include "lib/engine/spec_codec.h"
#include "lib/formats/hf/model_files.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/io/atomic_file.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/posix_driver.h"
#include "lib/io/staging_dir.h"
#include "lib/plan/planner.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Manifests list every tensor; this bounds what a hostile one can make us allocate.
constexpr uint64_t kMaxManifestBytes = 256ull << 20;

// Removes everything below `dir` (named `relative` inside the staging folder) but the regular
// files named in `kept`, and the folders left empty: nothing a taken-over staging folder held
// is published unless it is reused.
absl::Status RemoveAllBut(const Directory& dir, const std::string& relative,
                          const std::set<std::string>& kept) {
  ASSIGN_OR_RETURN(const std::vector<std::string> names, dir.List());
  for (const std::string& name : names) {
    const std::string path = relative.empty() ? name : absl::StrCat(relative, "/", name);
    ASSIGN_OR_RETURN(const struct stat st, dir.StatChild(name));
    if (S_ISDIR(st.st_mode)) {
      ASSIGN_OR_RETURN(const Directory child, dir.OpenChild(name));
      RETURN_IF_ERROR(RemoveAllBut(child, path, kept));
      ASSIGN_OR_RETURN(const std::vector<std::string> left, child.List());
      if (left.empty()) RETURN_IF_ERROR(dir.RemoveTree(name));
    } else if (!S_ISREG(st.st_mode) || kept.count(path) == 0) {
      RETURN_IF_ERROR(dir.RemoveTree(name));
    }
  }
  return absl::OkStatus();
}

// Takes over what a killed run left in the staging folder `area` (empty for a new one): keeps
// the data files its records show finished for plan `plan_id`, with their records of their own,
// and removes everything else (other plans' files, a manifest written before the run was
// killed, damaged records, the log, which RunConversion writes anew).
absl::StatusOr<ReusableFiles> TakeOverStaging(const OutputArea& area, const StagingDir& staging,
                                              const PlannedConversion& planned,
                                              const std::string& plan_id) {
  ASSIGN_OR_RETURN(const AreaContents contents, area.List());
  ReusableFiles reuse;
  if (!contents.files.empty()) {
    ASSIGN_OR_RETURN(reuse, area.FindReusable(contents, planned.plan, plan_id));
  }
  RETURN_IF_ERROR(RemoveAllBut(staging.dir(), "", reuse.kept),
                  absl::StrCat("removing what an earlier run left in ", staging.path()));
  return reuse;
}

}  // namespace

absl::StatusOr<PartitionRules> LoadRules(const std::string& rules_json,
                                         const std::string& rules_file) {
  if (!rules_json.empty()) return PartitionRules::FromJson(rules_json, "(inline)");
  if (!rules_file.empty()) return PartitionRules::FromFile(rules_file);
  return PartitionRules();
}

absl::StatusOr<LoadedInput> LoadInput(const std::string& path, PartitionRules rules,
                                      bool require_model, const ReadOptions& options) {
  RETURN_IF_ERROR(CheckInputPath(path, "input"));
  LoadedInput loaded;
  loaded.path = path;
  // A folder that is a key prefix is named without its trailing '/' (s3://b/model/ reads as
  // s3://b/model): formats join "folder/name", and a key with an empty segment is refused.
  std::string read_path = path;
  if (!InputHasFolders(read_path)) {
    while (absl::EndsWith(read_path, "/") && !absl::EndsWith(read_path, "://")) {
      read_path.pop_back();
    }
  }
  {
    // Every format's Probe asks about the same folder and its marker files.
    ScopedRemoteListingCache remote_listings;
    ASSIGN_OR_RETURN(const InputFormat* format, DetectInputFormat(read_path));
    ASSIGN_OR_RETURN(loaded.model, format->Read(read_path, options));
  }
  if (loaded.model.description.empty()) {
    loaded.model.description = DescribeInputModel(loaded.model);
  }
  for (const Catalog& part : loaded.model.parts) {
    RETURN_IF_ERROR(ValidateCatalog(part));
  }
  if (rules.empty() && !loaded.model.default_rules.empty()) {
    auto defaults = PartitionRules::Create(loaded.model.default_rules);
    if (!defaults.ok()) {
      return Annotate(defaults.status(),
                      absl::StrCat(path, ": ", loaded.model.format, " default rules"));
    }
    rules = *std::move(defaults);
  }
  loaded.rules = std::move(rules);
  if (loaded.model.parts.size() > 1 && loaded.rules.empty() && !require_model) return loaded;
  ASSIGN_OR_RETURN(loaded.catalog,
                   MergeParts(loaded.model.parts, loaded.rules, loaded.model.part_names), path);
  loaded.catalog.Reindex();
  loaded.merged = true;
  return loaded;
}

uint64_t MemoryUpperBound(const ConversionSpec& spec) {
  constexpr uint64_t kMetadataSlack = 64ull << 20;
  // The window is shared by the threads (ExecutorOptions::window_bytes); each thread adds its
  // mapped source pages (4 MiB), a direct-I/O stage and a span buffer (1 MiB each).
  constexpr uint64_t kPerThread = 6ull << 20;
  return 4 * spec.window_bytes + static_cast<uint64_t>(std::max(spec.threads, 1)) * kPerThread +
         kMetadataSlack;
}

absl::StatusOr<PlannedConversion> PlanConversion(const ConversionSpec& spec) {
  if (spec.input.empty()) return absl::InvalidArgumentError("no input given");
  if (spec.threads < 1 || spec.threads > kMaxConversionThreads) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be in [1, ", kMaxConversionThreads, "], got ", spec.threads));
  }
  if (spec.window_bytes < kMinWindowBytes || spec.window_bytes > kMaxWindowBytes) {
    return absl::InvalidArgumentError("window size must be between 4 KiB and 4 GiB");
  }
  if (spec.pipeline_parts < 0 || spec.pipeline_parts > kMaxParts) {
    return absl::InvalidArgumentError(absl::StrCat("--pipeline-parts must be in [1, ", kMaxParts,
                                                   "], got ", spec.pipeline_parts));
  }
  PlannedConversion planned;
  ASSIGN_OR_RETURN(planned.writer, FindOutputFormat(spec.output_format));
  ReadOptions read = spec.read;
  if (planned.writer->needs_optimizer_state()) read.include_optimizer = true;
  ASSIGN_OR_RETURN(PartitionRules user_rules, LoadRules(spec.rules_json, spec.rules_file));
  auto loaded = LoadInput(spec.input, std::move(user_rules), /*require_model=*/true, read);
  if (!loaded.ok() && read.include_optimizer && !spec.read.include_optimizer) {
    // The reader's message speaks of --include-optimizer, which the user did not give.
    return Annotate(loaded.status(), absl::StrCat("--format ", spec.output_format,
                                                  " reads the optimizer's Adam moments"));
  }
  if (!loaded.ok()) return loaded.status();
  planned.input = *std::move(loaded);
  {
    const bool reshard = spec.kind == ConversionSpec::Kind::kReshard;
    ASSIGN_OR_RETURN(
        const bool presented,
        planned.writer->PresentInput(planned.input.path, reshard ? spec.parts : 1,
                                     reshard ? std::max(spec.pipeline_parts, 1) : 1, spec.hf,
                                     planned.input.model, planned.input.catalog),
        absl::StrCat(spec.input, ": presenting the input to the ", spec.output_format, " output"));
    // --family and --config: read by --format hf, and by the Megatron outputs only for a
    // Hugging Face model they presented.
    RETURN_IF_ERROR(
        CheckHfImportFlags(spec, presented, planned.input.model.format, SpecNaming::kFlags),
        spec.input);
    if (presented) {
      ASSIGN_OR_RETURN(planned.input.rules,
                       PartitionRules::Create(planned.input.model.default_rules),
                       absl::StrCat(spec.input, ": ", spec.output_format, " rules"));
    }
  }
  const PartitionRules& rules = planned.input.rules;
  const Catalog& catalog = planned.input.catalog;
  // What the plan reads: the input's Catalog, or its fused-block view for a split.
  Catalog viewed;
  const Catalog* plan_catalog = &catalog;
  if (spec.kind == ConversionSpec::Kind::kConsolidate) {
    ASSIGN_OR_RETURN(
        planned.layout,
        BuildConsolidateLayout(catalog, spec.dtype, spec.max_shard_size, planned.writer->naming(),
                               /*dedupe_tied=*/!spec.duplicate_tied));
  } else {
    if (spec.parts < 1 || spec.parts > kMaxParts) {
      return absl::InvalidArgumentError(
          absl::StrCat("--parts must be in [1, ", kMaxParts, "], got ", spec.parts));
    }
    if (rules.empty()) {
      return absl::InvalidArgumentError(
          "reshard needs partition rules: pass --rules FILE (or a preset: metaseq, megatron)");
    }
    ASSIGN_OR_RETURN(viewed, ViewFusedTensors(catalog, rules));
    // A Megatron-DeepSpeed fused QKV merged from sub-params ([q; k; v]) is split as its TP
    // ranks save it: part t holds [q_t; k_t; v_t].
    RETURN_IF_ERROR(ViewSubParamsByPart(planned.input.model.training_state.values, rules,
                                        spec.parts, viewed),
                    spec.input);
    plan_catalog = &viewed;
    ASSIGN_OR_RETURN(planned.layout, BuildSplitLayout(viewed, rules, spec.parts, spec.dtype,
                                                      planned.writer->naming()));
  }
  ArrangeRequest request{planned.input.model, *plan_catalog};
  request.consolidate = spec.kind == ConversionSpec::Kind::kConsolidate;
  request.parts = spec.parts;
  request.pipeline_parts = spec.pipeline_parts;
  request.expert_parts = spec.expert_parts;
  request.dtype = spec.dtype;
  request.max_shard_size = spec.max_shard_size;
  request.hf = spec.hf;
  request.output_name = std::filesystem::path(spec.output).lexically_normal().filename().string();
  if (request.output_name.empty()) {
    request.output_name =
        std::filesystem::path(spec.output).lexically_normal().parent_path().filename().string();
  }
  // The model's files carried beside the weights: a Hugging Face input's config, tokenizer and
  // README, a Megatron checkpoint's tokenizer; --format hf reads the tokenizer's token ids.
  ASSIGN_OR_RETURN(
      const std::vector<ModelFile> model_files,
      ModelFilesToCarry(planned.input.path, planned.input.model.format, spec.output_format,
                        request.consolidate, spec.no_extra_files, spec.tokenizer,
                        planned.input.model.model_files));
  for (const ModelFile& file : model_files) {
    if (file.in_archive) {
      request.archive_model_files.push_back(
          {file.name, file.path, file.offset, file.size, file.member});
    } else {
      request.model_files.emplace_back(file.name, file.path);
    }
  }
  ASSIGN_OR_RETURN(ArrangedOutput arranged,
                   planned.writer->Arrange(std::move(planned.layout), request),
                   absl::StrCat(spec.input, ": arranging the ", spec.output_format, " output"));
  // The format's companion files (index) describe its own files; the model files join the
  // output after them.
  ASSIGN_OR_RETURN(planned.companion_files, planned.writer->CompanionFiles(arranged.layout));
  RETURN_IF_ERROR(
      AddModelFiles(model_files, spec.dtype, *plan_catalog, arranged, planned.companion_files),
      absl::StrCat(spec.input, ": carrying the model's files"));
  planned.layout = std::move(arranged.layout);
  planned.beside_output = std::move(arranged.beside_output);
  // Tensors only the format's arrangement reads (verbatim copies, training state).
  Catalog extended;
  if (!arranged.extra_tensors.empty()) {
    extended = *plan_catalog;
    const int file_base = static_cast<int>(extended.files.size());
    for (SourceFile& file : arranged.extra_files) extended.files.push_back(std::move(file));
    for (CatalogTensor& tensor : arranged.extra_tensors) {
      for (SourcePiece& piece : tensor.pieces) piece.file += file_base;
      extended.tensors.push_back(std::move(tensor));
    }
    extended.Reindex();
    plan_catalog = &extended;
  }
  std::vector<FileFraming> framings;
  for (const OutputFileLayout& file : planned.layout.files) {
    if (file.verbatim) {
      FileFraming framing;
      framing.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
      framings.push_back(std::move(framing));
      continue;
    }
    ASSIGN_OR_RETURN(FileFraming framing, planned.writer->Frame(file), file.name);
    framings.push_back(std::move(framing));
  }
  ASSIGN_OR_RETURN(planned.plan, BuildCopyPlan(*plan_catalog, planned.layout, framings),
                   spec.input);
  planned.memory_bytes = EstimateExecutionMemory(planned.plan, ExecutorOptionsFor(spec));
  ASSIGN_OR_RETURN(const kvstore::Location output, kvstore::ParseLocation(spec.output), "output");
  const ConversionMemory memory = ShareConversionMemory(spec, planned.plan, *output.driver);
  planned.memory_bytes = memory.memory_bytes;
  planned.window_bytes = memory.window_bytes;
  planned.remote_span_bytes = memory.remote_span_bytes;
  planned.writer_budget = memory.writer_budget;
  return planned;
}

ConversionMemory ShareConversionMemory(const ConversionSpec& spec, const CopyPlan& plan,
                                       const kvstore::Driver& driver) {
  ExecutorOptions options = ExecutorOptionsFor(spec);
  ConversionMemory shared;
  shared.window_bytes = spec.window_bytes;
  shared.remote_span_bytes = options.remote_span_bytes;
  const uint64_t local = EstimateExecutionMemory(plan, options);
  shared.memory_bytes = local;
  // Each data file's writer holds at most this much for the largest file.
  uint64_t largest = 0;
  for (const FilePlan& file : plan.files) largest = std::max(largest, file.bytes);
  kvstore::WriteOptions write;
  write.size_hint = largest;
  const uint64_t unbounded = driver.WriteMemoryBound(write);
  const bool remote_input =
      std::any_of(plan.sources.begin(), plan.sources.end(),
                  [](const SourceFile& source) { return InputReadsAreRequests(source.path); });
  if (unbounded == 0 && !remote_input) return shared;
  // The files written at once: each worker's work unit's files.
  size_t files_at_once = 0;
  for (const WorkUnit& unit : WorkUnits(plan)) {
    files_at_once = std::max(files_at_once, unit.files.size());
  }
  const uint64_t files = std::max<uint64_t>(
      1, std::min(plan.files.size(), files_at_once * static_cast<size_t>(std::max(spec.threads, 1))));
  // At most what the cap leaves once the process's own memory is set aside (kProcessMemory).
  const uint64_t budget = std::min(local, kOutputMemoryCap - kProcessMemory);
  constexpr uint64_t kSmallestWindow = 1ull << 20;
  constexpr uint64_t kSmallestSpans = 1ull << 20;
  const uint64_t smallest = std::min(spec.window_bytes, kSmallestWindow);
  bool found = false;
  uint64_t best_writer = 0;
  options.window_bytes = spec.window_bytes;
  while (true) {
    const uint64_t execution = EstimateExecutionMemory(plan, options);
    uint64_t writer = 0;
    if (unbounded > 0) {
      write.memory_budget =
          budget > execution ? std::max<uint64_t>(1, (budget - execution) / files) : 1;
      writer = driver.WriteMemoryBound(write);
    }
    const bool fits = execution + files * writer <= budget;
    // The next, smaller candidate: the window halves first, down to its least; the spans only
    // then, and only for a remote input: a remote read's throughput falls with shorter spans
    // (each is one round of range requests), a window's hardly does.
    const bool window_halves = options.window_bytes / 2 >= smallest;
    const bool spans_halve = remote_input && options.remote_span_bytes / 2 >= kSmallestSpans;
    const bool last = !window_halves && !spans_halve;
    // The largest window and spans that give the writers the most memory that fits; without a
    // fit, the smallest window and spans and the writers' least.
    if ((fits && (!found || writer > best_writer)) ||
        (!found && (last || (unbounded > 0 && writer >= unbounded)))) {
      shared.window_bytes = options.window_bytes;
      shared.remote_span_bytes = options.remote_span_bytes;
      shared.writer_budget = write.memory_budget;
      shared.memory_bytes = execution + files * writer;
      best_writer = writer;
      found = found || fits;
    }
    // Nothing more to give the writers (a driver whose writers hold nothing: the first fit).
    if (writer >= unbounded && (unbounded > 0 || fits)) break;
    if (last) break;
    if (window_halves) {
      options.window_bytes /= 2;
    } else {
      options.remote_span_bytes /= 2;
    }
  }
  return shared;
}

absl::StatusOr<std::string> ConversionRequestJson(const ConversionSpec& spec) {
  ASSIGN_OR_RETURN(const OrderedJson request, SpecToRequestJson(spec));
  return request.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

ExecutorOptions ExecutorOptionsFor(const ConversionSpec& spec, const RunControl& control) {
  ExecutorOptions options;
  options.threads = spec.threads;
  options.window_bytes = spec.window_bytes;
  options.on_progress = control.on_progress;
  options.cancelled = control.cancelled;
  options.on_file_committed = control.on_file_committed;
  options.check_source_crc32 = !spec.skip_crc_check;
  options.io = spec.io;
  return options;
}

void RecordExecution(const ExecutionResult& executed, ConversionResult& result) {
  result.files = executed.files;
  result.bytes_read = executed.bytes_read;
  result.bytes_written = executed.bytes_written;
  result.data_phases = executed.phases;
  result.verification_failures = executed.verification_failures;
  result.reused_files = executed.reused_files;
  result.reused_bytes = executed.reused_bytes;
  result.direct_files = executed.direct_files;
  result.buffered_files = executed.buffered_files;
}

absl::Status WriteCompanions(const PlannedConversion& planned, const PutOutputFile& put,
                             ConversionResult& result) {
  for (const auto& [name, contents] : planned.companion_files) {
    RETURN_IF_ERROR(put(name, contents));
    result.files.push_back(
        {name, contents.size(), XXH3_64bits(contents.data(), contents.size()), 0});
    result.bytes_written += contents.size();
  }
  return absl::OkStatus();
}

absl::Status WriteCompanionsAndManifest(const Directory& dir, const ConversionSpec& spec,
                                        const PlannedConversion& planned, const RunControl& control,
                                        const std::string& split_id, ConversionResult& result) {
  RETURN_IF_ERROR(WriteCompanions(
      planned,
      [&dir](const std::string& name, absl::string_view contents) {
        return WriteFileAtomically(dir, name, contents);
      },
      result));
  // The manifest is the commit mark: written last, then the folder is published at once.
  const std::string manifest = BuildManifest(spec, planned, result.files, control.job_id, split_id);
  RETURN_IF_ERROR(WriteFileAtomically(dir, kManifestName, manifest));
  result.bytes_written += manifest.size();
  TestFaultPoint("before-publish", control.cancelled);
  if (control.cancelled != nullptr && control.cancelled->load()) {
    return absl::CancelledError("conversion cancelled");
  }
  return absl::OkStatus();
}

std::string BuildManifest(const ConversionSpec& spec, const PlannedConversion& planned,
                          const std::vector<WrittenFile>& files, const std::string& job_id,
                          const std::string& split_id) {
  OrderedJson manifest;
  manifest["tool"] = "reshard";
  manifest["version"] = kReshardVersion;
  manifest["created_unix"] = static_cast<int64_t>(std::time(nullptr));
  OrderedJson source;
  source["path"] = planned.input.path;
  source["format"] = planned.input.model.format;
  source["layout"] = planned.input.model.arrangement;
  if (!planned.input.model.description.empty()) {
    source["description"] = planned.input.model.description;
  }
  source["parts"] = planned.input.model.parts.size();
  source["files"] = planned.input.catalog.files.size();
  manifest["source"] = source;
  manifest["request"] = SpecToManifestRequest(spec);
  if (!job_id.empty()) manifest["job_id"] = job_id;
  if (!split_id.empty()) manifest["split_id"] = split_id;
  OrderedJson file_list = OrderedJson::array();
  for (const WrittenFile& file : files) {
    file_list.push_back({{"name", file.name},
                         {"bytes", file.bytes},
                         {"xxh3_64", absl::StrFormat("%016x", file.xxh3_64)}});
  }
  manifest["files"] = file_list;
  OrderedJson tensors = OrderedJson::array();
  for (const OutputFileLayout& file : planned.layout.files) {
    for (const OutputTensor& tensor : file.tensors) {
      tensors.push_back({{"name", tensor.name},
                         {"file", file.name},
                         {"dtype", std::string(DTypeName(tensor.dtype))},
                         {"shape", tensor.shape()}});
    }
  }
  manifest["tensors"] = tensors;
  return manifest.dump(2, ' ', false, OrderedJson::error_handler_t::replace) + "\n";
}

absl::StatusOr<ConversionResult> RunConversion(const ConversionSpec& spec,
                                               const RunControl& control) {
  const auto start = Clock::now();
  if (spec.output.empty()) return absl::InvalidArgumentError("no output folder given");
  if (spec.partition_count > 0) {
    return absl::InvalidArgumentError(
        "a partitioned conversion runs through RunAnyConversion (partitioned_conversion.h)");
  }
  RETURN_IF_ERROR(CheckInputPath(spec.input, "input"));
  ASSIGN_OR_RETURN(const kvstore::Location output, kvstore::ParseLocation(spec.output), "output");
  if (!output.driver->has_folders()) {
    return absl::InvalidArgumentError(
        absl::StrCat("output ", spec.output,
                     ": outputs on storage without folders run through RunAnyConversion "
                     "(partitioned_conversion.h)"));
  }
  if (control.resume && !control.job_id.empty()) {
    ASSIGN_OR_RETURN(std::optional<ConversionResult> published,
                     FindPublishedOutput(spec, control.job_id));
    if (published.has_value()) {
      published->seconds = SecondsSince(start);
      return *std::move(published);
    }
  }
  // Refuse a non-empty output before reading anything.
  if (!spec.overwrite) RETURN_IF_ERROR(CheckOutputDirUsable(spec.output));
  ASSIGN_OR_RETURN(PlannedConversion planned, PlanConversion(spec));
  StagingOptions staging_options;
  // A staging folder a killed run left is taken over: the data files it recorded are reused
  // (output_commit.h), everything else in it is deleted below.
  staging_options.resume = true;
  staging_options.overwrite = spec.overwrite;
  ASSIGN_OR_RETURN(StagingDir staging, StagingDir::Create(spec.output, staging_options));
  // Runs before `staging` is destroyed on any early return.
  struct KeepForResume {
    StagingDir& staging;
    const std::atomic<bool>* preserve;
    ~KeepForResume() {
      if (preserve != nullptr && preserve->load()) staging.Keep();
    }
  } keep_for_resume{staging, control.preserve_staging};

  // The output commit on posix (output_commit.h): the staging folder is the area, its records
  // say which data files an earlier run finished, and the rename of Publish is the publish step.
  const OutputArea area(kvstore::GetPosixDriver(), staging.path());
  ASSIGN_OR_RETURN(const std::string request, ConversionRequestJson(spec));
  const std::string plan_id = OutputPlanId(request, planned.plan);
  ASSIGN_OR_RETURN(const ReusableFiles reuse, TakeOverStaging(area, staging, planned, plan_id));
  // The records of the files kept, then of each file as it is finished.
  ASSIGN_OR_RETURN(FileRecordLog records, FileRecordLog::Create(staging.dir(), kFileRecordLogName, reuse.records));
  const double plan_seconds = SecondsSince(start);

  const auto write_start = Clock::now();
  ExecutorOptions options = ExecutorOptionsFor(spec, control);
  // The window and the spans of remote sources share the conversion's memory
  // (ShareConversionMemory).
  options.window_bytes = planned.window_bytes;
  options.remote_span_bytes = planned.remote_span_bytes;
  // Checked again by the executor, size and XXH3-64, before it reuses them: a posix
  // generation cannot see a rewrite in place of the same size within the filesystem's
  // timestamp granularity.
  options.completed_files = reuse.files;
  // The first error recording a finished file; the executor calls on_file_committed
  // serialized.
  absl::Status record_status;
  options.on_file_committed = [&](const WrittenFile& file) {
    if (record_status.ok()) {
      const absl::StatusOr<FileRecord> record = area.CommittedRecord(plan_id, file);
      record_status = record.ok() ? records.Append(*record) : record.status();
    }
    TestFaultPoint("file-recorded", control.cancelled);
    if (control.on_file_committed) control.on_file_committed(file);
  };
  ASSIGN_OR_RETURN(ExecutionResult executed, Execute(planned.plan, staging.dir(), options));
  RETURN_IF_ERROR(record_status);
  // Nothing of the commit's own is published with the output.
  RETURN_IF_ERROR(staging.dir().RemoveTree(kFileRecordsFolder),
                  "removing the records of finished data files before publishing");

  const auto publish_start = Clock::now();
  ConversionResult result;
  result.plan_seconds = plan_seconds;
  result.data_files_seconds = std::chrono::duration<double>(publish_start - write_start).count();
  result.output = staging.output_dir();
  RecordExecution(executed, result);
  result.verification_failures += reuse.mismatches;
  for (const FilePlan& file : planned.plan.files) result.tensors += file.tensors.size();
  RETURN_IF_ERROR(
      WriteCompanionsAndManifest(staging.dir(), spec, planned, control, /*split_id=*/"", result));
  RETURN_IF_ERROR(staging.Publish());
  TestFaultPoint("after-publish");
  if (spec.update_latest) {
    for (const auto& [name, contents] : planned.beside_output) {
      // Not a file of the output: not in the manifest, not counted in bytes_written.
      RETURN_IF_ERROR(WriteFileAtomically(staging.parent(), name, contents),
                      "the output was published; updating the tracker file beside it");
    }
  }
  result.publish_seconds = SecondsSince(publish_start);
  result.seconds = SecondsSince(start);
  return result;
}

absl::StatusOr<std::optional<ConversionResult>> FindPublishedOutput(const ConversionSpec& spec,
                                                                    const std::string& job_id) {
  absl::StatusOr<Directory> out = OpenExistingFolder(spec.output);
  if (!out.ok()) {
    if (absl::IsNotFound(out.status())) return std::nullopt;
    return out.status();
  }
  auto manifest_fd = out->OpenFile(kManifestName, O_RDONLY | O_NONBLOCK);
  if (!manifest_fd.ok()) {
    if (absl::IsNotFound(manifest_fd.status())) return std::nullopt;
    return manifest_fd.status();
  }
  ASSIGN_OR_RETURN(MappedFile manifest_file,
                   MappedFile::Adopt(*manifest_fd, out->PathOf(kManifestName)));
  if (manifest_file.size() > kMaxManifestBytes) return std::nullopt;
  const OrderedJson manifest = OrderedJson::parse(
      reinterpret_cast<const char*>(manifest_file.data()),
      reinterpret_cast<const char*>(manifest_file.data()) + manifest_file.size(), nullptr,
      /*allow_exceptions=*/false);
  // Someone else's output (or not a manifest at all): the caller refuses the folder as usual.
  if (!manifest.is_object() || manifest.value("job_id", "") != job_id ||
      !manifest.contains("request") || manifest["request"] != SpecToManifestRequest(spec) ||
      !manifest.contains("source") || !manifest["source"].is_object() ||
      manifest["source"].value("path", "") != spec.input || !manifest.contains("files") ||
      !manifest["files"].is_array()) {
    return std::nullopt;
  }
  ConversionResult result;
  result.output = spec.output;
  result.found_published = true;
  result.bytes_written = manifest_file.size();
  for (const OrderedJson& file : manifest["files"]) {
    const std::string name = file.value("name", "");
    const uint64_t bytes = file.value("bytes", uint64_t{0});
    uint64_t expected_hash = 0;
    const std::string hex = file.value("xxh3_64", "");
    auto mismatch = [&](absl::string_view what) {
      return absl::DataLossError(
          absl::StrCat(out->PathOf(name), ": this job published the output earlier, but the file ",
                       what, "; it was changed after publishing"));
    };
    if (!CheckRelativeName(name).ok() || !absl::SimpleHexAtoi(hex, &expected_hash)) {
      return mismatch("is not a valid manifest entry");
    }
    auto place = out->OpenParentOf(name);
    auto st = place.ok() ? place->folder.StatChild(place->name) : place.status();
    if (!st.ok() || !S_ISREG(st->st_mode) || static_cast<uint64_t>(st->st_size) != bytes) {
      return mismatch(absl::StrCat("is missing or not ", bytes, " bytes"));
    }
    ASSIGN_OR_RETURN(uint64_t hash, HashFile(kvstore::GetPosixDriver(), out->PathOf(name)));
    if (hash != expected_hash) return mismatch("no longer has its XXH3-64");
    result.files.push_back({name, bytes, hash, 0});
    result.bytes_written += bytes;
  }
  if (manifest.contains("tensors") && manifest["tensors"].is_array()) {
    result.tensors = static_cast<int64_t>(manifest["tensors"].size());
  }
  return result;
}

}  // namespace reshard
