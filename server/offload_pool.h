// A small pool of threads that runs metadata work (Plan and Inspect requests read checkpoint
// headers) so that gRPC threads only wait, and normally at most `threads` such requests do IO
// at once. Thread safe.
//
// A caller waits only until its deadline or cancellation; the task then still runs (or is
// dropped if it has not started) and its result is discarded, so a task must own everything it
// touches. A task that runs longer than `stuck_after` (e.g. blocked in open() on a FIFO) no
// longer counts as serving: while work waits, no thread is idle and fewer than `threads`
// threads serve, the pool adds a thread, up to `max_threads` in all. Added threads stay.

#ifndef RESHARD_SERVER_OFFLOAD_POOL_H_
#define RESHARD_SERVER_OFFLOAD_POOL_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace reshard {

class OffloadPool {
 public:
  struct Options {
    int threads = 2;
    int max_threads = 16;
    absl::Duration stuck_after = absl::Seconds(2);
  };

  explicit OffloadPool(Options options);
  // Joins the threads: every task must return first (reshardd exits without destroying it).
  ~OffloadPool();

  // Runs `work` on a pool thread and waits until it has finished (OK), `deadline` has passed
  // (DeadlineExceeded) or `cancelled` returns true (Cancelled; polled every 50 ms).
  absl::Status Run(std::function<void()> work, absl::Time deadline,
                   const std::function<bool()>& cancelled = nullptr);

  int thread_count();

 private:
  struct Task;

  void Loop(int index);
  // Adds a thread when work waits and too few threads serve.
  void GrowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<Task>> queue_ ABSL_GUARDED_BY(mu_);
  // When each thread's current task started; InfiniteFuture while it waits for work.
  std::vector<absl::Time> busy_since_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace reshard

#endif  // RESHARD_SERVER_OFFLOAD_POOL_H_
