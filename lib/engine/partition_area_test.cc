// The claims of a partition area on the memory driver (mem://) and on posix: leases held in
// the claim's contents, judged on a clock the test drives, and the takeover of a stale claim.

#include "lib/engine/partition_area.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

// A clock that moves only when the test says.
class TestClock {
 public:
  absl::Time Now() const { return absl::FromUnixSeconds(seconds_.load()); }
  void Advance(absl::Duration by) { seconds_ += absl::ToInt64Seconds(by); }
  std::function<absl::Time()> Function() {
    return [this] { return Now(); };
  }

 private:
  std::atomic<int64_t> seconds_{1'800'000'000};
};

// Claim options of a worker posing as process `pid` on `host` (never this host, so that its
// claims are judged by their lease), on `clock`; the refresher stays idle.
ClaimOptions WorkerOn(const std::string& host, int pid, TestClock& clock) {
  ClaimOptions options;
  options.lease = absl::Seconds(120);
  options.refresh = absl::Hours(1);
  options.now = clock.Function();
  options.identity = {
      {"pid", pid}, {"host", host}, {"boot_id", "b"}, {"pid_ns", "n"}, {"start_time", "1"}};
  return options;
}

nlohmann::json ClaimContents(const PartitionArea& area, int index, int count) {
  auto read = ReadSmallFile(*area.driver, area.PathOf(PartitionClaimName(index, count)));
  EXPECT_TRUE(read.ok()) << read.status();
  return read.ok() ? nlohmann::json::parse(read->first) : nlohmann::json();
}

class PartitionAreaTest : public testing::TestWithParam<bool> {
 protected:
  // The output whose area the test uses: mem:// or a posix folder.
  std::string Output() {
    const std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    const std::string safe = name.substr(0, name.find('/'));
    if (GetParam()) return absl::StrCat("mem://areas/", safe, "/out");
    return MakeTempDir("partition-area") + "/out";
  }
};

TEST_P(PartitionAreaTest, AreaIsASiblingOfTheOutput) {
  const std::string output = Output();
  auto area = LocatePartitionArea(output + "/");
  ASSERT_TRUE(area.ok()) << area.status();
  EXPECT_EQ(area->output, output);
  EXPECT_EQ(area->name, "out");
  EXPECT_EQ(area->root, output.substr(0, output.size() - 3) + ".out.reshard-partitions");
  auto bucket = LocatePartitionArea("mem://whole-bucket");
  EXPECT_EQ(bucket.status().code(), absl::StatusCode::kInvalidArgument) << bucket.status();
  EXPECT_NE(bucket.status().message().find("output mem://whole-bucket does not end in a folder"),
            std::string::npos)
      << bucket.status();
}

// A claim is live until its lease ends; each refresh moves the end a lease on.
TEST_P(PartitionAreaTest, RefreshedClaimStaysLiveUntilItsLeaseEnds) {
  auto area = LocatePartitionArea(Output());
  ASSERT_TRUE(area.ok()) << area.status();
  TestClock clock;
  auto holder = PartitionClaim::Acquire(*area, 0, 2, WorkerOn("a.example", 11, clock));
  ASSERT_TRUE(holder.ok()) << holder.status();
  EXPECT_EQ(ClaimContents(*area, 0, 2)["heartbeat"], 0);

  clock.Advance(absl::Seconds(100));
  ASSERT_TRUE((*holder)->Refresh().ok());
  EXPECT_EQ(ClaimContents(*area, 0, 2)["heartbeat"], 1);
  clock.Advance(absl::Seconds(119));  // 219 s after the claim, 119 s after the refresh
  auto refused = PartitionClaim::Acquire(*area, 0, 2, WorkerOn("b.example", 22, clock));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find(
                "partition 0 of 2 is being written by another worker (pid 11 on host a.example"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE((*holder)->Held().ok());

  clock.Advance(absl::Seconds(2));  // the lease has ended
  auto taker = PartitionClaim::Acquire(*area, 0, 2, WorkerOn("b.example", 22, clock));
  ASSERT_TRUE(taker.ok()) << taker.status();
  EXPECT_EQ(ClaimContents(*area, 0, 2)["host"], "b.example");
  // The stalled holder finds the claim another's at its next refresh, and stops.
  const absl::Status lost = (*holder)->Refresh();
  EXPECT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition) << lost;
  EXPECT_NE(lost.message().find("was taken over by another worker"), std::string::npos) << lost;
  EXPECT_EQ((*holder)->Held().code(), absl::StatusCode::kFailedPrecondition);
  holder->reset();  // does not remove the taker's claim
  EXPECT_EQ(ClaimContents(*area, 0, 2)["host"], "b.example");
  taker->reset();
  EXPECT_EQ(area->driver->Stat(area->PathOf(PartitionClaimName(0, 2))).status().code(),
            absl::StatusCode::kNotFound)
      << "released by its holder";
}

// Workers racing for one stale claim, every one of them having judged it stale before any
// takes it over: exactly one takes it over, every other stops with FailedPrecondition naming
// the takeover marker the winner created.
TEST_P(PartitionAreaTest, StaleClaimIsTakenOverExactlyOnce) {
  const std::string output = Output();
  for (int round = 0; round < 10; ++round) {
    auto area = LocatePartitionArea(absl::StrCat(output, round));
    ASSERT_TRUE(area.ok()) << area.status();
    TestClock clock;
    auto stalled = PartitionClaim::Acquire(*area, 1, 2, WorkerOn("gone.example", 7, clock));
    ASSERT_TRUE(stalled.ok()) << stalled.status();
    clock.Advance(absl::Seconds(121));

    constexpr int kTakers = 3;
    absl::Barrier judged(kTakers);
    std::vector<absl::StatusOr<std::unique_ptr<PartitionClaim>>> claims;
    for (int t = 0; t < kTakers; ++t) claims.emplace_back(absl::UnknownError("not run"));
    std::vector<std::thread> takers;
    for (int t = 0; t < kTakers; ++t) {
      takers.emplace_back([&, t] {
        ClaimOptions options = WorkerOn(absl::StrCat("taker", t, ".example"), 100 + t, clock);
        options.on_stale = [&judged] { judged.Block(); };
        claims[t] = PartitionClaim::Acquire(*area, 1, 2, std::move(options));
      });
    }
    for (std::thread& taker : takers) taker.join();
    int won = -1;
    for (int t = 0; t < kTakers; ++t) {
      if (claims[t].ok()) {
        EXPECT_EQ(won, -1) << "two takers won in round " << round;
        won = t;
        continue;
      }
      EXPECT_EQ(claims[t].status().code(), absl::StatusCode::kFailedPrecondition)
          << claims[t].status();
      EXPECT_NE(claims[t].status().message().find(absl::StrCat(
                    "partition 1 of 2 is being written by another worker, which took over the "
                    "stale claim ",
                    area->PathOf(PartitionClaimName(1, 2)), " first (")),
                std::string::npos)
          << claims[t].status();
    }
    ASSERT_NE(won, -1) << "round " << round;
    EXPECT_EQ(ClaimContents(*area, 1, 2)["host"], absl::StrCat("taker", won, ".example"));
    EXPECT_EQ((*stalled)->Refresh().code(), absl::StatusCode::kFailedPrecondition);
  }
}

INSTANTIATE_TEST_SUITE_P(Drivers, PartitionAreaTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return info.param ? "Memory" : "Posix";
                         });

}  // namespace
}  // namespace reshard
