#include "server/offload_pool.h"

#include "absl/synchronization/notification.h"

namespace reshard {

OffloadPool::OffloadPool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

OffloadPool::~OffloadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

void OffloadPool::Run(std::function<void()> work) {
  absl::Notification done;
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back([&] {
      work();
      done.Notify();
    });
  }
  done.WaitForNotification();
}

void OffloadPool::Loop() {
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OffloadPool* p)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping and drained
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace reshard
