// The options and results of an execution (lib/exec/executor.h), and the OutputSink it writes
// through: shared by the executor and the parts it is made of (file_writer.h, resume.h).

#ifndef RESHARD_LIB_EXEC_EXECUTOR_OPTIONS_H_
#define RESHARD_LIB_EXEC_EXECUTOR_OPTIONS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/io/byte_writer.h"
#include "lib/io/io_mode.h"

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
  // Bytes of the spans remote sources (s3://) are read in, shared by the workers that run at
  // once like the window: each worker reads spans of remote_span_bytes / workers (at least
  // 1 MiB) and holds two of them (three for files written in turns). A conversion sizes it
  // with the window from one memory budget (ShareConversionMemory, lib/engine/conversion.h).
  // Default: 16 MiB.
  uint64_t remote_span_bytes = 16ull << 20;
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
  // pass did not read (see lib/io/crc32_source.h).
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

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_EXECUTOR_OPTIONS_H_
