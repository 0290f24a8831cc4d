// The engine's entry points: inspect, plan, convert and verify checkpoints.
//
// These glue the pipeline together (InputFormat -> Catalog -> layout -> Planner -> Executor ->
// OutputFormat) and are what both `reshardctl` (in-process) and `reshardd` (as jobs) call. A
// conversion stages its output next to the requested folder and publishes it in one rename
// after the manifest is written, so the output folder either holds a complete, verified-by-
// checksum result or does not exist.

#ifndef RESHARD_LIB_ENGINE_CONVERSION_H_
#define RESHARD_LIB_ENGINE_CONVERSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/core/version.h"
#include "lib/engine/output_commit.h"
#include "lib/exec/executor.h"
#include "lib/formats/format.h"
#include "lib/io/directory.h"
#include "lib/io/io_mode.h"
#include "lib/plan/layout.h"
#include "lib/plan/layout_builders.h"
#include "lib/plan/partition_rules.h"

namespace reshard {


// Limits of a ConversionSpec, checked by PlanConversion and by the daemon at submit.
inline constexpr int kMaxConversionThreads = 64;
inline constexpr uint64_t kMinWindowBytes = 4096;
inline constexpr uint64_t kMaxWindowBytes = 4ull << 30;
inline constexpr int kMaxParts = 4096;

// A checkpoint as read: the InputFormat's view plus, when possible, one global Catalog.
struct LoadedInput {
  std::string path;
  InputModel model;
  // The whole model: the single part, or the parts merged with the rules. Empty (no tensors,
  // `merged` false) when the input is several parts and no rules were given.
  Catalog catalog;
  bool merged = false;
  // The partition rules in effect: the caller's, or the format's own (Megatron's) when the
  // caller gave none. Empty when neither exists.
  PartitionRules rules;
};

// Reads `path` with the format that recognizes it. `rules` (may be empty; the format's
// default rules are used then) merge model-parallel parts; when `require_model` is set, parts
// without rules are an error that says rules are needed.
absl::StatusOr<LoadedInput> LoadInput(const std::string& path, PartitionRules rules,
                                      bool require_model, const ReadOptions& options = {});

// Partition rules from inline JSON when given, else from a file when given, else none.
absl::StatusOr<PartitionRules> LoadRules(const std::string& rules_json,
                                         const std::string& rules_file);

struct ConversionSpec {
  enum class Kind { kConsolidate, kReshard };
  Kind kind = Kind::kConsolidate;
  std::string input;
  std::string output;
  DTypePolicy dtype = DTypePolicy::kKeep;
  // Consolidate: largest output file, Hugging Face's rule. Default: 5 GB (decimal).
  uint64_t max_shard_size = 5'000'000'000ull;
  int parts = 0;  // reshard: number of output parts
  // reshard --format megatron: pipeline stages of the output (0: the format's default, 1).
  int pipeline_parts = 0;
  // reshard --format megatron: expert-parallel ranks the experts of a mixture-of-experts model
  // are distributed over (0: the format's default, 1).
  int expert_parts = 0;
  // After publishing, also write the tracker file the output format keeps beside the output
  // folder (DeepSpeed's `latest_universal`), so that training resumes from it.
  bool update_latest = false;
  // A Hugging Face input's other files (config.json with its torch_dtype updated, tokenizer,
  // README, licence; lib/formats/hf/model_files.h) are carried into an output that is still a
  // Hugging Face model; set, they are left out.
  bool no_extra_files = false;
  // A folder whose tokenizer files are carried into the output (replacing the input's own of
  // the same name), whatever the input; empty: none.
  std::string tokenizer;
  // Partition rules, needed to merge or split parts: inline JSON (the daemon's way), or a file.
  std::string rules_json;
  std::string rules_file;
  // Replace a non-empty output folder when publishing. Default: refused.
  bool overwrite = false;
  // Tied weights (one storage under several names): stored once with the other names recorded
  // as aliases (default), or written out in full under every name.
  bool duplicate_tied = false;
  std::string output_format = "safetensors";
  // What to read from a training checkpoint (DeepSpeed tag, optimizer moments).
  ReadOptions read;
  // --format hf: the model family, a config.json to override the args with, the vocabulary.
  HfExportOptions hf;
  int threads = 2;
  uint64_t window_bytes = 32ull << 20;
  // Skip checking the CRC-32s that torch.save archives record for their storage records
  // against the bytes read (see ExecutorOptions::check_source_crc32). Default: checked.
  bool skip_crc_check = false;
  // Direct I/O and the page cache (lib/io/io_mode.h). Default: direct where the filesystem
  // takes it, nothing left in the page cache.
  IoMode io = IoMode::kAuto;
  // One worker of a conversion split into `partition_count` partitions by output file
  // (lib/engine/partitioned_conversion.h): this worker writes partition `partition_index`
  // (0-based). 0: not partitioned.
  int partition_index = 0;
  int partition_count = 0;
};

struct PlannedConversion {
  LoadedInput input;
  const OutputFormat* writer = nullptr;
  TargetLayout layout;
  CopyPlan plan;
  std::vector<std::pair<std::string, std::string>> companion_files;
  // Files the format writes into the output's parent after publishing (with update_latest).
  std::vector<std::pair<std::string, std::string>> beside_output;
  uint64_t memory_bytes = 0;  // what the Executor will need, see EstimateExecutionMemory
  // The executor's window and remote read spans (ExecutorOptions::window_bytes,
  // remote_span_bytes) and each output writer's budget (kvstore::WriteOptions::memory_budget,
  // 0: none), see ShareConversionMemory.
  uint64_t window_bytes = 0;
  uint64_t remote_span_bytes = 0;
  uint64_t writer_budget = 0;
};

// The peak RSS a conversion holds to (kOutputMemoryCap), and what its process holds besides
// the executor's window, its read spans of remote sources and the output's writers
// (kProcessMemory): the resident pages of reshardctl and its libraries, heaps, thread stacks
// and the S3 client's connections, about 24 MiB in a conversion from or into s3://.
// ShareConversionMemory gives the window, the spans and the writers the difference.
// EstimateExecutionMemory counts more than the executor holds (the source pages of a fill, a
// local span twice), but that margin shrinks with the window while the process's own memory
// does not, and the writers' parts are all held: so the process's memory is set aside rather
// than left to the margin.
inline constexpr uint64_t kOutputMemoryCap = 64ull << 20;
inline constexpr uint64_t kProcessMemory = 24ull << 20;

// How a conversion from `plan`'s sources into `driver` shares its memory between the
// executor's window, its spans of remote sources (s3://) and the driver's writers (S3: each
// upload's parts in flight). Used when the sources are remote or the writers hold memory; else
// the window of `spec` is kept. The budget is what the execution of `plan` with the window of
// `spec` needs (EstimateExecutionMemory), at most kOutputMemoryCap - kProcessMemory; the
// writers that are open at once, the window and the spans fit in it together: the window halves
// first (down to 1 MiB), then the spans, shared by the workers (down to 1 MiB and only for
// remote sources: shorter spans cost read throughput), while that gives the writers more (S3:
// more parts in flight, or parts of 8 MiB instead of 5 MiB) or the execution does not fit, and
// each writer gets an equal share of the rest. When even the least window, spans and writers do not fit,
// they are taken. `memory_bytes` is the execution's and the writers' memory together.
struct ConversionMemory {
  uint64_t window_bytes = 0;
  uint64_t remote_span_bytes = 0;
  uint64_t writer_budget = 0;
  uint64_t memory_bytes = 0;
};
ConversionMemory ShareConversionMemory(const ConversionSpec& spec, const CopyPlan& plan,
                                       const kvstore::Driver& driver);

// An upper bound of the memory a conversion of `spec` needs, computed without reading the
// input (the scheduler admits jobs with it): per thread the window, the source pages it may
// hold, and slack for metadata and the plan.
uint64_t MemoryUpperBound(const ConversionSpec& spec);

// Everything up to the copy plan; nothing is written. The dry run of a conversion.
absl::StatusOr<PlannedConversion> PlanConversion(const ConversionSpec& spec);

struct ConversionResult {
  std::string output;
  // Data files, then companion files (index). The manifest is not listed; bytes_written
  // counts it.
  std::vector<WrittenFile> files;
  int64_t tensors = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  double seconds = 0;
  // Phases (wall time): reading metadata and planning; writing data files; index, manifest
  // and publishing.
  double plan_seconds = 0;
  double data_files_seconds = 0;
  double publish_seconds = 0;
  // Inside writing data files, summed over worker threads (see PhaseSeconds): reading,
  // converting, the write calls, fsync, and checksumming reused files on resume.
  PhaseSeconds data_phases;
  // Reused files whose checksum no longer matched on resume (they were rewritten); for an
  // output written in place (s3://, mem://), recorded files whose size or generation no longer
  // matched (written again).
  int verification_failures = 0;
  // Data files an earlier attempt had finished that were kept instead of written again (local
  // resume; an s3:// rerun into an unfinished prefix), and their bytes. bytes_written counts
  // them too: it is the size of the output.
  int reused_files = 0;
  uint64_t reused_bytes = 0;
  // Data files written with direct I/O, and buffered (see ExecutionResult).
  int direct_files = 0;
  int buffered_files = 0;
  // The output had already been published by an earlier attempt of the same job (killed
  // before it could record success); nothing was written, every file was checked.
  bool found_published = false;
  // Partitioned conversions (ConversionSpec::partition_count > 0): this worker's partition;
  // the partitions whose records were in when it finished (its own included); whether this
  // worker published the output. False when another worker (or `reshardctl commit`) will.
  int partition_index = 0;
  int partition_count = 0;
  int partitions_recorded = 0;
  bool published = true;
};

struct RunControl {
  std::function<void(const Progress&)> on_progress;
  const std::atomic<bool>* cancelled = nullptr;
  // Resuming an interrupted attempt of job `job_id` (see job_id). The data files an earlier
  // run finished are reused on every rerun, resuming or not, from the records it left with
  // them (lib/engine/output_commit.h).
  bool resume = false;
  // Called after each data file is committed (and recorded), e.g. for progress reports.
  std::function<void(const WrittenFile&)> on_file_committed;
  // When set and true at the moment the conversion fails or is cancelled, its staging folder is
  // kept for a later resume instead of being removed (the daemon sets it when shutting down).
  const std::atomic<bool>* preserve_staging = nullptr;
  // The daemon's job id. Recorded in the manifest; when resuming, an output folder whose
  // manifest names this job and request, with every file matching its size and XXH3-64, is
  // this job's own published output: it is reported as the result instead of refused as "not
  // empty" (the attempt was killed between publishing and recording success).
  std::string job_id;
};

// Plans and runs a conversion, publishing the output folder only when complete. Outputs on
// storage with folders (posix) only: the others (s3://, mem://) run through RunAnyConversion
// (partitioned_conversion.h), which sends them to RunConversionToObjectStore
// (object_store_output.h).
absl::StatusOr<ConversionResult> RunConversion(const ConversionSpec& spec,
                                               const RunControl& control = {});

// Pieces of RunConversion that partitioned conversions (partitioned_conversion.h) share.
//
// What every run of `spec` must agree on to produce the same output, as a JSON object (text):
// the fields of SpecFields() (spec_codec.h) with a JSON key, of the normalised spec (paths
// absolute, rules inline). Threads, window, I/O mode and the CRC check are left out: they do
// not change the bytes. Errors: the rules file cannot be read or holds no valid rules.
absl::StatusOr<std::string> ConversionRequestJson(const ConversionSpec& spec);
//
// The executor's options for `spec` and `control` (progress, cancellation, commit callback);
// completed_files is the caller's to set.
ExecutorOptions ExecutorOptionsFor(const ConversionSpec& spec, const RunControl& control = {});
// Copies what Execute reports (files, bytes, phases, I/O modes) into `result`.
void RecordExecution(const ExecutionResult& executed, ConversionResult& result);
// Writes one file of the output (name relative to the output, contents): into a folder, or
// as an object under an s3:// prefix.
using PutOutputFile =
    std::function<absl::Status(const std::string& name, absl::string_view contents)>;
// Writes the companion files (index) with `put`, adding them to `result` (size, XXH3-64) and
// to its bytes_written.
absl::Status WriteCompanions(const PlannedConversion& planned, const PutOutputFile& put,
                             ConversionResult& result);
// Writes the companion files (index) and then the manifest, the commit mark, into the output
// folder being assembled (`dir`), adding them to `result` (whose files must hold every data
// file); then stops at the "before-publish" test fault point and returns Cancelled when the
// conversion was cancelled meanwhile.
absl::Status WriteCompanionsAndManifest(const Directory& dir, const ConversionSpec& spec,
                                        const PlannedConversion& planned, const RunControl& control,
                                        const std::string& split_id, ConversionResult& result);

// The manifest written as the last file of every output: tool, version, source, request,
// files with sizes and XXH3-64 checksums, tensors with file, dtype and shape. `split_id`
// (partitioned conversions) identifies the split that assembled the output.
std::string BuildManifest(const ConversionSpec& spec, const PlannedConversion& planned,
                          const std::vector<WrittenFile>& files, const std::string& job_id = "",
                          const std::string& split_id = "");

// The result of an earlier attempt of job `job_id` that published `spec.output` (see
// RunControl::job_id), or nullopt when the folder is absent or not that job's. DataLoss when it
// is that job's output but a file no longer matches the manifest.
absl::StatusOr<std::optional<ConversionResult>> FindPublishedOutput(const ConversionSpec& spec,
                                                                    const std::string& job_id);

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_CONVERSION_H_
