#include "server/offload_pool.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

// Tasks that block until released, each run from its own caller thread (no deadline).
class Blockers {
 public:
  void Add(OffloadPool& pool, int count) {
    for (int i = 0; i < count; ++i) {
      callers_.emplace_back([this, &pool] {
        pool.Run(
                [this] {
                  started_.fetch_add(1);
                  release_.WaitForNotification();
                },
                absl::InfiniteFuture())
            .IgnoreError();
      });
    }
  }
  bool WaitStarted(int count) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (started_.load() < count && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return started_.load() >= count;
  }
  ~Blockers() {
    if (!release_.HasBeenNotified()) release_.Notify();
    for (std::thread& caller : callers_) caller.join();
  }

 private:
  std::atomic<int> started_{0};
  absl::Notification release_;
  std::vector<std::thread> callers_;
};

TEST(OffloadPoolTest, RunsWorkAndReturnsOk) {
  OffloadPool pool({});
  int value = 0;
  EXPECT_TRUE(pool.Run([&] { value = 42; }, absl::Now() + absl::Seconds(20)).ok());
  EXPECT_EQ(value, 42);
  EXPECT_EQ(pool.thread_count(), 2);
}

// Every thread is stuck: a later task still runs, on a thread added for it.
TEST(OffloadPoolTest, StuckTasksDoNotStarveLaterOnes) {
  OffloadPool pool({/*threads=*/2, /*max_threads=*/4, /*stuck_after=*/absl::Milliseconds(100)});
  Blockers blockers;
  blockers.Add(pool, 2);
  ASSERT_TRUE(blockers.WaitStarted(2));
  bool ran = false;
  const absl::Time start = absl::Now();
  EXPECT_TRUE(pool.Run([&] { ran = true; }, absl::Now() + absl::Seconds(20)).ok());
  EXPECT_TRUE(ran);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(pool.thread_count(), 3);
}

// At max_threads the pool adds no more: the caller gets DEADLINE_EXCEEDED at its deadline,
// and its work, never started, is dropped.
TEST(OffloadPoolTest, DeadlinePassesWhenEveryThreadIsStuck) {
  OffloadPool pool({/*threads=*/1, /*max_threads=*/2, /*stuck_after=*/absl::Milliseconds(50)});
  Blockers blockers;
  blockers.Add(pool, 1);
  ASSERT_TRUE(blockers.WaitStarted(1));
  absl::SleepFor(absl::Milliseconds(100));  // stuck now
  blockers.Add(pool, 1);
  ASSERT_TRUE(blockers.WaitStarted(2));
  EXPECT_EQ(pool.thread_count(), 2);

  auto ran = std::make_shared<std::atomic<bool>>(false);
  const absl::Time start = absl::Now();
  absl::Status status = pool.Run([ran] { ran->store(true); }, absl::Now() + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(took, absl::Milliseconds(950));
  EXPECT_LT(took, absl::Milliseconds(1500));
  EXPECT_EQ(pool.thread_count(), 2);

  // A cancelled caller returns at its next poll.
  status = pool.Run([ran] { ran->store(true); }, absl::InfiniteFuture(), [] { return true; });
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_FALSE(ran->load());
}

// A task the caller stopped waiting for runs to its end on state it owns.
TEST(OffloadPoolTest, LateResultIsDiscarded) {
  OffloadPool pool({/*threads=*/1, /*max_threads=*/1, /*stuck_after=*/absl::Seconds(10)});
  auto release = std::make_shared<absl::Notification>();
  auto result = std::make_shared<int>(0);
  absl::Status status = pool.Run(
      [release, result] {
        release->WaitForNotification();
        *result = 7;
      },
      absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  release->Notify();
  // The pool's only thread is free again once the late task ends.
  EXPECT_TRUE(pool.Run([] {}, absl::Now() + absl::Seconds(20)).ok());
  EXPECT_EQ(*result, 7);
}

}  // namespace
}  // namespace reshard
