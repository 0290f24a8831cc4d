#include "lib/io/remote_runs.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {
absl::Status ReadRemoteRuns(absl::Span<const RemoteRun> runs, int in_flight) {
  in_flight = std::max(in_flight, 1);
  // Requests as long as the window allows while it still makes `in_flight` of them: a request
  // costs the store about as much however long it is, but fewer than `in_flight` leave
  // connections idle.
  uint64_t total = 0;
  for (const RemoteRun& run : runs) total += run.length;
  const uint64_t target = std::clamp<uint64_t>(total / static_cast<uint64_t>(in_flight),
                                               MappedFile::kRemotePieceBytes, kMaxRunPieceBytes);
  // Each run in pieces of equal length, their number rounded to the nearest: a run a little
  // longer than `target` is one request, not two.
  struct Piece {
    size_t run = 0;
    uint64_t begin = 0;  // within the run
    uint64_t end = 0;
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < runs.size(); ++r) {
    const uint64_t length = runs[r].length;
    if (length == 0) continue;
    const uint64_t count = std::max<uint64_t>(1, (length + target / 2) / target);
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
      // One request per piece: MappedFile::ReadAt would cut a range of 2 MiB or more again.
      status[p] = run.file->ReadAtInOneRequest(run.offset + piece.begin, piece.end - piece.begin,
                                               run.out + piece.begin);
    }
  };
  const size_t helpers = std::min<size_t>(pieces.size(), in_flight) - 1;
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
