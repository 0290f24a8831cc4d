#include "server/offload_pool.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/synchronization/notification.h"

namespace reshard {

struct OffloadPool::Task {
  std::function<void()> work;
  absl::Notification done;
  // The caller stopped waiting; a task not started yet is dropped.
  std::atomic<bool> abandoned{false};
};

OffloadPool::OffloadPool(Options options) : options_(options) {
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < options_.threads; ++i) {
    busy_since_.push_back(absl::InfiniteFuture());
    threads_.emplace_back([this, i] { Loop(i); });
  }
}

OffloadPool::~OffloadPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);  // no thread is added once stopping_
  }
  for (std::thread& thread : threads) thread.join();
}

int OffloadPool::thread_count() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

absl::Status OffloadPool::Run(std::function<void()> work, absl::Time deadline,
                              const std::function<bool()>& cancelled) {
  auto task = std::make_shared<Task>();
  task->work = std::move(work);
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(task);
    GrowLocked();
  }
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (task->done.WaitForNotificationWithTimeout(
            std::max(absl::ZeroDuration(), std::min(left, absl::Milliseconds(50))))) {
      return absl::OkStatus();
    }
    // The deadline first: gRPC also cancels a call whose deadline has passed.
    if (absl::Now() >= deadline) {
      task->abandoned.store(true);
      return absl::DeadlineExceededError(
          "the call's deadline passed before its work finished (the daemon's metadata threads "
          "are busy or the input is slow to read)");
    }
    if (cancelled && cancelled()) {
      task->abandoned.store(true);
      return absl::CancelledError("the call was cancelled while its work was pending");
    }
    // A thread may have got stuck since the task was queued.
    absl::MutexLock lock(&mu_);
    GrowLocked();
  }
}

void OffloadPool::GrowLocked() {
  if (stopping_ || queue_.empty() || static_cast<int>(threads_.size()) >= options_.max_threads) {
    return;
  }
  const absl::Time stuck_since = absl::Now() - options_.stuck_after;
  int serving = 0;  // busy for less than stuck_after
  for (const absl::Time since : busy_since_) {
    if (since == absl::InfiniteFuture()) return;  // an idle thread takes the work
    serving += since > stuck_since ? 1 : 0;
  }
  if (serving >= options_.threads) return;
  const int index = static_cast<int>(threads_.size());
  busy_since_.push_back(absl::InfiniteFuture());
  threads_.emplace_back([this, index] { Loop(index); });
}

void OffloadPool::Loop(int index) {
  while (true) {
    std::shared_ptr<Task> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OffloadPool* p)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      if (task->abandoned.load()) continue;
      busy_since_[index] = absl::Now();
    }
    task->work();
    task->done.Notify();
    absl::MutexLock lock(&mu_);
    busy_since_[index] = absl::InfiniteFuture();
  }
}

}  // namespace reshard
