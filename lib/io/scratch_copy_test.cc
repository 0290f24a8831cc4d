#include "lib/io/scratch_copy.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/mapped_file.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSize = 9 * MappedFile::kRemotePieceBytes + 3;

class ScratchCopyTest : public testing::Test {
 protected:
  void SetUp() override {
    store_ = new kvstore::MemoryDriver;  // registered drivers are never destroyed
    kvstore::RegisterDriver(store_);
    data_ = TestPattern(kSize);
    store_->Put("mem://b/obj", data_);
    absl::StatusOr<MappedFile> file = MappedFile::Open("mem://b/obj");
    ASSERT_TRUE(file.ok()) << file.status();
    source_ = *std::move(file);
    // Scratch files go to a folder of the test's own.
    scratch_dir_ = MakeTempDir("scratch");
    const char* tmpdir = std::getenv("TMPDIR");
    if (tmpdir != nullptr) saved_tmpdir_ = tmpdir;
    ::setenv("TMPDIR", scratch_dir_.c_str(), 1);
  }
  void TearDown() override {
    if (saved_tmpdir_.empty()) {
      ::unsetenv("TMPDIR");
    } else {
      ::setenv("TMPDIR", saved_tmpdir_.c_str(), 1);
    }
  }

  // Fetches [begin, end) allowing `memory` bytes; checks the bytes, that every byte was fetched
  // exactly once (one store request for each MappedFile::kRemotePieceBytes or less), and that
  // the pieces told cover the range in order.
  ScratchCopy FetchAndCheck(uint64_t begin, uint64_t end, uint64_t memory) {
    const std::vector<std::pair<uint64_t, uint64_t>> before = store_->ranges();
    uint64_t told = begin;
    absl::StatusOr<ScratchCopy> copy =
        ScratchCopy::Fetch(source_, begin, end, memory, "tensor \"w\"",
                           [&](uint64_t offset, uint64_t length, const std::byte* data) {
                             EXPECT_EQ(offset, told);
                             EXPECT_EQ(std::memcmp(data, data_.data() + offset, length), 0);
                             told += length;
                           });
    EXPECT_TRUE(copy.ok()) << copy.status();
    if (!copy.ok()) return ScratchCopy();
    EXPECT_EQ(told, end);
    EXPECT_EQ(std::memcmp(copy->at(begin), data_.data() + begin, end - begin), 0);
    const std::vector<std::pair<uint64_t, uint64_t>> after = store_->ranges();
    uint64_t fetched = 0;
    for (size_t i = before.size(); i < after.size(); ++i) fetched += after[i].second;
    EXPECT_EQ(fetched, end - begin);
    const uint64_t piece = MappedFile::kRemotePieceBytes;
    EXPECT_LE(after.size() - before.size(),
              (end - begin + piece - 1) / piece + (end - begin) / ScratchCopy::kPieceBytes + 1);
    return *std::move(copy);
  }

  kvstore::MemoryDriver* store_ = nullptr;
  std::string data_;
  MappedFile source_;
  std::string scratch_dir_;
  std::string saved_tmpdir_;
};

TEST_F(ScratchCopyTest, SmallRangeInMemory) {
  ScratchCopy copy = FetchAndCheck(100, 3 * MappedFile::kRemotePieceBytes + 5, 4 << 20);
  EXPECT_TRUE(copy.in_memory());
  EXPECT_EQ(copy.memory_bytes(), 3 * MappedFile::kRemotePieceBytes + 5 - 100);
}

// A range beyond the allowance goes to a file that has no name: the scratch folder stays empty
// while the copy is read, and mapped pages handed back are read again from the file.
TEST_F(ScratchCopyTest, LargeRangeInUnlinkedScratchFile) {
  ScratchCopy copy = FetchAndCheck(7, kSize, 1 << 20);
  EXPECT_FALSE(copy.in_memory());
  EXPECT_EQ(copy.memory_bytes(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(scratch_dir_));
  copy.Release(7, kSize - 7);
  EXPECT_EQ(std::memcmp(copy.at(7), data_.data() + 7, kSize - 7), 0);
  ScratchCopy moved = std::move(copy);
  EXPECT_EQ(std::memcmp(moved.at(kSize - 100), data_.data() + kSize - 100, 100), 0);
}

// A scratch folder that cannot take the file: the error names the reader, the object, the
// offset and the folder.
TEST_F(ScratchCopyTest, MissingScratchFolderNamed) {
  const std::string missing = scratch_dir_ + "/missing";
  ::setenv("TMPDIR", missing.c_str(), 1);
  absl::StatusOr<ScratchCopy> copy = ScratchCopy::Fetch(source_, 0, kSize, 1 << 20, "tensor \"w\"");
  ASSERT_TRUE(absl::IsNotFound(copy.status())) << copy.status();
  EXPECT_THAT(copy.status().message(), HasSubstr("tensor \"w\""));
  EXPECT_THAT(copy.status().message(), HasSubstr("mem://b/obj"));
  EXPECT_THAT(copy.status().message(), HasSubstr(missing));
  // A range that fits in memory needs no folder.
  EXPECT_TRUE(ScratchCopy::Fetch(source_, 0, 1000, 1 << 20, "tensor \"w\"").ok());
}

// A failed range read: the error keeps its code and names the reader, the object and the byte
// offset of the read, in memory and through a file.
TEST_F(ScratchCopyTest, FailedReadNamed) {
  store_->Fail("mem://b/obj", absl::UnavailableError("connection reset"));
  for (const uint64_t memory : {uint64_t{1} << 30, uint64_t{1} << 20}) {
    absl::StatusOr<ScratchCopy> copy =
        ScratchCopy::Fetch(source_, 4096, kSize, memory, "tensor \"w\"");
    ASSERT_TRUE(absl::IsUnavailable(copy.status())) << copy.status();
    EXPECT_THAT(copy.status().message(), HasSubstr("tensor \"w\""));
    EXPECT_THAT(copy.status().message(), HasSubstr("mem://b/obj at byte offset 4096"));
    EXPECT_THAT(copy.status().message(), HasSubstr("connection reset"));
  }
}

}  // namespace
}  // namespace reshard
