// The Executor runs a CopyPlan: it writes every output file front to back through a bounded
// window, filling tensor data from memory-mapped sources with the dtype conversion fused into
// the copy, and commits each file atomically (temporary name, fsync, rename), or streams it
// through an OutputSink (object storage: an upload completed when the file is whole).
//
// Memory stays bounded whatever the model size: each worker owns one window buffer, and the
// source pages a window consumed are released as soon as it is written. Independent output
// files run in parallel on `threads` workers; the parts of a split, whose strips come from the
// same rows, are written in turns by one worker, which reads each row once (WorkUnits).

#ifndef RESHARD_LIB_EXEC_EXECUTOR_H_
#define RESHARD_LIB_EXEC_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/io/byte_writer.h"
#include "lib/io/directory.h"
#include "lib/io/io_mode.h"
#include "lib/io/mapped_file.h"
#include "lib/plan/layout.h"

namespace reshard {

struct Progress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  int64_t tensors_done = 0;
  int64_t tensors_total = 0;
  int files_done = 0;
  int files_total = 0;
};

struct WrittenFile {
  std::string name;
  uint64_t bytes = 0;
  uint64_t xxh3_64 = 0;  // XXH3-64 of the whole file
  int tensors = 0;
};

struct ExecutorOptions {
  // Worker threads; each writes one output file, or one unit of files written in turns
  // (WorkUnits), at a time. Default: 2.
  int threads = 2;
  // Bytes buffered before they are written, shared by the workers that run at once (each of
  // min(threads, files) workers gets window_bytes / that many, at least 4 KiB), so that memory
  // does not grow with the number of output files. Default: 32 MiB.
  uint64_t window_bytes = 32ull << 20;
  // Called after every window and every finished file, from worker threads, serialized.
  std::function<void(const Progress&)> on_progress;
  // When set and true, workers stop before their next window and Execute returns Cancelled.
  const std::atomic<bool>* cancelled = nullptr;
  // Files an earlier attempt already committed in the output folder, with their XXH3-64. A
  // file is reused when it still has the planned size and checksum, else rewritten. Through an
  // OutputSink: the files the sink already holds, checked by the caller, reused as listed.
  std::map<std::string, uint64_t> completed_files;
  // Called after each file is committed (or reused), from worker threads, serialized.
  std::function<void(const WrittenFile&)> on_file_committed;
  // Check the CRC-32s sources record for the ranges data is read from (torch.save storage
  // records), fused into the read pass; Execute fails with DataLoss on a mismatch, after all
  // files are written and before it returns. Costs a CRC-32 of every byte read.
  bool check_source_crc32 = true;
  // Direct I/O for data files where the filesystem takes it, and the page cache left as it
  // was: see lib/io/io_mode.h. Default: kAuto.
  IoMode io = IoMode::kAuto;
};

// Where the workers' time went, in seconds summed over worker threads (so with several
// threads a phase can exceed the wall time of the whole execution).
struct PhaseSeconds {
  // Filling windows of tensors copied unchanged (pread of contiguous rows).
  double read = 0;
  // Filling windows of tensors that are converted or gathered (through the mapping, so the
  // source page faults are included).
  double convert = 0;
  // The writer threads' Append calls (write(2) plus starting writeback).
  double write = 0;
  // Commit of each data file: fsync, rename, fsync of the folder.
  double fsync = 0;
  // Checksumming files an earlier attempt committed, before reusing them (resume only).
  double verify = 0;
  // Completing the sources' CRC-32 checks after the pass (reading what it did not read).
  double crc_check = 0;
};

struct ExecutionResult {
  std::vector<WrittenFile> files;  // in plan order
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  PhaseSeconds phases;
  // Files recorded as committed by an earlier attempt whose size or XXH3-64 no longer matched
  // (they were written again).
  int verification_failures = 0;
  // Files an earlier attempt committed that were reused instead of written, and their bytes
  // (counted in bytes_written too: it is the size of the output).
  int reused_files = 0;
  uint64_t reused_bytes = 0;
  // Source bytes read a second time to complete CRC-32 checks: the parts of checked ranges the
  // pass did not read (see SourceChecksums).
  uint64_t crc_bytes_reread = 0;
  // Data files written with direct I/O to the end, and files written buffered (IoMode::kBuffered,
  // or a filesystem that refused direct I/O).
  int direct_files = 0;
  int buffered_files = 0;
};

// Where Execute writes data files when they do not go to a local folder (object storage):
// each file is streamed front to back into the ByteWriter that Open returns, behind the same
// digest and size check as a local file, and its Close commits it (the object exists only
// then). A writer destroyed unclosed (error, cancellation) must leave nothing under the file's
// name. Open is called from worker threads, concurrently for different files.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  // A writer for data file `name` (a relative path of the plan), `bytes` long.
  virtual absl::StatusOr<std::unique_ptr<ByteWriter>> Open(const std::string& name,
                                                           uint64_t bytes) = 0;
};

// Maps every source of the plan read-only (checking sizes against the Catalog).
absl::StatusOr<std::vector<MappedFile>> MapSources(const std::vector<SourceFile>& sources);

// How the boxes of a plan read one source.
struct SourceReads {
  // No byte is read twice once the boxes read the same way several times count once (the
  // bytes the distinct boxes read add up to no more than the union of their ranges): its
  // pages can be dropped from the page cache as they are read, outside `repeated`.
  bool read_once = true;
  // The byte ranges of the boxes read the same way several times (a tensor replicated into
  // every output part, read once per part), sorted and merged: they are read through the page
  // cache and kept there (MappedFile::set_repeated_ranges), the rest of the file is read
  // directly where the mode allows.
  std::vector<std::pair<uint64_t, uint64_t>> repeated;
};
std::vector<SourceReads> AnalyzeSourceReads(const CopyPlan& plan);

// For each source of `plan`, whether every box read from it is dense (reads all the bytes from
// its first to its last, as a whole tensor does; the strips of a split do not). IoMode::kAuto
// reads dense sources read once with direct I/O.
std::vector<bool> SourcesReadDense(const CopyPlan& plan);

// How the workers take the files of `plan`: units of one file, or of files written in turns
// by one worker (up to 8). Files with the same tensors in the same order, one of which reads
// strips of rows (the parts of a split along a later dimension), that read strips of the same
// source files (directly or through one another), are written in turns, so that the rows their
// strips come from are read once for all of them, as whole rows, directly: a 2 GiB Llama split into
// 4 parts read every such row 4 times through the page cache before. Parts reading different
// sources (2 model-parallel files split into 4) make separate units, whatever replicated
// tensors they all read from one source (norms).
// More than 8 such files go in units as even as can be, each reading the rows through the page
// cache.
struct WorkUnit {
  std::vector<size_t> files;  // indexes into plan.files
  // Written in turns, and these are all the files that read strips of the same rows: the
  // strips are read as whole rows (TensorFiller::set_strips_whole).
  bool whole_rows = false;
};
std::vector<WorkUnit> WorkUnits(const CopyPlan& plan);

// Writes all files of `plan` into folder `dir` (through its handle only). On error or
// cancellation no file is left under a final name by this call's unfinished work (finished
// files stay; the caller's staging folder owns them).
absl::StatusOr<ExecutionResult> Execute(const CopyPlan& plan, const Directory& dir,
                                        const ExecutorOptions& options);

// The same with every data file written through `sink` (object storage). Direct I/O applies to
// the sources only. options.completed_files are files the sink already holds, which the caller
// has checked (an object cannot be hashed again without reading it back: object_store_output
// compares each object's size and ETag with what was recorded when it was written): they are
// not opened, and get the listed XXH3-64; their sources' CRC-32 checks still hold as for a
// folder's reused files. The sink's written files count as buffered in the result;
// PhaseSeconds::fsync is the time Close took (completing an upload).
absl::StatusOr<ExecutionResult> Execute(const CopyPlan& plan, OutputSink& sink,
                                        const ExecutorOptions& options);

// XXH3-64 of a whole file, read through a mapping released as it goes.
absl::StatusOr<uint64_t> HashFile(const std::string& path);
// The same for the file `name` in `dir` (not following a symlink).
absl::StatusOr<uint64_t> HashFile(const Directory& dir, const std::string& name);

// Peak memory the execution of `plan` needs beyond the process's baseline: the window buffers,
// the source pages one window may hold before release, the local copies of strided items of
// remote sources kept in memory (TensorFiller::StagingMemoryBound), the plan itself, and the
// source CRC-32 check's bookkeeping.
uint64_t EstimateExecutionMemory(const CopyPlan& plan, const ExecutorOptions& options);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_EXECUTOR_H_
