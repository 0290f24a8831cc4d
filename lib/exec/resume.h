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
#include "lib/io/kvstore/driver.h"
#include "lib/plan/layout.h"

namespace reshard {

// XXH3-64 of the whole of file `path` of `driver`, read front to back through the driver's
// ReadRange (DriverFileSource) a few MiB at a time: the one way reshard hashes a file it wrote
// earlier, on posix, S3 and memory alike. Errors name the path.
absl::StatusOr<uint64_t> HashFile(const kvstore::Driver& driver, const std::string& path);
// The same for `path` of the driver its scheme names (kvstore::ParseLocation).
absl::StatusOr<uint64_t> HashFile(const std::string& path);

// A file committed by an earlier attempt, when it is intact: planned size, recorded checksum.
// Anything else under the name is removed so the file is written again. Adds the time spent
// checking to `verify_seconds` and sets `mismatch` when a recorded file failed the check.
std::optional<WrittenFile> ReuseCompletedFile(const FilePlan& file, const Directory& dir,
                                              const ExecutorOptions& options,
                                              double& verify_seconds, bool& mismatch);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_RESUME_H_
