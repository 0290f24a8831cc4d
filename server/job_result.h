// The mapping between a conversion's results and the v1::Job record the scheduler keeps: its
// progress, the files it committed (what a resume may keep) and the figures of a finished
// attempt. Pure functions of the proto, without locking or I/O: the scheduler calls them under
// its mutex.

#ifndef RESHARD_SERVER_JOB_RESULT_H_
#define RESHARD_SERVER_JOB_RESULT_H_

#include <cstdint>
#include <string>

#include "lib/engine/conversion.h"
#include "proto/reshard/v1/reshard.pb.h"

namespace reshard {

// Copies the engine's progress into `job.progress`.
void SetJobProgress(const Progress& progress, v1::Job& job);

// `file` as a v1::OutputFile: name, bytes and XXH3-64 as 16 lowercase hex digits.
void SetOutputFile(const WrittenFile& file, v1::OutputFile& out);

// Records the figures of a successful attempt in `job`: bytes read and written, reused files,
// phase timings and the output files; clears the committed files (the output is published),
// and notes when an earlier attempt had published it already.
void SetJobResult(const ConversionResult& result, v1::Job& job);

}  // namespace reshard

#endif  // RESHARD_SERVER_JOB_RESULT_H_
