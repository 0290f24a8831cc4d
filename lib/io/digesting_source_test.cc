#include "lib/io/digesting_source.h"

#include <xxhash.h>

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/io/byte_source.h"
#include "lib/io/mapped_file.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

// Reads front to back, with a header read again and a jump ahead between them: the digest
// covers exactly the file's first bytes read in order.
TEST(Xxh3SourceTest, DigestsTheBytesReadInOrder) {
  const std::string data = TestPattern(100000, 3);
  ViewByteSource view(data, "model.bin");
  Xxh3Source digest(&view);
  ASSERT_TRUE(digest.Read(0, 100, "header").ok());
  ASSERT_TRUE(digest.Read(50000, 10, "ahead").ok());  // not in order: not digested
  ASSERT_TRUE(digest.Read(0, 10, "header again").ok());
  ASSERT_TRUE(digest.Read(60, 40000, "overlapping").ok());
  EXPECT_EQ(digest.digested(), 40060u);
  EXPECT_EQ(digest.xxh3_64(), XXH3_64bits(data.data(), 40060));
  ASSERT_TRUE(digest.Read(40060, 59940, "rest").ok());
  EXPECT_EQ(digest.digested(), data.size());
  EXPECT_EQ(digest.xxh3_64(), XXH3_64bits(data.data(), data.size()));
  EXPECT_EQ(digest.Read(99990, 20, "tail").status().code(), absl::StatusCode::kDataLoss);
}

// A whole file, through its mapping, in chunks reported one by one.
TEST(Xxh3SourceTest, WholeFileInChunks) {
  const std::string dir = MakeTempDir();
  const std::string data = TestPattern((3 << 20) + 5, 4);
  WriteAll(dir + "/model.bin", data);
  auto file = MappedFile::Open(dir + "/model.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  auto source = ByteSourceFor(*file);
  std::vector<std::pair<uint64_t, uint64_t>> chunks;
  auto hash = Xxh3OfSource(*source, 1 << 20,
                           [&](uint64_t offset, uint64_t length) {
                             chunks.emplace_back(offset, length);
                           });
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, XXH3_64bits(data.data(), data.size()));
  EXPECT_EQ(chunks, (std::vector<std::pair<uint64_t, uint64_t>>{
                        {0, 1 << 20}, {1 << 20, 1 << 20}, {2 << 20, 1 << 20}, {3 << 20, 5}}));
}

}  // namespace
}  // namespace reshard
