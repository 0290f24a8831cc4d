#include "lib/exec/resume.h"

#include <xxhash.h>

#include <filesystem>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

FilePlan PlanOf(const std::string& name, uint64_t bytes) {
  FilePlan file;
  file.name = name;
  file.bytes = bytes;
  return file;
}

// Larger than the chunk HashFile reads at a time.
std::string HashedBytes() {
  std::string data((9 << 20) + 17, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  return data;
}

TEST(ResumeTest, HashFileIsTheXxh3OfTheWholeFile) {
  const std::string dir = MakeTempDir("hash");
  const std::string data = HashedBytes();
  WriteAll(dir + "/data.bin", data);
  auto hash = HashFile(dir + "/data.bin");
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, XXH3_64bits(data.data(), data.size()));
}

// A file kept on a store without mappings (S3, memory) is hashed through the same driver reads.
TEST(ResumeTest, HashFileReadsAFileOfTheMemoryDriver) {
  const std::string data = HashedBytes();
  kvstore::GetMemoryDriver().Put("mem://resume-hash/out/data.bin", data);
  auto hash = HashFile("mem://resume-hash/out/data.bin");
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, XXH3_64bits(data.data(), data.size()));

  auto missing = HashFile("mem://resume-hash/out/missing.bin");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("mem://resume-hash/out/missing.bin"),
            std::string::npos)
      << missing.status();
}

// A recorded file with the planned size and checksum is reused; one that changed is removed
// (to be written again) and counted as a mismatch; an unrecorded file under the name is
// removed without a mismatch.
TEST(ResumeTest, ReuseCompletedFileKeepsOnlyIntactRecordedFiles) {
  const std::string dir = MakeTempDir("resume");
  WriteAll(dir + "/intact.bin", "committed bytes");
  WriteAll(dir + "/changed.bin", "committed bytez");
  WriteAll(dir + "/unrecorded.bin", "left over");
  auto folder = Directory::Open(dir);
  ASSERT_TRUE(folder.ok()) << folder.status();
  const uint64_t hash = XXH3_64bits("committed bytes", 15);
  ExecutorOptions options;
  options.completed_files = {{"intact.bin", hash}, {"changed.bin", hash}};

  double verify_seconds = 0;
  bool mismatch = false;
  auto reused =
      ReuseCompletedFile(PlanOf("intact.bin", 15), *folder, options, verify_seconds, mismatch);
  ASSERT_TRUE(reused.has_value());
  EXPECT_EQ(reused->name, "intact.bin");
  EXPECT_EQ(reused->bytes, 15u);
  EXPECT_EQ(reused->xxh3_64, hash);
  EXPECT_FALSE(mismatch);
  EXPECT_TRUE(fs::exists(dir + "/intact.bin"));

  EXPECT_FALSE(
      ReuseCompletedFile(PlanOf("changed.bin", 15), *folder, options, verify_seconds, mismatch)
          .has_value());
  EXPECT_TRUE(mismatch);
  EXPECT_FALSE(fs::exists(dir + "/changed.bin"));

  mismatch = false;
  EXPECT_FALSE(
      ReuseCompletedFile(PlanOf("unrecorded.bin", 9), *folder, options, verify_seconds, mismatch)
          .has_value());
  EXPECT_FALSE(mismatch);
  EXPECT_FALSE(fs::exists(dir + "/unrecorded.bin"));
}

}  // namespace
}  // namespace reshard
