// The "s3" kvstore driver, and the s3:// paths of MappedFile and lib/io/file_access.h that go
// through it, against a real Ceph radosgw. Run by //tests/s3:s3_input_test, which starts
// radosgw and sets the AWS environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) that
// DefaultS3Client reads, plus S3_TEST_ENDPOINT.

#include <stdlib.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"
#include "lib/io/kvstore/driver_testutil.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/s3/default_client.h"
#include "lib/io/s3/s3_client.h"
#include "lib/io/s3/s3_store.h"
#include "lib/testing/status_matchers.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kBucket[] = "reshard-store-test";

std::string Url(const std::string& key) { return absl::StrCat("s3://", kBucket, "/", key); }

class S3StoreTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<S3Client*> client = DefaultS3Client();
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *client;
    absl::Status created = client_->CreateBucket(kBucket);
    ASSERT_TRUE(created.ok() || absl::IsAlreadyExists(created)) << created;
    big_ = new std::string(TestPattern(10 << 20, 7));
    for (const auto& [key, data] : std::vector<std::pair<std::string, std::string>>{
             {"m/a.safetensors", TestPattern(1000, 1)},
             {"m/b.bin", TestPattern(10, 2)},
             {"m/.hidden", "x"},
             {"m/sub/deep.safetensors", TestPattern(5, 3)},
             {"m/big.bin", *big_},
             {"only-sub/x/y", "y"},
             {"marker/", ""},
             {"marker/f", "f"},
             {"empty.bin", ""},
         }) {
      absl::StatusOr<std::string> etag = client_->Put(kBucket, key, data);
      ASSERT_TRUE(etag.ok()) << etag.status();
    }
    absl::StatusOr<kvstore::Location> location = kvstore::ParseLocation("s3://x");
    ASSERT_TRUE(location.ok()) << location.status();
    store_ = location->driver;
  }
  static void TearDownTestSuite() { delete big_; }

  static S3Client* client_;
  static const kvstore::Driver* store_;
  static std::string* big_;
};
S3Client* S3StoreTest::client_ = nullptr;
const kvstore::Driver* S3StoreTest::store_ = nullptr;
std::string* S3StoreTest::big_ = nullptr;

TEST_F(S3StoreTest, StatFilesAndFolders) {
  absl::StatusOr<kvstore::PathStat> file = store_->Stat(Url("m/a.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->is_folder);
  EXPECT_EQ(file->size, 1000u);
  absl::StatusOr<kvstore::PathStat> empty = store_->Stat(Url("empty.bin"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_FALSE(empty->is_folder);
  EXPECT_EQ(empty->size, 0u);
  for (const std::string& folder :
       {Url("m"), Url("m/"), Url("only-sub"), Url("marker"), absl::StrCat("s3://", kBucket)}) {
    absl::StatusOr<kvstore::PathStat> stat = store_->Stat(folder);
    ASSERT_TRUE(stat.ok()) << folder << ": " << stat.status();
    EXPECT_TRUE(stat->is_folder) << folder;
  }
}

TEST_F(S3StoreTest, StatMissingNamesKeyAndBucket) {
  absl::StatusOr<kvstore::PathStat> missing = store_->Stat(Url("m/nothing.safetensors"));
  ASSERT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("\"m/nothing.safetensors\""));
  EXPECT_THAT(missing.status().message(), HasSubstr(kBucket));
  // A prefix of a key is not a folder: "m/a" is neither an object nor "m/a/...".
  EXPECT_TRUE(absl::IsNotFound(store_->Stat(Url("m/a")).status()));
  absl::StatusOr<kvstore::PathStat> no_bucket = store_->Stat("s3://reshard-no-such-bucket/k");
  ASSERT_TRUE(absl::IsNotFound(no_bucket.status())) << no_bucket.status();
  EXPECT_THAT(no_bucket.status().message(), HasSubstr("NoSuchBucket"));
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Stat("s3://Bad_Bucket/k").status()));
}

TEST_F(S3StoreTest, WrongSecretNamesTheS3Code) {
  S3Client::Options options;
  options.config.endpoint = ::getenv("S3_TEST_ENDPOINT");
  options.config.credentials.access_key_id = "TESTKEY";
  options.config.credentials.secret_access_key = "WRONGSECRET";
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  S3Store store(client->get());
  absl::StatusOr<kvstore::PathStat> stat = store.Stat(Url("m/a.safetensors"));
  ASSERT_TRUE(absl::IsUnauthenticated(stat.status())) << stat.status();
  EXPECT_THAT(stat.status().message(), HasSubstr("SignatureDoesNotMatch"));
}

TEST_F(S3StoreTest, ListsFilesDirectlyInside) {
  absl::StatusOr<kvstore::Listing> entries = store_->List(Url("m"));
  ASSERT_TRUE(entries.ok()) << entries.status();
  std::vector<std::string> names;
  for (const kvstore::FileEntry& entry : entries->files) names.push_back(entry.name);
  EXPECT_THAT(names, ElementsAre(".hidden", "a.safetensors", "b.bin", "big.bin"));
  EXPECT_EQ(entries->files[1].size, 1000u);
  // The "marker/" object is the folder, not a file in it.
  absl::StatusOr<kvstore::Listing> marker = store_->List(Url("marker/"));
  ASSERT_TRUE(marker.ok()) << marker.status();
  ASSERT_EQ(marker->files.size(), 1u);
  EXPECT_EQ(marker->files[0].name, "f");
  absl::StatusOr<std::vector<std::string>> listed = ListInputFolder(Url("m"));
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 4u);
  // Files and folders in one listing; a folder is named without its '/'.
  absl::StatusOr<kvstore::Listing> both = store_->List(Url("m"));
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(both->files.size(), 4u);
  EXPECT_THAT(both->folders, ElementsAre("sub"));
  EXPECT_THAT(*ListInputSubfolders(Url("m")), ElementsAre("sub"));
  EXPECT_TRUE(ListInputSubfolders(Url("m/sub"))->empty());
}

TEST_F(S3StoreTest, ListFolderStopsAtMaxEntries) {
  absl::StatusOr<S3Client::Folder> folder = client_->ListFolder(kBucket, "m/", 2);
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(folder->objects.size() + folder->subfolders.size(), 2u);
  absl::StatusOr<S3Client::Folder> all = client_->ListFolder(kBucket, "m/");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->objects.size(), 4u);
  EXPECT_THAT(all->subfolders, ElementsAre("m/sub/"));
}

TEST_F(S3StoreTest, MappedFileReadsRanges) {
  absl::StatusOr<MappedFile> file = MappedFile::Open(Url("m/big.bin"), big_->size());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->mapped());
  EXPECT_EQ(file->data(), nullptr);
  EXPECT_TRUE(file->direct_reads());
  EXPECT_TRUE(file->ReadsDirectly(/*dense=*/false, 0, 1));
  EXPECT_EQ(file->size(), big_->size());
  // A short range, and one long enough to be read in pieces at once.
  for (const auto& [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {12345, 100}, {1, (9 << 20) + 17}, {big_->size() - 1, 1}}) {
    std::vector<std::byte> out(length);
    ASSERT_TRUE(file->ReadAt(offset, length, out.data()).ok());
    EXPECT_EQ(std::memcmp(out.data(), big_->data() + offset, length), 0) << offset;
    absl::StatusOr<const std::byte*> direct = file->ReadDirect(offset, length, out.data());
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(std::memcmp(*direct, big_->data() + offset, length), 0) << offset;
  }
  std::vector<std::byte> out(10);
  absl::Status past = file->ReadAt(big_->size() - 5, 10, out.data());
  EXPECT_TRUE(absl::IsDataLoss(past)) << past;
  EXPECT_THAT(past.message(), HasSubstr(Url("m/big.bin")));
  EXPECT_THAT(past.message(), HasSubstr(absl::StrCat("offset ", big_->size() - 5)));
  // Page-cache hints do nothing on a remote file.
  file->Release(0, 4096);
  file->DropCached(0, 4096);
  file->WillNeed(0, 4096);
  file->AdviseRandomAccess();
}

TEST_F(S3StoreTest, MappedFileChecksSizeAndKind) {
  absl::StatusOr<MappedFile> changed = MappedFile::Open(Url("m/a.safetensors"), 999);
  EXPECT_TRUE(absl::IsDataLoss(changed.status())) << changed.status();
  EXPECT_THAT(changed.status().message(), HasSubstr("1000 bytes"));
  EXPECT_TRUE(absl::IsInvalidArgument(MappedFile::Open(Url("m")).status()));
  EXPECT_TRUE(absl::IsNotFound(MappedFile::Open(Url("m/missing")).status()));
}

TEST_F(S3StoreTest, FileAccessDispatches) {
  EXPECT_THAT(CheckInputFolder(Url("m")), IsOkAndHolds(true));
  EXPECT_THAT(CheckInputFolder(Url("m/a.safetensors")), IsOkAndHolds(false));
  EXPECT_THAT(CheckInputExists(Url("m/a.safetensors")), IsOkAndHolds(true));
  EXPECT_THAT(CheckInputExists(Url("m/missing")), IsOkAndHolds(false));
  EXPECT_TRUE(CheckInputFileType(Url("m")).ok());
  EXPECT_TRUE(absl::IsNotFound(CheckInputFileType(Url("m/missing"))));
  EXPECT_TRUE(CheckInputPath(Url("m"), "input").ok());
  absl::StatusOr<std::string> prefix = ReadFilePrefix(Url("m/a.safetensors"), 9);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  EXPECT_EQ(*prefix, TestPattern(1000, 1).substr(0, 9));
  absl::StatusOr<std::string> small = ReadSmallFile(Url("m/b.bin"), 10);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(*small, TestPattern(10, 2));
  absl::StatusOr<std::string> too_big = ReadSmallFile(Url("m/a.safetensors"), 999);
  EXPECT_TRUE(absl::IsInvalidArgument(too_big.status())) << too_big.status();
  EXPECT_TRUE(absl::IsInvalidArgument(ReadSmallFile(Url("m"), 10).status()));
  absl::StatusOr<std::string> empty = ReadSmallFile(Url("empty.bin"), 10);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(*empty, "");
}

// radosgw honours If-None-Match: * on PUT: a second create of the key is refused and the
// first object stays.
TEST_F(S3StoreTest, CreateExclusiveRefusesAnExistingObject) {
  const std::string url = Url("exclusive/claim");
  ASSERT_OK(store_->Delete(url));
  ASSERT_OK(store_->CreateExclusive(url, "first"));
  const absl::Status again = store_->CreateExclusive(url, "second!");
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again;
  EXPECT_THAT(again.message(), HasSubstr(url));
  absl::StatusOr<kvstore::PathStat> stat = store_->Stat(url);
  ASSERT_OK(stat);
  EXPECT_EQ(stat->size, 5u);
  ASSERT_OK(store_->Delete(url));
  EXPECT_TRUE(absl::IsNotFound(store_->Stat(url).status()));
  // Of concurrent creates, exactly one wins, and the object holds its bytes.
  const int won = kvstore::RaceCreateExclusive(*store_, url, 8);
  ASSERT_NE(won, -1);
  EXPECT_EQ(store_->Stat(url)->size, static_cast<uint64_t>(won + 1));
  ASSERT_OK(store_->Delete(url));
}

TEST_F(S3StoreTest, WriterPublishesOnCommitOnly) {
  const std::string url = Url("written/object.bin");
  ASSERT_OK(store_->Delete(url));
  const std::string data = TestPattern(9 << 20, 5);  // two parts
  {
    absl::StatusOr<std::unique_ptr<kvstore::Writer>> writer = store_->Write(url, {});
    ASSERT_OK(writer);
    ASSERT_OK((*writer)->Append(data));
    (*writer)->Abort();
  }
  EXPECT_TRUE(absl::IsNotFound(store_->Stat(url).status()));
  absl::StatusOr<std::unique_ptr<kvstore::Writer>> writer = store_->Write(url, {});
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->Append(absl::string_view(data).substr(0, 1000)));
  ASSERT_OK((*writer)->Append(absl::string_view(data).substr(1000)));
  EXPECT_EQ((*writer)->pos(), data.size());
  absl::StatusOr<std::string> version = (*writer)->Commit();
  ASSERT_OK(version);
  absl::StatusOr<kvstore::PathStat> stat = store_->Stat(url);
  ASSERT_OK(stat);
  EXPECT_EQ(stat->size, data.size());
  EXPECT_EQ(stat->version, *version);
  std::string back(data.size(), '\0');
  ASSERT_OK(store_->ReadRange(url, 0, absl::MakeSpan(back), *stat));
  EXPECT_TRUE(back == data);
  ASSERT_OK(store_->Delete(url));
}

}  // namespace
}  // namespace reshard
