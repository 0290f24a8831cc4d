#include "lib/io/kvstore/posix_driver.h"

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/kvstore/driver_testutil.h"
#include "lib/io/path_confinement.h"
#include "lib/testing/status_matchers.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace kvstore {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string CanonicalTempDir() { return fs::canonical(MakeTempDir()).string(); }

TEST(PosixDriverTest, StatsFilesFoldersAndSpecialFiles) {
  const std::string root = CanonicalTempDir();
  fs::create_directories(root + "/a");
  WriteAll(root + "/f", "12345");
  ASSERT_EQ(::mkfifo((root + "/fifo").c_str(), 0600), 0);
  const PosixDriver& driver = GetPosixDriver();
  EXPECT_TRUE(driver.maps_files());
  absl::StatusOr<PathStat> file = driver.Stat(root + "/f");
  ASSERT_OK(file);
  EXPECT_FALSE(file->is_folder);
  EXPECT_EQ(file->size, 5u);
  EXPECT_EQ(file->version, "");
  EXPECT_TRUE(driver.Stat(root + "/a")->is_folder);
  EXPECT_EQ(driver.Stat(root + "/fifo")->special, "a FIFO (named pipe)");
  absl::Status missing = driver.Stat(root + "/none").status();
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  EXPECT_THAT(missing.message(), HasSubstr(root + "/none"));
  // A file where a folder is expected: nothing is there either.
  EXPECT_TRUE(absl::IsNotFound(driver.Stat(root + "/f/x").status()));
}

TEST(PosixDriverTest, ListsFilesFoldersAndOthersSorted) {
  const std::string root = CanonicalTempDir();
  fs::create_directories(root + "/d/sub");
  WriteAll(root + "/d/b", "bb");
  WriteAll(root + "/d/.a", "a");
  ASSERT_EQ(::mkfifo((root + "/d/fifo").c_str(), 0600), 0);
  fs::create_symlink(root + "/nowhere", root + "/d/dangling");
  absl::StatusOr<Listing> listing = GetPosixDriver().List(root + "/d");
  ASSERT_OK(listing);
  ASSERT_EQ(listing->files.size(), 2u);
  EXPECT_EQ(listing->files[0].name, ".a");
  EXPECT_EQ(listing->files[1].name, "b");
  EXPECT_EQ(listing->files[1].size, 2u);
  EXPECT_THAT(listing->folders, ElementsAre("sub"));
  EXPECT_THAT(listing->others, ElementsAre("fifo"));
}

TEST(PosixDriverTest, ReadRangeReadsExactlyAndNamesAShortFile) {
  const std::string root = CanonicalTempDir();
  WriteAll(root + "/f", TestPattern(100));
  const PosixDriver& driver = GetPosixDriver();
  absl::StatusOr<PathStat> stat = driver.Stat(root + "/f");
  ASSERT_OK(stat);
  std::string out(10, '\0');
  ASSERT_OK(driver.ReadRange(root + "/f", 90, absl::MakeSpan(out), *stat));
  EXPECT_EQ(out, TestPattern(100).substr(90));
  std::string past(11, '\0');
  absl::Status short_read = driver.ReadRange(root + "/f", 90, absl::MakeSpan(past), *stat);
  EXPECT_TRUE(absl::IsDataLoss(short_read)) << short_read;
  EXPECT_THAT(short_read.message(), HasSubstr("byte offset 100"));
}

TEST(PosixDriverTest, CreateExclusiveLetsOneOfManyWin) {
  const std::string root = CanonicalTempDir();
  const std::string path = root + "/claims/winner";
  const PosixDriver& driver = GetPosixDriver();
  const int won = RaceCreateExclusive(driver, path, 8);
  ASSERT_NE(won, -1);
  EXPECT_EQ(ReadAll(path), std::string(won + 1, 'x'));
  // Only the file: no temporary file is left beside it.
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(root + "/claims")) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ElementsAre("winner"));
}

TEST(PosixDriverTest, WriterPublishesOnCommitOnly) {
  const std::string root = CanonicalTempDir();
  const std::string path = root + "/out/sub/file.bin";
  const PosixDriver& driver = GetPosixDriver();
  {
    absl::StatusOr<std::unique_ptr<Writer>> writer = driver.Write(path, {});
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->Append("abandoned"));
    (*writer)->Abort();
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(root + "/out/sub"));
  absl::StatusOr<std::unique_ptr<Writer>> writer = driver.Write(path, {});
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->Append("abc"));
  ASSERT_OK((*writer)->Append("def"));
  EXPECT_EQ((*writer)->pos(), 6u);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THAT((*writer)->Commit(), IsOkAndHolds(std::string()));
  EXPECT_EQ(ReadAll(path), "abcdef");
  ASSERT_OK(driver.Delete(path));
  EXPECT_FALSE(fs::exists(path));
  EXPECT_OK(driver.Delete(path));  // nothing there: fine
}

TEST(PosixDriverTest, ConfinementRefusesPathsOutsideTheRoots) {
  const std::string root = CanonicalTempDir();
  fs::create_directories(root + "/inside");
  fs::create_directories(root + "/outside");
  WriteAll(root + "/inside/f", "in");
  WriteAll(root + "/outside/f", "out");
  fs::create_symlink(root + "/outside/f", root + "/inside/link");
  absl::StatusOr<std::shared_ptr<const PathConfinement>> confinement =
      PathConfinement::Create({root + "/inside"});
  ASSERT_OK(confinement);
  ScopedPathConfinement scope(confinement->get());
  const PosixDriver& driver = GetPosixDriver();
  EXPECT_OK(driver.Stat(root + "/inside/f"));
  EXPECT_TRUE(absl::IsPermissionDenied(driver.Stat(root + "/outside/f").status()));
  EXPECT_TRUE(absl::IsPermissionDenied(driver.Stat(root + "/inside/link").status()));
  std::string out(3, '\0');
  EXPECT_TRUE(absl::IsPermissionDenied(
      driver.ReadRange(root + "/outside/f", 0, absl::MakeSpan(out), PathStat{})));
}

}  // namespace
}  // namespace kvstore
}  // namespace reshard
