#include "lib/io/remote_runs.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {

absl::Status ReadRemoteRuns(absl::Span<const RemoteRun> runs, int in_flight) {
  // Each run in pieces of at most kRemotePieceBytes, of equal length: one request each
  // (MappedFile::ReadAt reads a range that short with one request).
  struct Piece {
    size_t run = 0;
    uint64_t begin = 0;  // within the run
    uint64_t end = 0;
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < runs.size(); ++r) {
    const uint64_t length = runs[r].length;
    if (length == 0) continue;
    const uint64_t count =
        (length + MappedFile::kRemotePieceBytes - 1) / MappedFile::kRemotePieceBytes;
    const uint64_t piece = (length + count - 1) / count;
    for (uint64_t begin = 0; begin < length; begin += piece) {
      pieces.push_back(Piece{r, begin, std::min(length, begin + piece)});
    }
  }
  if (pieces.empty()) return absl::OkStatus();
  // Workers take the pieces in order, so the requests in flight are the runs' next ones.
  std::vector<absl::Status> status(pieces.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t p = next++; p < pieces.size(); p = next++) {
      const Piece& piece = pieces[p];
      const RemoteRun& run = runs[piece.run];
      status[p] = run.file->ReadAt(run.offset + piece.begin, piece.end - piece.begin,
                                   run.out + piece.begin);
    }
  };
  const size_t helpers = std::min<size_t>(pieces.size(), std::max(in_flight, 1)) - 1;
  std::vector<std::thread> threads;
  threads.reserve(helpers);
  for (size_t t = 0; t < helpers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& thread : threads) thread.join();
  for (size_t p = 0; p < pieces.size(); ++p) {
    const RemoteRun& run = runs[pieces[p].run];
    RETURN_IF_ERROR(status[p], absl::StrCat(run.file->path(), ": reading ", run.length,
                                            " bytes at byte offset ", run.offset));
  }
  return absl::OkStatus();
}

}  // namespace reshard
