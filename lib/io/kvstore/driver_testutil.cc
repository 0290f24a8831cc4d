#include "lib/io/kvstore/driver_testutil.h"

#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
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

std::map<std::string, std::string> ReadTree(const Driver& driver, const std::string& root) {
  std::map<std::string, std::string> files;
  std::vector<std::string> folders = {""};
  while (!folders.empty()) {
    const std::string folder = folders.back();
    folders.pop_back();
    const std::string path = folder.empty() ? root : absl::StrCat(root, "/", folder);
    absl::StatusOr<Listing> listing = driver.List(path);
    EXPECT_TRUE(listing.ok()) << listing.status();
    if (!listing.ok()) continue;
    const std::string prefix = folder.empty() ? "" : absl::StrCat(folder, "/");
    for (const std::string& child : listing->folders) folders.push_back(prefix + child);
    for (const FileEntry& file : listing->files) {
      const std::string file_path = absl::StrCat(path, "/", file.name);
      absl::StatusOr<PathStat> stat = driver.Stat(file_path);
      EXPECT_TRUE(stat.ok()) << stat.status();
      if (!stat.ok()) continue;
      std::string bytes(stat->size, '\0');
      const absl::Status read = driver.ReadRange(file_path, 0, absl::MakeSpan(bytes), *stat);
      EXPECT_TRUE(read.ok()) << read;
      files[prefix + file.name] = std::move(bytes);
    }
  }
  return files;
}

}  // namespace kvstore
}  // namespace reshard
