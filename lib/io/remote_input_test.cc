// file_access and MappedFile on a driver that does not map files (the memory driver,
// standing in for S3): dispatch, the listing cache, reads in pieces, version pinning.

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/status_matchers.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

class RemoteInputTest : public testing::Test {
 protected:
  void SetUp() override {
    store_ = new kvstore::MemoryDriver;  // registered drivers are never destroyed
    kvstore::RegisterDriver(store_);
    store_->Put("mem://b/model/a.safetensors", TestPattern(100));
    store_->Put("mem://b/model/b.bin", "bb");
    store_->Put("mem://b/model/sub/c", "c");
    store_->Put("mem://b/big.bin", TestPattern(5 * MappedFile::kRemotePieceBytes + 3));
  }
  kvstore::MemoryDriver* store_;
};

TEST_F(RemoteInputTest, UnknownSchemeIsUnimplemented) {
  absl::StatusOr<kvstore::Location> store = kvstore::ParseLocation("gs://bucket/key");
  ASSERT_TRUE(absl::IsUnimplemented(store.status())) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("gs://bucket/key"));
  EXPECT_THAT(store.status().message(), HasSubstr("mem://"));
  EXPECT_TRUE(absl::IsUnimplemented(CheckInputPath("gs://bucket/key", "input")));
  EXPECT_TRUE(CheckInputPath("/local/path", "input").ok());
  EXPECT_TRUE(CheckInputPath("mem://b/model", "input").ok());
  absl::StatusOr<kvstore::Location> mem = kvstore::ParseLocation("mem://b");
  ASSERT_OK(mem);
  EXPECT_EQ(mem->driver, store_);
}

TEST_F(RemoteInputTest, FileAccessDispatchesRemotePaths) {
  EXPECT_THAT(CheckInputFolder("mem://b/model"), IsOkAndHolds(true));
  EXPECT_THAT(CheckInputFolder("mem://b/model/b.bin"), IsOkAndHolds(false));
  EXPECT_THAT(CheckInputExists("mem://b/model/b.bin"), IsOkAndHolds(true));
  EXPECT_THAT(CheckInputExists("mem://b/nothing"), IsOkAndHolds(false));
  EXPECT_TRUE(CheckInputFileType("mem://b/model").ok());
  EXPECT_TRUE(absl::IsNotFound(CheckInputFileType("mem://b/nothing")));
  absl::StatusOr<std::vector<std::string>> names = ListInputFolder("mem://b/model");
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, UnorderedElementsAre("a.safetensors", "b.bin"));
  EXPECT_EQ(*ReadSmallFile("mem://b/model/b.bin", 2), "bb");
  EXPECT_TRUE(absl::IsInvalidArgument(ReadSmallFile("mem://b/model/b.bin", 1).status()));
  EXPECT_EQ(*ReadFilePrefix("mem://b/model/a.safetensors", 9), TestPattern(9));
  EXPECT_EQ(*ReadFilePrefix("mem://b/model/b.bin", 9), "bb");
  EXPECT_THAT(CheckInputFile("mem://b/model/b.bin"), IsOkAndHolds(true));
  EXPECT_THAT(CheckInputFile("mem://b/model"), IsOkAndHolds(false));
  EXPECT_THAT(CheckInputFile("mem://b/nothing"), IsOkAndHolds(false));
  EXPECT_EQ(*InputFileSize("mem://b/model/a.safetensors"), 100u);
  EXPECT_TRUE(absl::IsInvalidArgument(InputFileSize("mem://b/model").status()));
  EXPECT_TRUE(absl::IsNotFound(InputFileSize("mem://b/nothing").status()));
  store_->Put("mem://b/model/sub/d/e", "e");
  store_->Put("mem://b/model/sub2/f", "f");
  absl::StatusOr<std::vector<std::string>> folders = ListInputSubfolders("mem://b/model");
  ASSERT_TRUE(folders.ok()) << folders.status();
  EXPECT_THAT(*folders, UnorderedElementsAre("sub", "sub2"));
  EXPECT_THAT(*ListInputSubfolders("mem://b/model/sub/"), UnorderedElementsAre("d"));
  // Every entry: files and folders alike, as for a posix folder.
  EXPECT_THAT(*ListInputFolderEntries("mem://b/model"),
              UnorderedElementsAre("a.safetensors", "b.bin", "sub", "sub2"));
  EXPECT_TRUE(ListInputSubfolders("mem://b/model/sub/d")->empty());
  // Opening a remote path as a local file descriptor is refused.
  EXPECT_FALSE(OpenRegularFile("mem://b/model/b.bin").ok());
}

TEST_F(RemoteInputTest, ListingCacheAnswersFromTheFolderListedOnce) {
  {
    ScopedRemoteListingCache cache;
    ScopedRemoteListingCache nested;  // uses the outer one
    const int before = store_->lookups();
    EXPECT_THAT(CheckInputFolder("mem://b/model"), IsOkAndHolds(true));      // a Stat
    EXPECT_THAT(CheckInputFile("mem://b/model/b.bin"), IsOkAndHolds(true));  // the folder's listing
    EXPECT_THAT(CheckInputExists("mem://b/model/none"), IsOkAndHolds(false));  // from the listing
    EXPECT_THAT(CheckInputFolder("mem://b/model/sub"), IsOkAndHolds(true));  // from the listing
    EXPECT_EQ(*InputFileSize("mem://b/model/a.safetensors"), 100u);
    EXPECT_THAT(*ListInputFolder("mem://b/model"), UnorderedElementsAre("a.safetensors", "b.bin"));
    EXPECT_THAT(*ListInputSubfolders("mem://b/model"), UnorderedElementsAre("sub"));
    EXPECT_THAT(CheckInputFolder("mem://b/model"), IsOkAndHolds(true));
    EXPECT_EQ(store_->lookups() - before, 2);
    absl::Status missing = InputFileSize("mem://b/model/none").status();
    EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
    EXPECT_THAT(missing.message(), HasSubstr("mem://b/model/none"));
    EXPECT_EQ(*ReadSmallFile("mem://b/model/b.bin", 2), "bb");  // a read, no Stat
    EXPECT_EQ(store_->lookups() - before, 2);
  }
  // Out of scope every question is asked again.
  const int before = store_->lookups();
  EXPECT_THAT(CheckInputFolder("mem://b/model"), IsOkAndHolds(true));
  EXPECT_THAT(CheckInputFolder("mem://b/model"), IsOkAndHolds(true));
  EXPECT_EQ(store_->lookups() - before, 2);
}

TEST_F(RemoteInputTest, MappedFileReadsInParallelPieces) {
  const std::string expected = TestPattern(5 * MappedFile::kRemotePieceBytes + 3);
  absl::StatusOr<MappedFile> file = MappedFile::Open("mem://b/big.bin", expected.size());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->mapped());
  EXPECT_EQ(file->data(), nullptr);
  EXPECT_TRUE(file->EnableDirectReads());
  EXPECT_TRUE(file->ReadsDirectly(/*dense=*/false, 0, 1));
  std::vector<std::byte> out(expected.size());
  const int before = store_->reads();
  ASSERT_TRUE(file->ReadAt(1, expected.size() - 1, out.data()).ok());
  EXPECT_EQ(std::memcmp(out.data(), expected.data() + 1, expected.size() - 1), 0);
  // Five pieces' worth: as many requests as fit in flight, each at least a piece.
  EXPECT_EQ(store_->reads() - before, 5);
  absl::StatusOr<const std::byte*> direct = file->ReadDirect(7, 100, out.data());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(*direct, out.data());
  EXPECT_EQ(std::memcmp(out.data(), expected.data() + 7, 100), 0);
}

TEST_F(RemoteInputTest, MappedFileErrors) {
  EXPECT_TRUE(absl::IsDataLoss(MappedFile::Open("mem://b/model/b.bin", 3).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MappedFile::Open("mem://b/model").status()));
  EXPECT_TRUE(absl::IsNotFound(MappedFile::Open("mem://b/none").status()));
  absl::StatusOr<MappedFile> file = MappedFile::Open("mem://b/model/a.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::byte> out(200);
  // Past the end: refused before any request, naming the file and the offset.
  const int before = store_->reads();
  absl::Status past = file->ReadAt(90, 20, out.data());
  EXPECT_TRUE(absl::IsDataLoss(past)) << past;
  EXPECT_THAT(past.message(), HasSubstr("mem://b/model/a.safetensors"));
  EXPECT_THAT(past.message(), HasSubstr("offset 90"));
  EXPECT_EQ(store_->reads(), before);
  // The store's error comes back as it is.
  store_->Fail("mem://b/model/a.safetensors", absl::UnavailableError("mem: slow down"));
  EXPECT_TRUE(absl::IsUnavailable(file->ReadAt(0, 10, out.data())));
}

// The version a reader recorded (SourceFile::version) pins the file: opened at another
// version it is refused naming both; opened at its version, a replacement afterwards is refused
// at the next read. The listing gives the versions Stat gives.
TEST_F(RemoteInputTest, MappedFileOpensTheVersionItIsGiven) {
  const std::string url = "mem://b/model/a.safetensors";
  const std::string then = store_->version(url);
  ASSERT_FALSE(then.empty());
  {
    ScopedRemoteListingCache cache;
    ASSERT_THAT(CheckInputFolder("mem://b/model"), IsOkAndHolds(true));
    absl::StatusOr<InputFileInfo> listed = StatInputFile(url);
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->size, 100u);
    EXPECT_EQ(listed->version, then);
  }
  absl::StatusOr<MappedFile> pinned = MappedFile::Open(url, 100, then);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->version(), then);

  std::string replaced = TestPattern(100);
  replaced[50] ^= 1;
  store_->Put(url, replaced);
  const std::string now = store_->version(url);
  ASSERT_NE(now, then);
  absl::StatusOr<MappedFile> stale = MappedFile::Open(url, 100, then);
  ASSERT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition) << stale.status();
  EXPECT_EQ(stale.status().message(),
            absl::StrCat(url, " changed since its metadata was read: ETag ", then, " then, ", now,
                         " now"));
  std::vector<std::byte> out(10);
  absl::Status read = pinned->ReadAt(0, 10, out.data());
  ASSERT_EQ(read.code(), absl::StatusCode::kFailedPrecondition) << read;
  EXPECT_THAT(read.message(), HasSubstr(absl::StrCat(url, " changed while being read: ETag ",
                                                     then, " at open, ", now, " at offset 0")));
  // Without a version (a local file's catalog entry) the current one is opened.
  absl::StatusOr<MappedFile> current = MappedFile::Open(url, 100);
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ(current->version(), now);
}

}  // namespace
}  // namespace reshard
