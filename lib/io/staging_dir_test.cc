#include "lib/io/staging_dir.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "lib/io/atomic_file.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

TEST(StagingDirTest, StagingPathIsHiddenSibling) {
  EXPECT_EQ(StagingPathFor("/a/b/out"), "/a/b/.out.reshard-staging");
  EXPECT_EQ(StagingPathFor("/a/b/out/"), "/a/b/.out.reshard-staging");
  EXPECT_EQ(StagingPathFor("/a/b/./out"), "/a/b/.out.reshard-staging");
}

TEST(StagingDirTest, CheckOutputDirUsable) {
  const std::string root = MakeTempDir();
  EXPECT_TRUE(CheckOutputDirUsable(root + "/missing").ok());
  fs::create_directory(root + "/empty");
  EXPECT_TRUE(CheckOutputDirUsable(root + "/empty").ok());
  fs::create_directory(root + "/full");
  std::ofstream(root + "/full/x") << "x";
  absl::Status status = CheckOutputDirUsable(root + "/full");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("not empty"), absl::string_view::npos) << status;
  std::ofstream(root + "/file") << "x";
  EXPECT_EQ(CheckOutputDirUsable(root + "/file").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StagingDirTest, NonEmptyOutputIsRefused) {
  const std::string root = MakeTempDir();
  const std::string out = root + "/out";
  fs::create_directory(out);
  std::ofstream(out + "/existing.txt") << "keep me";
  auto staging = StagingDir::Create(out);
  ASSERT_FALSE(staging.ok());
  EXPECT_EQ(staging.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Exists(out + "/existing.txt"));
  EXPECT_FALSE(Exists(StagingPathFor(out)));
}

TEST(StagingDirTest, PublishOntoMissingOutput) {
  const std::string root = MakeTempDir();
  const std::string out = root + "/nested/parents/out";
  auto staging = StagingDir::Create(out);
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_EQ(staging->output_dir(), out);
  EXPECT_EQ(staging->path(), root + "/nested/parents/.out.reshard-staging");
  EXPECT_TRUE(fs::is_directory(staging->path()));
  EXPECT_FALSE(Exists(out));
  ASSERT_TRUE(WriteFileAtomically(staging->path(), "a.txt", "data").ok());
  EXPECT_FALSE(Exists(out));
  ASSERT_TRUE(staging->Publish().ok());
  EXPECT_TRUE(fs::is_regular_file(out + "/a.txt"));
  EXPECT_FALSE(Exists(staging->path()));
  EXPECT_EQ(staging->Publish().code(), absl::StatusCode::kFailedPrecondition);
  // A second run onto the published folder is refused.
  EXPECT_EQ(StagingDir::Create(out).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StagingDirTest, PublishOntoEmptyExistingFolder) {
  const std::string root = MakeTempDir();
  const std::string out = root + "/out";
  fs::create_directory(out);
  {
    auto staging = StagingDir::Create(out);
    ASSERT_TRUE(staging.ok()) << staging.status();
    ASSERT_TRUE(WriteFileAtomically(staging->path(), "b.txt", "bee").ok());
    ASSERT_TRUE(staging->Publish().ok());
  }
  // Destroying a published StagingDir must not remove the output.
  EXPECT_TRUE(fs::is_regular_file(out + "/b.txt"));
  EXPECT_FALSE(Exists(StagingPathFor(out)));
}

TEST(StagingDirTest, DestroyedUnpublishedLeavesNothing) {
  const std::string root = MakeTempDir();
  const std::string out = root + "/out";
  std::string staged;
  {
    auto staging = StagingDir::Create(out);
    ASSERT_TRUE(staging.ok()) << staging.status();
    staged = staging->path();
    ASSERT_TRUE(WriteFileAtomically(staging->path(), "c.txt", "sea").ok());
  }
  EXPECT_FALSE(Exists(staged));
  EXPECT_FALSE(Exists(out));
}

TEST(StagingDirTest, MovedStagingDirIsRemovedOnce) {
  const std::string root = MakeTempDir();
  const std::string out = root + "/out";
  std::string staged;
  {
    auto created = StagingDir::Create(out);
    ASSERT_TRUE(created.ok());
    StagingDir a = *std::move(created);
    StagingDir b = std::move(a);
    staged = b.path();
    EXPECT_TRUE(Exists(staged));
  }
  EXPECT_FALSE(Exists(staged));
}

TEST(StagingDirTest, StaleStagingFolderIsRemoved) {
  const std::string root = MakeTempDir();
  const std::string out = root + "/out";
  const std::string stale = StagingPathFor(out);
  fs::create_directories(stale + "/sub");
  std::ofstream(stale + "/leftover.safetensors.partial") << "junk";
  std::ofstream(stale + "/sub/x") << "junk";
  auto staging = StagingDir::Create(out);
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_EQ(staging->path(), stale);
  EXPECT_TRUE(fs::is_directory(stale));
  EXPECT_TRUE(fs::is_empty(stale)) << "stale contents survived";
}

TEST(StagingDirTest, LockedStagingFolderIsRefused) {
  const std::string root = MakeTempDir();
  const std::string out = root + "/out";
  auto first = StagingDir::Create(out);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(WriteFileAtomically(first->path(), "busy.txt", "in progress").ok());
  auto second = StagingDir::Create(out);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("another reshard run"), absl::string_view::npos)
      << second.status();
  // The running one's files are untouched and it can still publish.
  EXPECT_TRUE(fs::is_regular_file(first->path() + "/busy.txt"));
  ASSERT_TRUE(first->Publish().ok());
  EXPECT_TRUE(fs::is_regular_file(out + "/busy.txt"));
}

TEST(StagingDirTest, EmptyNameIsInvalid) {
  EXPECT_EQ(StagingDir::Create("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard
