// Reads many byte runs of remote files (MappedFile::remote) with several range requests in
// flight at once.
//
// A gather that takes one run from each of several objects (a ZeRO-3 parameter is one run of
// about 2 MiB in every rank's file) is bound by request latency when its runs are read one or
// two at a time: each range GET waits a round trip, however short. ReadRemoteRuns cuts the
// runs of one window into requests and keeps up to `in_flight` of them going, each into its
// run's final place, so the window costs about one round trip per `in_flight` requests.
// RemoteRunQueue does the same across windows: the next window's requests are queued behind
// the current one's, so the requests in flight do not drain at each window's end. The store
// retries a failed request itself (S3: the client's retry policy, with backoff).

#ifndef RESHARD_LIB_IO_REMOTE_RUNS_H_
#define RESHARD_LIB_IO_REMOTE_RUNS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
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
// A request of a RemoteRunQueue is about this long at least (a shorter run is one request):
// its requests stay in flight from batch to batch, so a batch's need not be as many as the
// requests in flight, and fewer, longer requests cost the store less.
inline constexpr uint64_t kQueuedRunPieceBytes = 2 << 20;

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

// Keeps the range requests of remote runs in flight across calls: Add queues a batch of runs
// and returns at once, up to `in_flight` threads take the requests in the order they were
// queued, and Wait waits for the requests queued before a ticket. A conversion that reads
// window after window (a ZeRO-3 gather written through a WindowPipeline) queues the next
// window's runs while the current one's last requests are still under way, so the requests in
// flight do not drain at each window's end and each window does not pay a round trip of its
// own; the window's writer waits for its requests (Wait) before it writes the window.
//
// A run with `out` null is read into the queue's scratch memory (`scratch_bytes`, allocated at
// the first such run; Add blocks while the requests under way fill it) and handed to the
// batch's callback from there, e.g. to convert it into its place. Thread safe; the destructor
// waits for every queued request.
class RemoteRunQueue {
 public:
  // Called on a request's thread once the bytes of request [begin, begin + length) of run
  // `run` (an index into the batch's runs) are read, `data` pointing at them (in the run's
  // `out`, or in scratch memory, valid during the call).
  using Done =
      std::function<void(size_t run, uint64_t begin, uint64_t length, const std::byte* data)>;

  explicit RemoteRunQueue(int in_flight = MappedFile::kRemotePiecesInFlight,
                          uint64_t scratch_bytes = 0);
  ~RemoteRunQueue();
  RemoteRunQueue(const RemoteRunQueue&) = delete;
  RemoteRunQueue& operator=(const RemoteRunQueue&) = delete;

  // Queues the requests of `runs`, cut as ReadRemoteRuns cuts them but about
  // kQueuedRunPieceBytes long at least, at multiples of `element_size` bytes from each run's
  // start. `context` prefixes a failed request's error
  // (e.g. the tensor), `done` (may be empty) is called for each request read. The requests of
  // a batch with runs read into scratch memory are at most `scratch_bytes` long (at least
  // `element_size`, which must then not exceed it). Call from one thread at a time.
  void Add(absl::Span<const RemoteRun> runs, uint64_t element_size, std::string context,
           Done done);

  // Requests queued so far: Wait(queued()) waits for all of them.
  uint64_t queued() const;
  // Waits until the first `ticket` requests queued are done. The error of the first of them
  // that failed, in queue order (context, then the file, the run's length and byte offset, then
  // the store's error naming the object and range), else OK.
  absl::Status Wait(uint64_t ticket);

  // The most requests under way at once so far (for tests).
  int max_under_way() const;

 private:
  struct Batch;
  struct Request {
    std::shared_ptr<const Batch> batch;
    size_t run = 0;
    uint64_t begin = 0;  // within the run
    uint64_t length = 0;
    std::byte* scratch = nullptr;  // where a run without `out` is read
  };

  void Work();
  // A place of `length` bytes in scratch memory, taken in order around it; null while there is
  // no room.
  std::byte* TakeScratch(uint64_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where TakeScratch would take `length` bytes, kNoPlace when there is no room.
  static constexpr uint64_t kNoPlace = UINT64_MAX;
  uint64_t ScratchPlace(uint64_t length) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnScratch(const std::byte* place) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(uint64_t seq, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int in_flight_;
  const uint64_t scratch_bytes_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<uint64_t, Request>> pending_ ABSL_GUARDED_BY(mu_);  // by seq, in order
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_prefix_ ABSL_GUARDED_BY(mu_) = 0;  // requests [0, done_prefix_) are done
  std::set<uint64_t> done_after_ ABSL_GUARDED_BY(mu_);  // done requests past done_prefix_
  std::map<uint64_t, absl::Status> errors_ ABSL_GUARDED_BY(mu_);  // by seq
  int under_way_ ABSL_GUARDED_BY(mu_) = 0;
  int max_under_way_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Scratch memory, used as a ring: places are taken after the last one taken (or from its
  // start) and returned in any order; the oldest place still held bounds the next.
  std::vector<std::byte> scratch_ ABSL_GUARDED_BY(mu_);
  struct Place {
    uint64_t begin = 0;
    uint64_t length = 0;
    bool returned = false;
  };
  std::deque<Place> places_ ABSL_GUARDED_BY(mu_);  // in the order taken
  uint64_t scratch_head_ ABSL_GUARDED_BY(mu_) = 0;  // the end of the place taken last
  std::vector<std::thread> threads_;                // started at the first Add
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_REMOTE_RUNS_H_
