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

TEST(DirectoryTest, RelativeNamesArePlainComponents) {
  for (const char* name :
       {"", "/abs", "a/", "a//b", "a/../b", "./a", "a/./b", "1/2/3/4/5/6/7/8/9"}) {
    EXPECT_EQ(CheckRelativeName(name).code(), absl::StatusCode::kInvalidArgument) << name;
  }
  for (const char* name : {"model.safetensors", "zero/optimizer_state.pt",
                           "zero/3.mlp.dense_4h_to_h.weight/fp32.pt", "1/2/3/4/5/6/7/8"}) {
    EXPECT_TRUE(CheckRelativeName(name).ok()) << name;
  }
}

TEST(DirectoryTest, OpenParentOfWalksAndCreatesWithoutFollowingSymlinks) {
  const std::string root = MakeTempDir();
  auto dir = Directory::Open(root);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(dir->OpenParentOf("a/b/c.pt").status().code(), absl::StatusCode::kNotFound);
  auto place = dir->OpenParentOf("a/b/c.pt", /*create=*/true);
  ASSERT_TRUE(place.ok()) << place.status();
  EXPECT_EQ(place->name, "c.pt");
  EXPECT_EQ(place->folder.path(), root + "/a/b");
  EXPECT_TRUE(fs::is_directory(root + "/a/b"));
  auto plain = dir->OpenParentOf("top.pt");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->name, "top.pt");
  EXPECT_NE(plain->folder.fd(), dir->fd());
  // A symlinked folder on the way is refused, also when creating.
  const std::string outside = MakeTempDir();
  fs::create_directory_symlink(outside, root + "/link");
  for (bool create : {false, true}) {
    EXPECT_EQ(dir->OpenParentOf("link/x/y.pt", create).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  EXPECT_TRUE(fs::is_empty(outside));
  EXPECT_EQ(dir->OpenParentOf("a/../b.pt").status().code(), absl::StatusCode::kInvalidArgument);
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
