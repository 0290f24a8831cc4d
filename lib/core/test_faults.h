// Test-only fault injection points, for crash and race tests of the daemon and the CLI.
//
// Off unless the environment variable RESHARD_TEST_FAULTS is set, which production never
// does (docs/cli.md, "Testing hooks"). Its value is a comma-separated list of POINT=ACTION:
//
//   kill        SIGKILL this process when it reaches POINT
//   wait:PATH   block at POINT until the file PATH exists (at most 120 s) or the caller's
//               `interrupted` flag is set, so a test can change the filesystem at a known
//               moment, or hold a job running until it cancels it
//   block:PATH  like wait:PATH but deaf to `interrupted`: a worker stuck where cancelling
//               cannot reach it (as in a hung system call)
//
// Points: "file-recorded" (a data file and its record committed in the staging folder),
// "before-publish" (output complete in the staging folder, not yet renamed) and
// "after-publish" (output renamed into place, the caller not yet told); for partitioned
// conversions "partition-file-committed", "partition-recorded" and "partition-before-claim"
// (every record seen, publishing not yet claimed); for outputs written in place (s3://, mem://)
// "object-upload-started" (a data file's write started after another data file was
// committed), and "before-publish" / "after-publish" around the write of the manifest.

#ifndef RESHARD_LIB_CORE_TEST_FAULTS_H_
#define RESHARD_LIB_CORE_TEST_FAULTS_H_

#include <atomic>

#include "absl/strings/string_view.h"

namespace reshard {

inline constexpr char kTestFaultsVariable[] = "RESHARD_TEST_FAULTS";

// Carries out the action configured for `point`, if any. Cheap when none is configured.
// `interrupted`, when given, ends a wait early once it is true.
void TestFaultPoint(absl::string_view point, const std::atomic<bool>* interrupted = nullptr);

}  // namespace reshard

#endif  // RESHARD_LIB_CORE_TEST_FAULTS_H_
