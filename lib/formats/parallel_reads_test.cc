#include "lib/formats/parallel_reads.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/formats/torch/pickle.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(20);

// The first read on the calling thread, the rest on workers.
ParallelReadOptions Threaded() {
  ParallelReadOptions options;
  options.threads_after = absl::ZeroDuration();
  options.slow_reads_in_a_row = 1;
  return options;
}

// What the reads of a test did, seen from inside them.
struct Observed {
  absl::Mutex mu;
  int running ABSL_GUARDED_BY(mu) = 0;
  int max_running ABSL_GUARDED_BY(mu) = 0;
  int held ABSL_GUARDED_BY(mu) = 0;  // read and not yet taken
  int max_running_or_held ABSL_GUARDED_BY(mu) = 0;
  std::vector<int> started ABSL_GUARDED_BY(mu);
  std::vector<int> finished ABSL_GUARDED_BY(mu);

  void Start(int i) {
    absl::MutexLock lock(&mu);
    ++running;
    started.push_back(i);
    max_running = std::max(max_running, running);
    max_running_or_held = std::max(max_running_or_held, running + held);
  }
  void Finish(int i) {
    absl::MutexLock lock(&mu);
    --running;
    ++held;
    finished.push_back(i);
  }
  void Taken() {
    absl::MutexLock lock(&mu);
    --held;
  }
  // Waits until `done` holds (true) or the deadline passes (false).
  bool WaitFor(const std::function<bool()>& done) {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&done), kDeadline);
  }
};

TEST(ParallelReadsTest, ReadsFinishingInReverseAreTakenInOrder) {
  Observed seen;
  std::vector<int> taken;
  ParallelReadOptions options = Threaded();
  options.max_in_flight = 4;
  // Read 0 runs on the calling thread, then reads 1..4 run together on workers (4 waits for the
  // others to start), each finishing only after the next one: 4, 3, 2, 1.
  const absl::Status status = ReadInOrder<std::string>(
      10, options,
      [&](int i) -> absl::StatusOr<std::string> {
        seen.Start(i);
        if (i >= 1 && i < 4 && !seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return std::count(seen.finished.begin(), seen.finished.end(), i + 1) > 0;
            })) {
          return absl::DeadlineExceededError(absl::StrCat("read ", i + 1, " never finished"));
        }
        if (i == 4 && !seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return seen.running == 4;
            })) {
          return absl::DeadlineExceededError("reads 1..3 never started");
        }
        seen.Finish(i);
        return absl::StrCat("file ", i);
      },
      [](const std::string& result) { return uint64_t{1}; },
      [&](int i, std::string result) {
        EXPECT_EQ(result, absl::StrCat("file ", i));
        seen.Taken();
        taken.push_back(i);
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(taken, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  absl::MutexLock lock(&seen.mu);
  std::vector<int> first_five;
  for (int i : seen.finished) {
    if (i < 5) first_five.push_back(i);
  }
  EXPECT_EQ(first_five, (std::vector<int>{0, 4, 3, 2, 1}));
  EXPECT_EQ(seen.max_running, 4);
}

TEST(ParallelReadsTest, BytesAheadBounded) {
  Observed seen;
  ParallelReadOptions options = Threaded();
  options.max_in_flight = 4;
  options.max_bytes_ahead = 16 << 20;
  // Results of 10 MiB: no two fit in 16 MiB, so one is read or held at a time.
  const absl::Status status = ReadInOrder<int>(
      12, options,
      [&](int i) -> absl::StatusOr<int> {
        seen.Start(i);
        seen.Finish(i);
        return i;
      },
      [](int) { return uint64_t{10} << 20; },
      [&](int i, int result) {
        seen.Taken();
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  absl::MutexLock lock(&seen.mu);
  EXPECT_EQ(seen.max_running_or_held, 1);
  EXPECT_EQ(seen.started.size(), 12u);
}

// Read 7 fails, then read 3: the error returned is read 3's (the first in order), reads 0..2
// are taken, and nothing past 7 + 4 in flight is started.
TEST(ParallelReadsTest, FirstErrorInOrderStopsTheRest) {
  Observed seen;
  std::vector<int> taken;
  ParallelReadOptions options = Threaded();
  options.max_in_flight = 4;
  const absl::Status status = ReadInOrder<int>(
      100, options,
      [&](int i) -> absl::StatusOr<int> {
        seen.Start(i);
        if (i == 7) {
          seen.Finish(i);
          return absl::UnavailableError("file 7: 503");
        }
        if (i == 3) {
          if (!seen.WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                return std::count(seen.finished.begin(), seen.finished.end(), 7) > 0;
              })) {
            return absl::DeadlineExceededError("read 7 never failed");
          }
          seen.Finish(i);
          return absl::PermissionDeniedError("file 3: 403");
        }
        seen.Finish(i);
        return i;
      },
      [](int) { return uint64_t{1}; },
      [&](int i, int result) {
        taken.push_back(i);
        return absl::OkStatus();
      });
  EXPECT_EQ(status, absl::PermissionDeniedError("file 3: 403"));
  EXPECT_EQ(taken, (std::vector<int>{0, 1, 2}));
  absl::MutexLock lock(&seen.mu);
  EXPECT_LT(*std::max_element(seen.started.begin(), seen.started.end()), 7 + 4);
}

TEST(ParallelReadsTest, TakeErrorStops) {
  std::vector<int> taken;
  const absl::Status status = ReadInOrder<int>(
      50, Threaded(), [](int i) -> absl::StatusOr<int> { return i; },
      [](int) { return uint64_t{1}; },
      [&](int i, int result) {
        taken.push_back(i);
        return i == 2 ? absl::DataLossError("file 2: corrupt") : absl::OkStatus();
      });
  EXPECT_EQ(status, absl::DataLossError("file 2: corrupt"));
  EXPECT_EQ(taken, (std::vector<int>{0, 1, 2}));
}

// Reads quicker than threads_after stay on the calling thread, and so does one slower read (a
// quick one that lost its core); after three slower ones in a row the rest run on workers.
TEST(ParallelReadsTest, ThreadsOnceReadsAreSlow) {
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<int> on_caller(10);  // each written by its read only
  ParallelReadOptions options;
  options.threads_after = absl::Milliseconds(100);
  const absl::Status status = ReadInOrder<int>(
      10, options,
      [&](int i) -> absl::StatusOr<int> {
        on_caller[i] = std::this_thread::get_id() == caller;
        // Reads 1 and 3..5 stand for round trips: they take longer than threads_after.
        if (i == 1 || (i >= 3 && i <= 5)) absl::SleepFor(absl::Milliseconds(120));
        return i;
      },
      [](int) { return uint64_t{1}; }, [](int i, int result) { return absl::OkStatus(); });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(on_caller, (std::vector<int>{1, 1, 1, 1, 1, 1, 0, 0, 0, 0}));
}

// Workers open files under the caller's PathConfinement and charge its MetadataAllowance.
TEST(ParallelReadsTest, WorkersReadUnderTheCallersConfinementAndAllowance) {
  absl::StatusOr<std::shared_ptr<const PathConfinement>> confinement =
      PathConfinement::Create({::testing::TempDir()});
  ASSERT_TRUE(confinement.ok()) << confinement.status();
  auto allowance = std::make_shared<MetadataAllowance>(1 << 20);
  ScopedPathConfinement confined(confinement->get());
  ScopedMetadataAllowance charged(allowance);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<int> on_caller(20), confined_reads(20), charged_reads(20);
  const absl::Status status = ReadInOrder<int>(
      20, Threaded(),
      [&](int i) -> absl::StatusOr<int> {
        on_caller[i] = std::this_thread::get_id() == caller;
        confined_reads[i] = CurrentPathConfinement() == confinement->get();
        charged_reads[i] = CurrentMetadataAllowance() == allowance;
        return i;
      },
      [](int) { return uint64_t{1}; }, [](int i, int result) { return absl::OkStatus(); });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::count(on_caller.begin(), on_caller.end(), 1), 1);  // read 0
  EXPECT_EQ(confined_reads, std::vector<int>(20, 1));
  EXPECT_EQ(charged_reads, std::vector<int>(20, 1));
}

TEST(ParallelReadsTest, OneInFlightReadsOnTheCallingThread) {
  std::vector<int> order;
  ParallelReadOptions options = Threaded();
  options.max_in_flight = 1;
  const absl::Status status = ReadInOrder<int>(
      3, options,
      [&](int i) -> absl::StatusOr<int> {
        order.push_back(i);
        return i;
      },
      [](int) { return uint64_t{1}; },
      [&](int i, int result) {
        order.push_back(100 + i);
        return absl::OkStatus();
      });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(order, (std::vector<int>{0, 100, 1, 101, 2, 102}));
}

}  // namespace
}  // namespace reshard
