#include "lib/formats/nemo/tar_store.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/formats/nemo/tar_writer.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/mapped_file.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::ElementsAre;

const std::vector<tar_testing::Member> kMembers = {
    {"./", "", '5'},
    {"./model_config.yaml", "num_layers: 2\n"},
    {"./model_weights/metadata.json", "{}"},
    {"./model_weights/__0_0.distcp", "0123456789"},
    {"./model_weights/sub/x", "x"},
    {"./model_weights/link", "", '2', "/etc/passwd"},
};

// The members of kMembers as files and folders of "tar://<archive>!", the archive served by
// its own driver: a local file, or a mem:// object read by range requests as S3's are.
void CheckMountServesMembers(const std::string& archive, const tar_testing::Built& tar) {
  absl::StatusOr<std::unique_ptr<MountedTar>> mount = MountedTar::Mount(archive);
  ASSERT_TRUE(mount.ok()) << mount.status();
  const std::string root = "tar://" + archive + "!";
  EXPECT_EQ((*mount)->root(), root);
  EXPECT_EQ((*mount)->PathOf("model_weights"), root + "/model_weights");

  absl::StatusOr<kvstore::Location> location = kvstore::ParseLocation(root + "/model_weights");
  ASSERT_TRUE(location.ok()) << location.status();
  const kvstore::Driver& driver = *location->driver;
  absl::StatusOr<kvstore::Listing> listing = driver.List(root + "/model_weights");
  ASSERT_TRUE(listing.ok()) << listing.status();
  std::vector<std::string> files;
  for (const kvstore::FileEntry& file : listing->files) files.push_back(file.name);
  EXPECT_THAT(files, ElementsAre("__0_0.distcp", "metadata.json"));
  EXPECT_THAT(listing->folders, ElementsAre("sub"));
  EXPECT_THAT(listing->others, ElementsAre("link"));
  absl::StatusOr<kvstore::Listing> top = driver.List(root);
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_THAT(top->folders, ElementsAre("model_weights"));

  const std::string distcp = root + "/model_weights/__0_0.distcp";
  absl::StatusOr<kvstore::PathStat> stat = driver.Stat(distcp);
  ASSERT_TRUE(stat.ok()) << stat.status();
  EXPECT_FALSE(stat->is_folder);
  EXPECT_EQ(stat->size, 10u);
  std::string bytes(4, '\0');
  ASSERT_TRUE(driver.ReadRange(distcp, 3, absl::MakeSpan(bytes), *stat).ok());
  EXPECT_EQ(bytes, "3456");
  // Through the layers above the drivers, as readers see it.
  absl::StatusOr<std::string> small = ReadSmallFile(distcp, 100);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(*small, "0123456789");
  absl::StatusOr<MappedFile> opened = MappedFile::Open(distcp);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_FALSE(opened->mapped());
  EXPECT_EQ(opened->size(), 10u);

  // A read past the member's end is refused, though the archive goes on.
  absl::Status past = driver.ReadRange(distcp, 8, absl::MakeSpan(bytes), *stat);
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(past.message(), distcp + ": bytes [8, 12) pass the end of " + archive +
                                " member model_weights/__0_0.distcp (10 bytes)");
  EXPECT_EQ(driver.Stat(root + "/model_weights/nope").status().message(),
            root + "/model_weights/nope does not exist: " + archive +
                " has no member model_weights/nope");
  // A link is neither a file nor a folder; its target is not followed.
  absl::StatusOr<kvstore::PathStat> link = driver.Stat(root + "/model_weights/link");
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ(link->special, "a symbolic link to \"/etc/passwd\" in " + archive + " (not followed)");
  EXPECT_EQ(tar.bytes.size(), (*mount)->file().size());
}

TEST(TarStoreTest, ServesALocalArchivesMembers) {
  const std::string dir = MakeTempDir("tar-store");
  const tar_testing::Built tar = tar_testing::BuildTar(kMembers);
  WriteAll(dir + "/m.nemo", tar.bytes);
  CheckMountServesMembers(dir + "/m.nemo", tar);
}

TEST(TarStoreTest, ServesARemoteArchivesMembersByRangeReads) {
  const tar_testing::Built tar = tar_testing::BuildTar(kMembers);
  kvstore::GetMemoryDriver().Put("mem://tar-store/m.nemo", tar.bytes);
  CheckMountServesMembers("mem://tar-store/m.nemo", tar);
}

TEST(TarStoreTest, IsReadOnlyAndServesOnlyMountedArchives) {
  const std::string dir = MakeTempDir("tar-store");
  WriteAll(dir + "/m.nemo", tar_testing::BuildTar(kMembers).bytes);
  const std::string path = "tar://" + dir + "/m.nemo!/model_weights/metadata.json";
  absl::StatusOr<kvstore::Location> location = kvstore::ParseLocation(path);
  ASSERT_TRUE(location.ok()) << location.status();
  const kvstore::Driver& driver = *location->driver;
  // Not mounted: nothing there, whatever the archive holds.
  EXPECT_EQ(driver.Stat(path).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::unique_ptr<MountedTar>> mount = MountedTar::Mount(dir + "/m.nemo");
  ASSERT_TRUE(mount.ok()) << mount.status();
  EXPECT_TRUE(driver.Stat(path).ok());
  EXPECT_EQ(driver.Delete(path).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(driver.CreateExclusive(path, "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(driver.Write(path, {}).status().code(), absl::StatusCode::kPermissionDenied);
  // A user's path never names a member (reshardd's allowed roots confine archives' paths).
  EXPECT_EQ(driver.ConfinedPath(path, true).status().code(), absl::StatusCode::kPermissionDenied);
  mount->reset();
  EXPECT_EQ(driver.Stat(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(TarStoreTest, ATruncatedArchiveIsNotMounted) {
  const std::string dir = MakeTempDir("tar-store");
  const tar_testing::Built tar = tar_testing::BuildTar(kMembers);
  WriteAll(dir + "/m.nemo", tar.bytes.substr(0, tar.data_offsets[3] + 4));
  absl::StatusOr<std::unique_ptr<MountedTar>> mount = MountedTar::Mount(dir + "/m.nemo");
  EXPECT_EQ(mount.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(mount.status().message()),
              ::testing::StartsWith(dir + "/m.nemo: truncated archive: member "
                                          "./model_weights/__0_0.distcp"));
}

}  // namespace
}  // namespace reshard
