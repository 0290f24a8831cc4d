#include "lib/io/atomic_file.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

Directory OpenDir(const std::string& path) {
  auto dir = Directory::Open(path);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *std::move(dir) : Directory();
}

TEST(AtomicFileTest, CommitPublishesContent) {
  const std::string dir = MakeTempDir();
  auto file = AtomicFile::Create(OpenDir(dir), "out.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string final_path = dir + "/out.bin";
  EXPECT_EQ(file->final_path(), final_path);
  ASSERT_TRUE(file->Append("hello ").ok());
  ASSERT_TRUE(file->Append(std::string("wor\0ld", 6)).ok());
  EXPECT_EQ(file->bytes_written(), 12u);
  EXPECT_FALSE(Exists(final_path)) << "final file visible before Commit";
  EXPECT_TRUE(Exists(final_path + ".partial"));
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_TRUE(Exists(final_path));
  EXPECT_FALSE(Exists(final_path + ".partial"));
  EXPECT_EQ(ReadAll(final_path), std::string("hello wor\0ld", 12));
  // A committed file is closed.
  EXPECT_EQ(file->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(file->Commit().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AtomicFileTest, UncommittedFileIsRemoved) {
  const std::string dir = MakeTempDir();
  {
    auto file = AtomicFile::Create(OpenDir(dir), "gone.bin");
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(file->Append("partial data").ok());
    EXPECT_TRUE(Exists(dir + "/gone.bin.partial"));
  }
  EXPECT_FALSE(Exists(dir + "/gone.bin.partial"));
  EXPECT_FALSE(Exists(dir + "/gone.bin"));
}

TEST(AtomicFileTest, MoveTransfersOwnership) {
  const std::string dir = MakeTempDir();
  auto created = AtomicFile::Create(OpenDir(dir), "moved.bin");
  ASSERT_TRUE(created.ok());
  AtomicFile a = *std::move(created);
  ASSERT_TRUE(a.Append("abc").ok());
  AtomicFile b = std::move(a);
  EXPECT_TRUE(Exists(dir + "/moved.bin.partial"));  // the moved-from object must not delete it
  ASSERT_TRUE(b.Append("def").ok());
  ASSERT_TRUE(b.Commit().ok());
  EXPECT_EQ(ReadAll(dir + "/moved.bin"), "abcdef");
}

TEST(AtomicFileTest, EmptyCommit) {
  const std::string dir = MakeTempDir();
  auto file = AtomicFile::Create(OpenDir(dir), "empty.bin");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_TRUE(Exists(dir + "/empty.bin"));
  EXPECT_EQ(ReadAll(dir + "/empty.bin"), "");
}

TEST(AtomicFileTest, RejectsBadNamesAndExistingPartial) {
  const std::string dir = MakeTempDir();
  for (const char* name : {"", "/a", "a/", "a/../b", ".", ".."}) {
    EXPECT_EQ(AtomicFile::Create(OpenDir(dir), name).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  auto first = AtomicFile::Create(OpenDir(dir), "same.bin");
  ASSERT_TRUE(first.ok());
  // Exclusive creation: a second writer of the same name fails instead of clobbering.
  EXPECT_FALSE(AtomicFile::Create(OpenDir(dir), "same.bin").ok());
  EXPECT_EQ(Directory::Open(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(AtomicFileTest, NestedNamesAreWrittenInTheirSubfolders) {
  const std::string dir = MakeTempDir();
  auto file = AtomicFile::Create(OpenDir(dir), "zero/w.weight/fp32.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->final_path(), dir + "/zero/w.weight/fp32.pt");
  EXPECT_TRUE(Exists(dir + "/zero/w.weight/fp32.pt.partial"));
  ASSERT_TRUE(file->Append("x").ok());
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_EQ(ReadAll(dir + "/zero/w.weight/fp32.pt"), "x");
  EXPECT_FALSE(Exists(dir + "/zero/w.weight/fp32.pt.partial"));
}

TEST(AtomicFileTest, WriteFileAtomically) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(OpenDir(dir), "index.json", "{}\n").ok());
  EXPECT_EQ(ReadAll(dir + "/index.json"), "{}\n");
  EXPECT_FALSE(Exists(dir + "/index.json.partial"));
}

// The file lands in the folder it was created in, through the handle, even when the folder's
// path is swapped for a symlink to another folder before the commit.
TEST(AtomicFileTest, CommitsIntoTheFolderNotThePath) {
  const std::string root = MakeTempDir();
  const std::string outside = MakeTempDir();
  ASSERT_EQ(::mkdir((root + "/out").c_str(), 0755), 0);
  auto file = AtomicFile::Create(OpenDir(root + "/out"), "data.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Append("payload").ok());
  ASSERT_EQ(::rename((root + "/out").c_str(), (root + "/moved").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/out").c_str()), 0);
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_EQ(ReadAll(root + "/moved/data.bin"), "payload");
  EXPECT_FALSE(Exists(outside + "/data.bin"));
  EXPECT_FALSE(Exists(outside + "/data.bin.partial"));
}

}  // namespace
}  // namespace reshard
