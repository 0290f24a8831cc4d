// Resuming an execution: the output files an earlier attempt committed are checked against the
// size and XXH3-64 it recorded, and reused when they still match instead of being written again.

#ifndef RESHARD_LIB_EXEC_RESUME_H_
#define RESHARD_LIB_EXEC_RESUME_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "lib/exec/executor_options.h"
#include "lib/io/directory.h"
#include "lib/io/mapped_file.h"
#include "lib/plan/layout.h"

namespace reshard {

// XXH3-64 of a whole file, read through a mapping released as it goes.
absl::StatusOr<uint64_t> HashFile(const std::string& path);
// The same for the file `name` in `dir` (not following a symlink).
absl::StatusOr<uint64_t> HashFile(const Directory& dir, const std::string& name);

// XXH3-64 of the whole of `file`, its pages released as it goes.
absl::StatusOr<uint64_t> HashMappedFile(const MappedFile& file);

// A file committed by an earlier attempt, when it is intact: planned size, recorded checksum.
// Anything else under the name is removed so the file is written again. Adds the time spent
// checking to `verify_seconds` and sets `mismatch` when a recorded file failed the check.
std::optional<WrittenFile> ReuseCompletedFile(const FilePlan& file, const Directory& dir,
                                              const ExecutorOptions& options,
                                              double& verify_seconds, bool& mismatch);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_RESUME_H_
