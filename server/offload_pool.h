// A small fixed pool of threads that runs metadata work (Plan and Inspect requests read
// checkpoint headers) so that gRPC threads only wait, and at most `threads` such requests do
// IO at once. Thread safe.

#ifndef RESHARD_SERVER_OFFLOAD_POOL_H_
#define RESHARD_SERVER_OFFLOAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace reshard {

class OffloadPool {
 public:
  explicit OffloadPool(int threads);
  ~OffloadPool();

  // Runs `work` on a pool thread and returns when it has finished.
  void Run(std::function<void()> work);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace reshard

#endif  // RESHARD_SERVER_OFFLOAD_POOL_H_
