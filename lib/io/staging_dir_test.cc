#include "lib/io/staging_dir.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "lib/io/atomic_file.h"
#include "lib/io/file_access.h"
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
  ASSERT_TRUE(WriteFileAtomically(staging->dir(), "a.txt", "data").ok());
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
    ASSERT_TRUE(WriteFileAtomically(staging->dir(), "b.txt", "bee").ok());
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
    ASSERT_TRUE(WriteFileAtomically(staging->dir(), "c.txt", "sea").ok());
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
  ASSERT_TRUE(WriteFileAtomically(first->dir(), "busy.txt", "in progress").ok());
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

// The defect this guards against: the output's parent replaced by a symlink to a folder outside
// while a job ran made the cleanup delete `<outside>/.<name>.reshard-staging`.
TEST(StagingDirTest, ParentSwappedForSymlinkFailsAndTouchesNothingOutside) {
  for (bool confined : {false, true}) {
    SCOPED_TRACE(confined ? "confined" : "local");
    const std::string root = fs::canonical(MakeTempDir()).string();
    const std::string outside = MakeTempDir();
    // What the old cleanup deleted by following the symlink.
    fs::create_directories(outside + "/.out.reshard-staging");
    std::ofstream(outside + "/.out.reshard-staging/precious") << "keep";
    auto confinement = PathConfinement::Create({root});
    ASSERT_TRUE(confinement.ok()) << confinement.status();
    ScopedPathConfinement scope(confined ? confinement->get() : nullptr);
    fs::create_directories(root + "/a");
    {
      auto staging = StagingDir::Create(root + "/a/out");
      ASSERT_TRUE(staging.ok()) << staging.status();
      ASSERT_TRUE(WriteFileAtomically(staging->dir(), "x.bin", "data").ok());
      fs::rename(root + "/a", root + "/a.moved");
      fs::create_directory_symlink(outside, root + "/a");
      ASSERT_TRUE(WriteFileAtomically(staging->dir(), "y.bin", "more").ok());
      absl::Status published = staging->Publish();
      EXPECT_EQ(published.code(), absl::StatusCode::kPermissionDenied) << published;
      EXPECT_NE(published.message().find(root + "/a"), absl::string_view::npos) << published;
    }
    EXPECT_EQ(ReadAll(outside + "/.out.reshard-staging/precious"), "keep");
    EXPECT_FALSE(Exists(outside + "/out"));
    EXPECT_FALSE(Exists(outside + "/x.bin"));
    EXPECT_FALSE(Exists(outside + "/.out.reshard-staging/x.bin"));
    // The run's own staging folder went, from the folder it was made in.
    EXPECT_FALSE(Exists(root + "/a.moved/.out.reshard-staging"));
    EXPECT_FALSE(Exists(root + "/a.moved/out"));
  }
}

TEST(StagingDirTest, ConfinedParentThroughSymlinkIsRefused) {
  const std::string root = fs::canonical(MakeTempDir()).string();
  const std::string outside = MakeTempDir();
  fs::create_directory_symlink(outside, root + "/link");
  auto confinement = PathConfinement::Create({root});
  ASSERT_TRUE(confinement.ok()) << confinement.status();
  ScopedPathConfinement scope(confinement->get());
  auto staging = StagingDir::Create(root + "/link/out");
  EXPECT_EQ(staging.status().code(), absl::StatusCode::kPermissionDenied) << staging.status();
  EXPECT_TRUE(fs::is_empty(outside));
  // Missing parents are created beneath the root, handle by handle.
  auto nested = StagingDir::Create(root + "/new/deeper/out");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_TRUE(fs::is_directory(root + "/new/deeper/.out.reshard-staging"));
}

// Stale staging folders are removed by walking handles: symlinks in them are unlinked, and a
// symlink standing under the staging name is removed itself; no target is touched.
TEST(StagingDirTest, StaleStagingSymlinksAreNotFollowed) {
  const std::string root = fs::canonical(MakeTempDir()).string();
  const std::string outside = MakeTempDir();
  std::ofstream(outside + "/precious") << "keep";
  fs::create_directories(root + "/.out.reshard-staging/sub");
  fs::create_directory_symlink(outside, root + "/.out.reshard-staging/sub/link");
  {
    auto staging = StagingDir::Create(root + "/out");
    ASSERT_TRUE(staging.ok()) << staging.status();
    EXPECT_TRUE(fs::is_empty(staging->path()));
  }
  EXPECT_EQ(ReadAll(outside + "/precious"), "keep");
  fs::create_directory_symlink(outside, root + "/.out2.reshard-staging");
  {
    auto staging = StagingDir::Create(root + "/out2");
    ASSERT_TRUE(staging.ok()) << staging.status();
    EXPECT_TRUE(fs::is_directory(fs::symlink_status(root + "/.out2.reshard-staging")));
  }
  EXPECT_EQ(ReadAll(outside + "/precious"), "keep");
  EXPECT_FALSE(Exists(outside + "/.out2.reshard-staging"));
}

TEST(StagingDirTest, EmptyNameIsInvalid) {
  EXPECT_EQ(StagingDir::Create("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard
