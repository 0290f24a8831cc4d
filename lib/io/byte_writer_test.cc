#include "lib/io/byte_writer.h"

#include <xxhash.h>
#include <zlib.h>

#include <string>

#include "gtest/gtest.h"
#include "lib/io/directory.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

AtomicFileWriter NewFile(const std::string& dir, const std::string& name) {
  auto opened = Directory::Open(dir);
  EXPECT_TRUE(opened.ok()) << opened.status();
  auto file = AtomicFile::Create(*opened, name);
  EXPECT_TRUE(file.ok()) << file.status();
  return AtomicFileWriter(*std::move(file));
}

TEST(ByteWriterTest, ChainDigestsChecksSizeAndCommits) {
  const std::string dir = MakeTempDir();
  AtomicFileWriter file = NewFile(dir, "out.bin");
  Xxh3Writer digest(&file);
  ExactSizeWriter exact(&digest, 11, "out.bin");
  ASSERT_TRUE(exact.Write("hello ").ok());
  ASSERT_TRUE(exact.Write("world").ok());
  EXPECT_EQ(exact.pos(), 11u);
  EXPECT_EQ(ReadAll(dir + "/out.bin.partial"), "hello world");
  ASSERT_TRUE(exact.Close().ok());
  EXPECT_EQ(ReadAll(dir + "/out.bin"), "hello world");
  EXPECT_EQ(digest.xxh3_64(), XXH3_64bits("hello world", 11));
  EXPECT_EQ(exact.Write("x").code(), absl::StatusCode::kInternal);  // past the size
}

// Each range's CRC-32 covers its bytes only, across Writes; a range not reached yet is 0.
TEST(ByteWriterTest, Crc32OfEachRange) {
  const std::string dir = MakeTempDir();
  AtomicFileWriter file = NewFile(dir, "zip.bin");
  auto crc = Crc32Writer::Create(&file, {{6, 6}, {0, 5}, {12, 0}, {20, 4}});
  ASSERT_TRUE(crc.ok()) << crc.status();
  ASSERT_TRUE((*crc)->Write("first se").ok());
  ASSERT_TRUE((*crc)->Write("cond").ok());
  auto zlib = [](absl::string_view s) {
    return static_cast<uint32_t>(
        ::crc32(0, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
  };
  EXPECT_EQ((*crc)->crc32s(), (std::vector<uint32_t>{zlib("second"), zlib("first"), 0, 0}));
  ASSERT_TRUE((*crc)->Close().ok());
  EXPECT_EQ(ReadAll(dir + "/zip.bin"), "first second");
}

// A stream short of, or past, its planned size never reaches its final name.
TEST(ByteWriterTest, WrongSizeNeverCommits) {
  const std::string dir = MakeTempDir();
  {
    AtomicFileWriter file = NewFile(dir, "short.bin");
    ExactSizeWriter exact(&file, 10, "short.bin");
    ASSERT_TRUE(exact.Write("12345").ok());
    absl::Status closed = exact.Close();
    EXPECT_EQ(closed.code(), absl::StatusCode::kInternal) << closed;
    EXPECT_NE(closed.message().find("short.bin"), absl::string_view::npos) << closed;
  }
  {
    AtomicFileWriter file = NewFile(dir, "long.bin");
    ExactSizeWriter exact(&file, 4, "long.bin");
    EXPECT_EQ(exact.Write("12345").code(), absl::StatusCode::kInternal);
  }
  EXPECT_EQ(Directory::Open(dir)->List()->size(), 0u) << "a partial or final file was left";
}

}  // namespace
}  // namespace reshard
