// Reads many byte runs of remote files (MappedFile::remote) with several range requests in
// flight at once.
//
// A gather that takes one run from each of several objects (a ZeRO-3 parameter is one run of
// about 2 MiB in every rank's file) is bound by request latency when its runs are read one or
// two at a time: each range GET waits a round trip, however short. ReadRemoteRuns cuts the
// runs of one window into requests and keeps up to `in_flight` of them going, each into its
// run's final place, so the window costs about one round trip per `in_flight` requests. The
// store retries a failed request itself (S3: the client's retry policy, with backoff).

#ifndef RESHARD_LIB_IO_REMOTE_RUNS_H_
#define RESHARD_LIB_IO_REMOTE_RUNS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "lib/io/mapped_file.h"

namespace reshard {

// Bytes [offset, offset + length) of `file`, read into `out` (length bytes).
struct RemoteRun {
  const MappedFile* file = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::byte* out = nullptr;
};

// A request of ReadRemoteRuns is at most 1.5 times this long.
inline constexpr uint64_t kMaxRunPieceBytes = 4 << 20;

// Reads every run into its `out`, with at most `in_flight` requests at once (on as many
// threads, this one included). Requests are about the runs' total over `in_flight` long, but
// at least MappedFile::kRemotePieceBytes and at most kMaxRunPieceBytes; a run is cut into
// pieces of equal length, as many as its length over that, rounded (a run of 2.1 MiB in a
// window of 8 such runs is one request). A range past the end of its object is DataLoss
// without a request. Runs may be of different files (local ones are read with pread); their
// buffers must not overlap. On failure the first error in run order,
// prefixed with the file, the run's length and byte offset (the store's error names the object
// and the requested range); the other runs' buffers then hold unspecified bytes. Thread safe.
absl::Status ReadRemoteRuns(absl::Span<const RemoteRun> runs,
                            int in_flight = MappedFile::kRemotePiecesInFlight);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_REMOTE_RUNS_H_
