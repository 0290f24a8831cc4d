#include "lib/io/file_access.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "lib/testing/status_matchers.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

std::string CanonicalTempDir() { return fs::canonical(MakeTempDir()).string(); }

class FileAccessTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { DisableOpenat2ForTesting(GetParam()); }
  void TearDown() override { DisableOpenat2ForTesting(false); }
};

// A FIFO as input must be refused at once, not block the open (the test would hang).
TEST_P(FileAccessTest, FifoIsRefusedWithoutBlocking) {
  const std::string root = CanonicalTempDir();
  ASSERT_EQ(::mkfifo((root + "/model.safetensors").c_str(), 0600), 0);
  auto confinement = PathConfinement::Create({root});
  ASSERT_TRUE(confinement.ok());
  for (const PathConfinement* scope_to :
       {static_cast<const PathConfinement*>(nullptr), confinement->get()}) {
    ScopedPathConfinement scope(scope_to);
    auto fd = OpenRegularFile(root + "/model.safetensors");
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument) << fd.status();
    EXPECT_NE(fd.status().message().find("FIFO"), absl::string_view::npos) << fd.status();
    absl::Status type = CheckInputFileType(root + "/model.safetensors");
    EXPECT_EQ(type.code(), absl::StatusCode::kInvalidArgument) << type;
    EXPECT_NE(type.message().find("model.safetensors"), absl::string_view::npos) << type;
    EXPECT_EQ(ReadSmallFile(root + "/model.safetensors", 100).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_P(FileAccessTest, SocketAndDeviceAreRefused) {
  EXPECT_EQ(OpenRegularFile("/dev/null").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckInputFileType("/dev/zero").code(), absl::StatusCode::kInvalidArgument);
  const std::string root = CanonicalTempDir();
  const std::string socket_path = root + "/s";
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof(address.sun_path) - 1);
  if (socket_path.size() < sizeof(address.sun_path) &&
      ::bind(sock, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    auto fd = OpenRegularFile(socket_path);
    EXPECT_EQ(fd.status().code(), absl::StatusCode::kInvalidArgument) << fd.status();
  }
  ::close(sock);
}

TEST_P(FileAccessTest, ConfinedOpens) {
  const std::string root = CanonicalTempDir();
  const std::string outside = CanonicalTempDir();
  fs::create_directories(root + "/ckpt/blobs");
  std::ofstream(root + "/ckpt/blobs/data") << "inside";
  std::ofstream(outside + "/secret") << "outside";
  // A symlink that stays inside the root (as Hugging Face's cache has) is fine.
  fs::create_symlink("blobs/data", root + "/ckpt/model.bin");
  fs::create_symlink(outside + "/secret", root + "/ckpt/escape.bin");
  fs::create_directory_symlink(outside, root + "/ckpt/outdir");
  auto confinement = PathConfinement::Create({root});
  ASSERT_TRUE(confinement.ok());
  ScopedPathConfinement scope(confinement->get());
  auto inside = ReadSmallFile(root + "/ckpt/model.bin", 100);
  ASSERT_TRUE(inside.ok()) << inside.status();
  EXPECT_EQ(*inside, "inside");
  EXPECT_EQ(ReadSmallFile(root + "/ckpt/escape.bin", 100).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReadSmallFile(root + "/ckpt/outdir/secret", 100).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      ReadSmallFile(root + "/ckpt/../../" + fs::path(outside).filename().string() + "/secret", 100)
          .status()
          .code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReadSmallFile(root + "/ckpt/missing", 100).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadSmallFile(root + "/ckpt/blobs/data", 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Output folders: created beneath the root; a symlink on the way is refused.
  auto made = OpenFolderCreating(root + "/out/a/b");
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_TRUE(fs::is_directory(root + "/out/a/b"));
  EXPECT_EQ(OpenFolderCreating(root + "/ckpt/outdir/x").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(outside + "/x"));
  EXPECT_EQ(OpenFolderCreating(outside + "/y").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(fs::exists(outside + "/y"));
}

INSTANTIATE_TEST_SUITE_P(Openat2AndWalk, FileAccessTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "NoFollowWalk" : "Openat2";
                         });

TEST(LocalInputTest, FilesFoldersAndSizes) {
  const std::string root = CanonicalTempDir();
  fs::create_directories(root + "/a/b");
  fs::create_directories(root + "/.hidden");
  WriteAll(root + "/f.pt", "12345");
  ASSERT_EQ(::mkfifo((root + "/fifo").c_str(), 0600), 0);
  EXPECT_THAT(CheckInputFile(root + "/f.pt"), IsOkAndHolds(true));
  EXPECT_THAT(CheckInputFile(root + "/a"), IsOkAndHolds(false));
  EXPECT_THAT(CheckInputFile(root + "/fifo"), IsOkAndHolds(false));
  EXPECT_THAT(CheckInputFile(root + "/none"), IsOkAndHolds(false));
  EXPECT_EQ(*InputFileSize(root + "/f.pt"), 5u);
  EXPECT_TRUE(absl::IsNotFound(InputFileSize(root + "/none").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(InputFileSize(root + "/fifo").status()));
  absl::StatusOr<std::vector<std::string>> folders = ListInputSubfolders(root);
  ASSERT_TRUE(folders.ok()) << folders.status();
  std::sort(folders->begin(), folders->end());
  EXPECT_EQ(*folders, (std::vector<std::string>{".hidden", "a"}));
  absl::StatusOr<std::vector<std::string>> none = ListInputSubfolders(root + "/none");
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find(root + "/none"), absl::string_view::npos);
}

}  // namespace
}  // namespace reshard
