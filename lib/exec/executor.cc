#include "lib/exec/executor.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/exec/file_writer.h"
#include "lib/exec/progress_tracker.h"
#include "lib/exec/span_reader.h"
#include "lib/exec/tensor_filler.h"
#include "lib/exec/window_pipeline.h"
#include "lib/io/crc32_source.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

// A worker's spans (SpanReader: two buffers of this): 4 MiB shared by the active workers when
// sources are read with direct I/O (kDirect; kAuto for dense sources, see SourcesReadDense), as
// the window is, so that two workers stay within the memory of one; 1 MiB for the short rows of
// buffered reads. SpanBytes(io) is the most a mode may use (for the memory estimate).
constexpr uint64_t kDirectSpanBytes = 4 << 20;
constexpr uint64_t kBufferedSpanBytes = 1 << 20;
// Remote sources (s3://) are read in larger spans (ExecutorOptions::remote_span_bytes shared
// by the active workers), at least kRemoteMinSpanBytes, one range request's least piece
// (MappedFile::ReadRemote): a request costs a round trip however short it is, and each span is
// fetched as several range requests at once, not cut at every tensor's end (SpanReader).
constexpr uint64_t kRemoteMinSpanBytes = 1 << 20;
uint64_t SpanBytes(IoMode io) {
  return io == IoMode::kBuffered ? kBufferedSpanBytes : kDirectSpanBytes;
}
// A worker's span when it reads remote sources and `workers` run at once.
uint64_t RemoteSpanBytes(const ExecutorOptions& options, uint64_t workers) {
  return std::max(kRemoteMinSpanBytes, options.remote_span_bytes / workers);
}

// The workers that run at once for a plan of `files` files.
uint64_t ActiveWorkers(const ExecutorOptions& options, size_t files) {
  return std::max<uint64_t>(1, std::min<uint64_t>(std::max(options.threads, 1), files));
}

// Each worker's share of the window (ExecutorOptions::window_bytes).
uint64_t WorkerWindow(const ExecutorOptions& options, size_t files) {
  return std::max<uint64_t>(options.window_bytes / ActiveWorkers(options, files), 4096);
}

}  // namespace

absl::StatusOr<std::vector<MappedFile>> MapSources(const std::vector<SourceFile>& sources) {
  std::vector<MappedFile> mapped;
  mapped.reserve(sources.size());
  for (const SourceFile& source : sources) {
    ASSIGN_OR_RETURN(MappedFile file,
                     MappedFile::Open(source.path, static_cast<int64_t>(source.size),
                                      source.version));
    mapped.push_back(std::move(file));
  }
  return mapped;
}

namespace {

// What a CRC-32 mismatch of `range` of source `file` means for the output: the first tensor
// read from it (": the data of tensor "w", read from it, is corrupt").
std::string ReaderOfRange(const CopyPlan& plan, int file, const ChecksummedRange& range) {
  for (const FilePlan& output : plan.files) {
    for (const TensorCopy& copy : output.tensors) {
      const size_t element = DTypeSize(copy.src_dtype);
      for (const CopyItem& item : copy.items) {
        if (item.src_file != file || item.num_elements() == 0) continue;
        if (item.src_offset < range.offset + range.length &&
            item.src_end(element) > range.offset) {
          return absl::StrCat(": the data of tensor \"", copy.name, "\", read from it, is corrupt");
        }
      }
    }
  }
  return ": the data read from it is corrupt";
}

// Execute into a local folder (`dir`) or through a sink (`sink`): exactly one is set.
absl::StatusOr<ExecutionResult> ExecuteInto(const CopyPlan& plan, const Directory* dir,
                                            OutputSink* sink, const ExecutorOptions& options) {
  ASSIGN_OR_RETURN(std::vector<MappedFile> sources, MapSources(plan.sources));
  if (options.io != IoMode::kBuffered) {
    const std::vector<SourceReads> reads = AnalyzeSourceReads(plan);
    const std::vector<bool> dense = SourcesReadDense(plan);
    for (size_t s = 0; s < sources.size(); ++s) {
      sources[s].set_drop_behind(reads[s].read_once);
      sources[s].set_repeated_ranges(reads[s].repeated);
      // kDirect: contiguous runs are read past the page cache too (strided and gathered
      // elements still come through the mapping, dropped behind). kAuto does the same for
      // sources read once in whole boxes (a consolidation of whole tensors), where the filesystem
      // takes it: buffered reads that jump from tensor to tensor restart the kernel's readahead
      // at small page-cache folios, and cost 1.27x the wall time and 1.6x the CPU of direct
      // reads into huge-page spans (2 GiB torch.save input). Strided sources (the strips of a
      // split or a TP merge) stay buffered: read directly they cost 1.30x the wall time.
      // A source read once but not all in whole boxes (a split: tensors cut by rows and by
      // columns) has its dense boxes read directly and its strips buffered; so has one whose
      // boxes read some ranges several times (tensors replicated into every part: those
      // ranges stay in the page cache for the parts that read them after the first). Read all
      // buffered, such a source would copy every byte through the page cache (a split with
      // Llama rules, whose norms are replicated into every part, is one).
      if (options.io == IoMode::kAuto && reads[s].read_once) {
        sources[s].EnableDirectReads();  // buffered where the filesystem refuses
        sources[s].set_direct_reads_dense_only(!dense[s] || !reads[s].repeated.empty());
      } else if (options.io == IoMode::kDirect && !sources[s].EnableDirectReads()) {
        return absl::FailedPreconditionError(absl::StrCat("--io direct: the filesystem of ",
                                                          sources[s].path(),
                                                          " refuses direct I/O; use --io auto"));
      }
    }
  }
  ProgressTracker progress(plan, options.on_progress);
  // The CRC-32 check of the sources' records: a read stage of each source that records any,
  // which sees every byte the pass reads from it.
  Crc32Source::FragmentBudget crc_fragments{0};
  std::vector<std::unique_ptr<Crc32Source>> crc32s(sources.size());
  bool any_crc32 = false;
  for (size_t s = 0; s < sources.size(); ++s) {
    if (!options.check_source_crc32 || plan.sources[s].checksummed.empty()) continue;
    crc32s[s] = std::make_unique<Crc32Source>(plan.sources[s].checksummed, &crc_fragments);
    sources[s].set_read_stage(crc32s[s].get());
    any_crc32 = true;
  }
  // Every file gets its result from exactly one worker (written, reused or stopped).
  std::vector<std::optional<absl::StatusOr<WrittenFile>>> results(plan.files.size());
  std::vector<uint64_t> bytes_read(plan.files.size(), 0);
  std::vector<PhaseSeconds> phases(plan.files.size());
  std::vector<char> mismatched(plan.files.size(), 0);
  std::vector<char> direct(plan.files.size(), 0);
  std::vector<char> was_reused(plan.files.size(), 0);
  const bool any_direct_reads = std::any_of(sources.begin(), sources.end(),
                                            [](const MappedFile& s) { return s.direct_reads(); });
  const bool any_remote =
      std::any_of(sources.begin(), sources.end(), [](const MappedFile& s) { return !s.mapped(); });
  // One file, or files written in turns (WriteInLockstep); the workers take them in order.
  const std::vector<WorkUnit> units = WorkUnits(plan);
  const uint64_t active_workers = ActiveWorkers(options, units.size());
  // Spans are sized as if every file had its worker: files written in turns use three span
  // buffers (SpanReader::set_files_in_turns), so one worker then holds no more than two did.
  const uint64_t span_workers = ActiveWorkers(options, plan.files.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    // Per file written at once; mapped at the first file this worker writes.
    std::vector<WindowPipeline::Buffers> buffers(1);
    // Direct reads and short rows go through it; its pages are touched only when there are any.
    SpanReader spans(any_remote ? RemoteSpanBytes(options, active_workers)
                     : any_direct_reads
                         ? std::max(kBufferedSpanBytes, kDirectSpanBytes / span_workers)
                         : kBufferedSpanBytes);
    for (size_t u = next++; u < units.size(); u = next++) {
      std::vector<size_t> to_write;
      for (size_t f : units[u].files) {
        if (failed.load()) {
          results[f] = absl::CancelledError("stopped after another file failed");
          continue;
        }
        const FilePlan& file = plan.files[f];
        bool mismatch = false;
        std::optional<WrittenFile> reused;
        if (dir != nullptr) {
          reused = ReuseCompletedFile(file, *dir, options, phases[f].verify, mismatch);
        } else if (auto recorded = options.completed_files.find(file.name);
                   recorded != options.completed_files.end()) {
          // The sink holds it already, checked by the caller (see Execute).
          reused = WrittenFile{file.name, file.bytes, recorded->second,
                               static_cast<int>(file.tensors.size())};
        }
        mismatched[f] = mismatch;
        was_reused[f] = reused.has_value();
        if (!reused.has_value()) {
          to_write.push_back(f);
          continue;
        }
        progress.Add(file.bytes, file.tensors.size(), 1);
        results[f] = *std::move(reused);
        progress.Committed(options.on_file_committed, **results[f]);
        // Its sources were not read in this pass, but their checks still have to hold (the
        // earlier attempt may have failed on one): Verify reads the ranges it reads from.
        for (const TensorCopy& copy : file.tensors) {
          for (const CopyItem& item : copy.items) {
            Crc32Source* const crc32 = crc32s[item.src_file].get();
            if (crc32 != nullptr) crc32->MarkRead(item.src_offset, 1);
          }
        }
      }
      if (to_write.empty()) continue;
      // The worker's window, shared by the files it writes at once.
      if (buffers.size() < to_write.size()) buffers.resize(to_write.size());
      const uint64_t window = WorkerWindow(options, units.size()) / to_write.size();
      std::vector<std::unique_ptr<FileWriter>> writers;
      for (size_t i = 0; i < to_write.size(); ++i) {
        writers.push_back(std::make_unique<FileWriter>(plan.files[to_write[i]], window, sources,
                                                       options, progress, buffers[i],
                                                       spans));
      }
      auto record = [&](size_t i) {
        const size_t f = to_write[i];
        bytes_read[f] = writers[i]->bytes_read();
        direct[f] = writers[i]->direct();
        const double verify = phases[f].verify;
        phases[f] = writers[i]->phases();
        phases[f].verify = verify;
        if (results[f]->ok()) {
          progress.Committed(options.on_file_committed, **results[f]);
        } else {
          failed.store(true);
        }
      };
      if (writers.size() == 1) {
        results[to_write[0]] = dir != nullptr ? writers[0]->Run(*dir) : writers[0]->Run(*sink);
        record(0);
        continue;
      }
      // Files written in turns: started together, advanced in rounds, finished together.
      // Whatever fails first fails the unit; the others stop unfinished (no final name).
      absl::Status unit_status;
      size_t failing = 0;
      for (size_t i = 0; i < writers.size() && unit_status.ok(); ++i) {
        unit_status = dir != nullptr ? writers[i]->Start(*dir) : writers[i]->Start(*sink);
        failing = i;
      }
      if (unit_status.ok()) {
        spans.set_files_in_turns(true);
        std::tie(failing, unit_status) =
            WriteInLockstep(writers, spans.capacity() / 2, units[u].whole_rows);
        spans.set_files_in_turns(false);
      }
      for (size_t i = 0; i < writers.size(); ++i) {
        const size_t f = to_write[i];
        if (unit_status.ok()) {
          results[f] = writers[i]->Finish();
        } else {
          results[f] = i == failing ? unit_status
                                    : absl::CancelledError("stopped after another file failed");
        }
        record(i);
      }
    }
  };
  const int threads = std::max(1, std::min<int>(options.threads, static_cast<int>(units.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();

  ExecutionResult result;
  absl::Status first_error;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    result.phases.read += phases[f].read;
    result.phases.convert += phases[f].convert;
    result.phases.write += phases[f].write;
    result.phases.fsync += phases[f].fsync;
    result.phases.verify += phases[f].verify;
    result.verification_failures += mismatched[f];
    absl::StatusOr<WrittenFile>& file_result = *results[f];
    if (!file_result.ok()) {
      // Report the root cause, not a sibling stopped because of it.
      if (first_error.ok() ||
          (absl::IsCancelled(first_error) && !absl::IsCancelled(file_result.status()))) {
        first_error = Annotate(file_result.status(), plan.files[f].name);
      }
      continue;
    }
    result.bytes_written += file_result->bytes;
    if (was_reused[f]) {
      ++result.reused_files;
      result.reused_bytes += file_result->bytes;
    } else {
      ++(direct[f] ? result.direct_files : result.buffered_files);
    }
    result.bytes_read += bytes_read[f];
    result.files.push_back(*std::move(file_result));
  }
  if (!first_error.ok()) return first_error;
  if (any_crc32) {
    const Clock::time_point start = Clock::now();
    for (size_t s = 0; s < sources.size(); ++s) {
      if (crc32s[s] == nullptr) continue;
      sources[s].set_read_stage(nullptr);  // Verify's own reads are not the pass's
      RETURN_IF_ERROR(crc32s[s]->Verify(sources[s], [&plan, s](const ChecksummedRange& range) {
        return ReaderOfRange(plan, static_cast<int>(s), range);
      }));
      result.crc_bytes_reread += crc32s[s]->bytes_reread();
    }
    result.phases.crc_check = SecondsSince(start);
  }
  if (options.io != IoMode::kBuffered) {
    // What the pass could not drop behind it (sources read more than once, pages shared by
    // strips of rows that went to different files, the CRC check's reads) goes now: the
    // conversion leaves no input in the page cache.
    for (MappedFile& source : sources) {
      source.set_repeated_ranges({});
      source.set_drop_behind(true);
      source.DropCached(0, source.size());
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<ExecutionResult> Execute(const CopyPlan& plan, const Directory& dir,
                                        const ExecutorOptions& options) {
  return ExecuteInto(plan, &dir, nullptr, options);
}

absl::StatusOr<ExecutionResult> Execute(const CopyPlan& plan, OutputSink& sink,
                                        const ExecutorOptions& options) {
  return ExecuteInto(plan, nullptr, &sink, options);
}

uint64_t EstimateExecutionMemory(const CopyPlan& plan, const ExecutorOptions& options) {
  const std::vector<WorkUnit> units = WorkUnits(plan);
  const uint64_t threads = ActiveWorkers(options, units.size());
  size_t files_at_once = 1;  // by one worker
  for (const WorkUnit& unit : units) files_at_once = std::max(files_at_once, unit.files.size());
  uint64_t largest_file = 0;
  uint64_t plan_bytes = sizeof(CopyPlan);
  bool means = false;
  // The local copies of strided items of remote sources one tensor's fillers hold at most.
  uint64_t staging = 0;
  // Whether a tensor reads through the workers' spans: all but those gathered from remote runs.
  bool spans_read = false;
  const auto is_remote = [&plan](int file) {
    return file >= 0 && static_cast<size_t>(file) < plan.sources.size() &&
           InputReadsAreRequests(plan.sources[file].path);
  };
  auto add_copy = [&](const TensorCopy& copy) {
    plan_bytes += sizeof(TensorCopy) + copy.name.size();
    for (const CopyItem& item : copy.items) {
      plan_bytes += sizeof(CopyItem) + item.extent.size() * 3 * sizeof(int64_t);
    }
  };
  for (const FilePlan& file : plan.files) {
    largest_file = std::max(largest_file, file.bytes);
    for (const TensorCopy& copy : file.tensors) {
      add_copy(copy);
      for (const TensorCopy& term : copy.mean_terms) add_copy(term);
      means = means || !copy.mean_terms.empty();
      staging = std::max(staging, TensorFiller::StagingMemoryBound(copy, plan.sources));
      // A FileWriter queues the requests of tensors without mean terms (FillTensor).
      spans_read = spans_read || !TensorFiller::GathersRemoteRuns(copy, is_remote,
                                                                  copy.mean_terms.empty());
      for (const TensorCopy& term : copy.mean_terms) {
        spans_read = spans_read || !TensorFiller::GathersRemoteRuns(term, is_remote);
      }
    }
  }
  // Each worker holds its window, the stage of a direct-I/O file, and the source pages one fill
  // consumed until they are released: FileWriter::kMappedBytesPerFill, plus partly used pages at
  // both ends of every row run, bounded here by one more window. Remote sources map nothing:
  // their bytes are in the worker's spans (two buffers, three for files written in turns), which
  // only tensors that are not gathered from remote runs read (TensorFiller::GathersRemoteRuns).
  const uint64_t window = std::min(WorkerWindow(options, units.size()), largest_file);
  const uint64_t checksums =
      options.check_source_crc32 ? Crc32Source::MemoryBound(plan.sources) : 0;
  // A mean's other terms are read through a scratch buffer of up to half a window.
  const uint64_t mean_scratch = means ? window / 2 : 0;
  // A direct-I/O file's stage, for each file a worker writes at once.
  const uint64_t stage =
      options.io == IoMode::kBuffered ? 0 : files_at_once * std::min<uint64_t>(1 << 20, window);
  const bool remote = std::any_of(plan.sources.begin(), plan.sources.end(),
                                  [](const SourceFile& s) { return InputReadsAreRequests(s.path); });
  const bool all_remote =
      !plan.sources.empty() &&
      std::all_of(plan.sources.begin(), plan.sources.end(),
                  [](const SourceFile& s) { return InputReadsAreRequests(s.path); });
  uint64_t mapped = std::min<uint64_t>(FileWriter::kMappedBytesPerFill, 2 * window);
  uint64_t window_and_pages = 2 * window;
  uint64_t span =
      2 * std::min<uint64_t>(remote ? RemoteSpanBytes(options, threads) : SpanBytes(options.io),
                             plan.source_bytes_read);
  if (all_remote) {
    mapped = 0;
    window_and_pages = window;
    const int buffers = files_at_once > 1 ? 3 : 2;
    span = spans_read ? buffers * std::min<uint64_t>(RemoteSpanBytes(options, threads),
                                                     plan.source_bytes_read)
                      : 0;
  }
  // Each file a worker writes at once has its tensor's fillers.
  return threads * (window_and_pages + mapped + stage + span + mean_scratch +
                    files_at_once * staging) +
         plan_bytes + checksums;
}
}  // namespace reshard
