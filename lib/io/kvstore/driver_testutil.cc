#include "lib/io/kvstore/driver_testutil.h"

#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard {
namespace kvstore {

int RaceCreateExclusive(const Driver& driver, const std::string& path, int threads) {
  std::vector<absl::Status> results(threads);
  std::vector<std::thread> running;
  for (int i = 0; i < threads; ++i) {
    running.emplace_back(
        [&, i] { results[i] = driver.CreateExclusive(path, std::string(i + 1, 'x')); });
  }
  for (std::thread& thread : running) thread.join();
  int won = -1;
  for (int i = 0; i < threads; ++i) {
    if (results[i].ok()) {
      EXPECT_EQ(won, -1) << "two creates of " << path << " succeeded";
      won = i;
    } else {
      EXPECT_TRUE(absl::IsAlreadyExists(results[i])) << results[i];
      EXPECT_THAT(std::string(results[i].message()), ::testing::HasSubstr(path));
    }
  }
  EXPECT_NE(won, -1) << "no create of " << path << " succeeded";
  return won;
}

}  // namespace kvstore
}  // namespace reshard
