// The Executor runs a CopyPlan: it writes every output file front to back through a bounded
// window, filling tensor data from memory-mapped sources with the dtype conversion fused into
// the copy, and commits each file atomically (temporary name, fsync, rename), or streams it
// through an OutputSink (object storage: an upload completed when the file is whole).
//
// Memory stays bounded whatever the model size: each worker owns one window buffer, and the
// source pages a window consumed are released as soon as it is written. Independent output
// files run in parallel on `threads` workers; the parts of a split, whose strips come from the
// same rows, are written in turns by one worker, which reads each row once (WorkUnits).
//
// Its parts: executor_options.h (options, results, OutputSink), read_analysis.h (how the plan
// reads its sources, and which files are written in turns), window_pipeline.h and
// file_writer.h (one output file written through the window), resume.h (files an earlier
// attempt committed). This file runs the workers over them.

#ifndef RESHARD_LIB_EXEC_EXECUTOR_H_
#define RESHARD_LIB_EXEC_EXECUTOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/exec/executor_options.h"  // IWYU pragma: export
#include "lib/exec/read_analysis.h"     // IWYU pragma: export
#include "lib/exec/resume.h"            // IWYU pragma: export
#include "lib/io/directory.h"
#include "lib/io/mapped_file.h"
#include "lib/plan/layout.h"

namespace reshard {

// Maps every source of the plan read-only (checking sizes against the Catalog).
absl::StatusOr<std::vector<MappedFile>> MapSources(const std::vector<SourceFile>& sources);

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

// Peak memory the execution of `plan` needs beyond the process's baseline: the window buffers,
// the source pages one window may hold before release, the local copies of strided items of
// remote sources kept in memory (TensorFiller::StagingMemoryBound), the plan itself, and the
// source CRC-32 check's bookkeeping.
uint64_t EstimateExecutionMemory(const CopyPlan& plan, const ExecutorOptions& options);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_EXECUTOR_H_
