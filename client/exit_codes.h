// reshardctl's exit codes, documented in the README. Scripts and workflow engines branch on
// them, so they never change meaning.

#ifndef RESHARD_CLIENT_EXIT_CODES_H_
#define RESHARD_CLIENT_EXIT_CODES_H_

#include "absl/status/status.h"

namespace reshard {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,           // a bug or an unexpected system failure
  kExitUsage = 2,              // bad command line
  kExitInvalidInput = 3,       // corrupt or inconsistent input, bad request, output not empty
  kExitVerifyFailed = 4,       // verify found a difference
  kExitCancelled = 5,          // SIGINT/SIGTERM or a cancel request
  kExitResourceExhausted = 6,  // out of disk, memory budget, queue full
  kExitUnavailable = 7,        // the daemon could not be reached (retryable)
};

// The exit code for a failed status.
ExitCode ExitCodeForStatus(const absl::Status& status);

}  // namespace reshard

#endif  // RESHARD_CLIENT_EXIT_CODES_H_
