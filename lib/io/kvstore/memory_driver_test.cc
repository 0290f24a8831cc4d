#include "lib/io/kvstore/memory_driver.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/kvstore/driver_testutil.h"
#include "lib/testing/status_matchers.h"

namespace reshard {
namespace kvstore {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(MemoryDriverTest, StatsAndListsFilesAndFolders) {
  MemoryDriver driver;
  EXPECT_EQ(driver.scheme(), "mem");
  EXPECT_FALSE(driver.maps_files());
  driver.Put("mem://b/m/a", "aaa");
  driver.Put("mem://b/m/sub/c", "c");
  absl::StatusOr<PathStat> file = driver.Stat("mem://b/m/a");
  ASSERT_OK(file);
  EXPECT_EQ(file->size, 3u);
  EXPECT_EQ(file->version, driver.version("mem://b/m/a"));
  EXPECT_TRUE(driver.Stat("mem://b/m")->is_folder);
  EXPECT_TRUE(absl::IsNotFound(driver.Stat("mem://b/none").status()));
  absl::StatusOr<Listing> listing = driver.List("mem://b/m");
  ASSERT_OK(listing);
  ASSERT_EQ(listing->files.size(), 1u);
  EXPECT_EQ(listing->files[0].name, "a");
  EXPECT_THAT(listing->folders, ElementsAre("sub"));
  EXPECT_EQ(driver.lookups(), 4);
}

TEST(MemoryDriverTest, ReadRangeIsPinnedToTheVersionOpened) {
  MemoryDriver driver;
  driver.Put("mem://b/f", "0123456789");
  absl::StatusOr<PathStat> opened = driver.Stat("mem://b/f");
  ASSERT_OK(opened);
  std::string out(4, '\0');
  ASSERT_OK(driver.ReadRange("mem://b/f", 3, absl::MakeSpan(out), *opened));
  EXPECT_EQ(out, "3456");
  driver.Put("mem://b/f", "abcdefghij");
  absl::Status changed = driver.ReadRange("mem://b/f", 3, absl::MakeSpan(out), *opened);
  EXPECT_TRUE(absl::IsFailedPrecondition(changed)) << changed;
  EXPECT_THAT(changed.message(), HasSubstr("mem://b/f changed while being read"));
  std::string past(8, '\0');
  absl::Status beyond =
      driver.ReadRange("mem://b/f", 3, absl::MakeSpan(past), *driver.Stat("mem://b/f"));
  EXPECT_TRUE(absl::IsDataLoss(beyond)) << beyond;
  EXPECT_EQ(driver.reads(), 3);
}

TEST(MemoryDriverTest, CreateExclusiveLetsOneOfManyWin) {
  MemoryDriver driver;
  const int won = RaceCreateExclusive(driver, "mem://b/claim", 8);
  ASSERT_NE(won, -1);
  EXPECT_EQ(driver.Stat("mem://b/claim")->size, static_cast<uint64_t>(won + 1));
}

TEST(MemoryDriverTest, WriterPublishesOnCommitOnly) {
  MemoryDriver driver;
  {
    absl::StatusOr<std::unique_ptr<Writer>> writer = driver.Write("mem://b/w", {});
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->Append("gone"));
    (*writer)->Abort();
  }
  EXPECT_TRUE(absl::IsNotFound(driver.Stat("mem://b/w").status()));
  absl::StatusOr<std::unique_ptr<Writer>> writer = driver.Write("mem://b/w", {});
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->Append("ab"));
  ASSERT_OK((*writer)->Append("c"));
  EXPECT_TRUE(absl::IsNotFound(driver.Stat("mem://b/w").status()));
  absl::StatusOr<std::string> version = (*writer)->Commit();
  ASSERT_OK(version);
  EXPECT_EQ(*version, driver.version("mem://b/w"));
  EXPECT_EQ(driver.Stat("mem://b/w")->size, 3u);
  EXPECT_EQ(driver.Stat("mem://b/w")->generation, *version);
  // What was written stays counted after Commit (the executor sizes the file by it).
  EXPECT_EQ((*writer)->pos(), 3u);
  ASSERT_OK(driver.Delete("mem://b/w"));
  EXPECT_TRUE(absl::IsNotFound(driver.Stat("mem://b/w").status()));
}

TEST(MemoryDriverTest, InjectedFailuresAreReturned) {
  MemoryDriver driver;
  driver.Put("mem://b/f", "x");
  driver.Fail("mem://b/f", absl::UnavailableError("503"));
  driver.FailLookups("mem://b/g", absl::UnavailableError("503 on HEAD"));
  std::string out(1, '\0');
  EXPECT_TRUE(absl::IsUnavailable(driver.ReadRange("mem://b/f", 0, absl::MakeSpan(out), {})));
  EXPECT_TRUE(absl::IsUnavailable(driver.Stat("mem://b/g").status()));
  EXPECT_TRUE(absl::IsUnavailable(driver.List("mem://b/g").status()));
}

}  // namespace
}  // namespace kvstore
}  // namespace reshard
