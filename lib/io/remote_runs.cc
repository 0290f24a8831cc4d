#include "lib/io/remote_runs.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

// A request: bytes [begin, end) of run `run`.
struct Piece {
  size_t run = 0;
  uint64_t begin = 0;  // within the run
  uint64_t end = 0;
};

// The requests of `runs`, in run order. Requests as long as the runs allow while they still
// make `in_flight` of them: a request costs the store about as much however long it is, but
// fewer than `in_flight` leave connections idle. Each run in pieces of equal length (a multiple
// of `align` but for its last), their number rounded to the nearest: a run a little longer than
// the target is one request, not two. The target is at least `least`. Pieces are at most
// `max_piece` long (at least `align`).
std::vector<Piece> CutRuns(absl::Span<const RemoteRun> runs, int in_flight, uint64_t align,
                           uint64_t max_piece = UINT64_MAX,
                           uint64_t least = MappedFile::kRemotePieceBytes) {
  uint64_t total = 0;
  for (const RemoteRun& run : runs) total += run.length;
  const uint64_t target =
      std::clamp<uint64_t>(total / static_cast<uint64_t>(in_flight), least, kMaxRunPieceBytes);
  std::vector<Piece> pieces;
  for (size_t r = 0; r < runs.size(); ++r) {
    const uint64_t length = runs[r].length;
    if (length == 0) continue;
    const uint64_t count = std::max<uint64_t>(1, (length + target / 2) / target);
    uint64_t piece = (length + count - 1) / count;
    piece = (piece + align - 1) / align * align;
    piece = std::min(piece, std::max(align, max_piece / align * align));
    for (uint64_t begin = 0; begin < length; begin += piece) {
      pieces.push_back(Piece{r, begin, std::min(length, begin + piece)});
    }
  }
  return pieces;
}

// The context of a run's failed request.
std::string RunContext(const RemoteRun& run) {
  return absl::StrCat(run.file->path(), ": reading ", run.length, " bytes at byte offset ",
                      run.offset);
}

}  // namespace

absl::Status ReadRemoteRuns(absl::Span<const RemoteRun> runs, int in_flight) {
  in_flight = std::max(in_flight, 1);
  const std::vector<Piece> pieces = CutRuns(runs, in_flight, 1);
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
    RETURN_IF_ERROR(status[p], RunContext(runs[pieces[p].run]));
  }
  return absl::OkStatus();
}

struct RemoteRunQueue::Batch {
  std::vector<RemoteRun> runs;
  std::string context;
  Done done;
};

RemoteRunQueue::RemoteRunQueue(int in_flight, uint64_t scratch_bytes)
    : in_flight_(std::max(in_flight, 1)), scratch_bytes_(scratch_bytes) {}

RemoteRunQueue::~RemoteRunQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void RemoteRunQueue::Add(absl::Span<const RemoteRun> runs, uint64_t element_size,
                         std::string context, Done done) {
  auto batch = std::make_shared<Batch>();
  batch->runs.assign(runs.begin(), runs.end());
  batch->context = std::move(context);
  batch->done = std::move(done);
  bool into_scratch = false;
  for (const RemoteRun& run : runs) into_scratch = into_scratch || run.out == nullptr;
  const std::vector<Piece> pieces =
      CutRuns(runs, in_flight_, std::max<uint64_t>(element_size, 1),
              into_scratch ? scratch_bytes_ : UINT64_MAX, kQueuedRunPieceBytes);
  if (pieces.empty()) return;
  if (threads_.empty()) {
    for (int t = 0; t < in_flight_; ++t) threads_.emplace_back([this] { Work(); });
  }
  absl::MutexLock lock(&mu_);
  for (const Piece& piece : pieces) {
    Request request{batch, piece.run, piece.begin, piece.end - piece.begin, nullptr};
    if (runs[piece.run].out == nullptr) {
      if (scratch_.empty()) scratch_.resize(scratch_bytes_);
      // Blocks while the requests under way hold the scratch memory it needs.
      struct Room {
        const RemoteRunQueue* queue;
        uint64_t length;
        bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return queue->ScratchPlace(length) != kNoPlace;
        }
      } room{this, request.length};
      mu_.Await(absl::Condition(&room));
      request.scratch = TakeScratch(request.length);
    }
    pending_.emplace_back(queued_++, std::move(request));
  }
}

uint64_t RemoteRunQueue::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

absl::Status RemoteRunQueue::Wait(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  struct Done {
    const RemoteRunQueue* queue;
    uint64_t ticket;
    bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return queue->done_prefix_ >= ticket;
    }
  } done{this, ticket};
  mu_.Await(absl::Condition(&done));
  if (!errors_.empty() && errors_.begin()->first < ticket) return errors_.begin()->second;
  return absl::OkStatus();
}

int RemoteRunQueue::max_under_way() const {
  absl::MutexLock lock(&mu_);
  return max_under_way_;
}

void RemoteRunQueue::Work() {
  while (true) {
    uint64_t seq;
    Request request;
    {
      absl::MutexLock lock(&mu_);
      struct HasWork {
        const RemoteRunQueue* queue;
        bool operator()() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !queue->pending_.empty() || queue->stopping_;
        }
      } has_work{this};
      mu_.Await(absl::Condition(&has_work));
      if (pending_.empty()) return;  // stopping with nothing left
      seq = pending_.front().first;
      request = std::move(pending_.front().second);
      pending_.pop_front();
      max_under_way_ = std::max(max_under_way_, ++under_way_);
    }
    const RemoteRun& run = request.batch->runs[request.run];
    std::byte* into = request.scratch != nullptr ? request.scratch : run.out + request.begin;
    absl::Status status =
        run.file->ReadAtInOneRequest(run.offset + request.begin, request.length, into);
    if (status.ok() && request.batch->done) {
      request.batch->done(request.run, request.begin, request.length, into);
    }
    if (!status.ok()) {
      status = Annotate(status, absl::StrCat(request.batch->context, ": ", RunContext(run)));
    }
    absl::MutexLock lock(&mu_);
    --under_way_;
    if (request.scratch != nullptr) ReturnScratch(request.scratch);
    Finish(seq, std::move(status));
  }
}

void RemoteRunQueue::Finish(uint64_t seq, absl::Status status) {
  if (!status.ok()) errors_.emplace(seq, std::move(status));
  done_after_.insert(seq);
  while (!done_after_.empty() && *done_after_.begin() == done_prefix_) {
    done_after_.erase(done_after_.begin());
    ++done_prefix_;
  }
}

uint64_t RemoteRunQueue::ScratchPlace(uint64_t length) const {
  if (length > scratch_.size()) return kNoPlace;
  if (places_.empty()) return 0;
  const uint64_t tail = places_.front().begin;  // the oldest place still held
  if (scratch_head_ > tail) {
    // Free: [head, end) and [0, tail).
    if (scratch_head_ + length <= scratch_.size()) return scratch_head_;
    return length <= tail ? 0 : kNoPlace;
  }
  // Taken around the end: free [head, tail).
  return scratch_head_ + length <= tail ? scratch_head_ : kNoPlace;
}

std::byte* RemoteRunQueue::TakeScratch(uint64_t length) {
  const uint64_t begin = ScratchPlace(length);
  if (begin == kNoPlace) return nullptr;
  places_.push_back(Place{begin, length, false});
  scratch_head_ = begin + length;
  return scratch_.data() + begin;
}

void RemoteRunQueue::ReturnScratch(const std::byte* place) {
  const uint64_t begin = static_cast<uint64_t>(place - scratch_.data());
  for (Place& held : places_) {
    if (held.begin == begin && !held.returned) {
      held.returned = true;
      break;
    }
  }
  while (!places_.empty() && places_.front().returned) places_.pop_front();
}

}  // namespace reshard
