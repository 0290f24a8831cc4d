#include "lib/io/directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

TEST(DirectoryTest, PlainNamesOnly) {
  for (const char* name : {"", ".", "..", "a/b", "/abs"}) {
    EXPECT_EQ(CheckPlainName(name).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_TRUE(CheckPlainName("model.safetensors").ok());
  EXPECT_TRUE(CheckPlainName("..hidden").ok());
}

TEST(DirectoryTest, ListOpenChildAndFiles) {
  const std::string root = MakeTempDir();
  auto dir = Directory::Open(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto child = dir->OpenChild("sub", /*create=*/true);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->path(), root + "/sub");
  auto fd = child->OpenFile("f.txt", O_WRONLY | O_CREAT | O_EXCL);
  ASSERT_TRUE(fd.ok()) << fd.status();
  ::close(*fd);
  auto names = child->List();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"f.txt"});
  EXPECT_TRUE(child->Rename("f.txt", "g.txt").ok());
  EXPECT_TRUE(fs::exists(root + "/sub/g.txt"));
  EXPECT_EQ(dir->StatChild("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dir->OpenChild("missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(DirectoryTest, SymlinksAreNeverFollowed) {
  const std::string root = MakeTempDir();
  const std::string outside = MakeTempDir();
  std::ofstream(outside + "/precious") << "keep";
  fs::create_directory_symlink(outside, root + "/link");
  auto dir = Directory::Open(root);
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(dir->OpenChild("link").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(dir->OpenChild("link", /*create=*/true).status().code(),
            absl::StatusCode::kPermissionDenied);
  std::ofstream(outside + "/target.txt") << "t";
  fs::create_symlink(outside + "/target.txt", root + "/file_link");
  EXPECT_EQ(dir->OpenFile("file_link", O_RDONLY).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto st = dir->StatChild("link");
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(S_ISLNK(st->st_mode));
}

TEST(DirectoryTest, RemoveTreeUnlinksSymlinksAndKeepsTheirTargets) {
  const std::string root = MakeTempDir();
  const std::string outside = MakeTempDir();
  std::ofstream(outside + "/precious") << "keep";
  fs::create_directories(root + "/tree/a/b");
  std::ofstream(root + "/tree/a/b/file") << "x";
  fs::create_directory_symlink(outside, root + "/tree/a/to_outside");
  fs::create_symlink(outside + "/precious", root + "/tree/file_link");
  ::mkfifo((root + "/tree/fifo").c_str(), 0600);
  auto dir = Directory::Open(root);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(dir->RemoveTree("tree").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(root + "/tree")));
  EXPECT_TRUE(fs::exists(outside + "/precious"));
  // A symlink given as the tree itself is removed as a link.
  fs::create_directory_symlink(outside, root + "/top_link");
  ASSERT_TRUE(dir->RemoveTree("top_link").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(root + "/top_link")));
  EXPECT_TRUE(fs::exists(outside + "/precious"));
  EXPECT_TRUE(dir->RemoveTree("absent").ok());
}

TEST(DirectoryTest, DescribesFileTypes) {
  EXPECT_EQ(DescribeFileType(S_IFIFO | 0600), "a FIFO (named pipe)");
  EXPECT_EQ(DescribeFileType(S_IFSOCK | 0600), "a socket");
  EXPECT_EQ(DescribeFileType(S_IFCHR | 0600), "a character device");
}

}  // namespace
}  // namespace reshard
