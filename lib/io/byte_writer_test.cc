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
  DigestingWriter digest(&file, {/*xxh3_64=*/true, /*crc32=*/true});
  ExactSizeWriter exact(&digest, 11, "out.bin");
  ASSERT_TRUE(exact.Write("hello ").ok());
  ASSERT_TRUE(exact.Write("world").ok());
  EXPECT_EQ(exact.pos(), 11u);
  EXPECT_EQ(ReadAll(dir + "/out.bin.partial"), "hello world");
  ASSERT_TRUE(exact.Close().ok());
  EXPECT_EQ(ReadAll(dir + "/out.bin"), "hello world");
  EXPECT_EQ(digest.xxh3_64(), XXH3_64bits("hello world", 11));
  EXPECT_EQ(digest.crc32(),
            static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>("hello world"), 11)));
  EXPECT_EQ(exact.Write("x").code(), absl::StatusCode::kInternal);  // past the size
}

TEST(ByteWriterTest, Crc32RestartsPerRecord) {
  const std::string dir = MakeTempDir();
  AtomicFileWriter file = NewFile(dir, "zip.bin");
  DigestingWriter digest(&file, {/*xxh3_64=*/false, /*crc32=*/true});
  ASSERT_TRUE(digest.Write("first").ok());
  digest.RestartCrc32();
  ASSERT_TRUE(digest.Write("second").ok());
  EXPECT_EQ(digest.crc32(),
            static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>("second"), 6)));
  EXPECT_EQ(digest.xxh3_64(), 0u);  // not asked for
  ASSERT_TRUE(digest.Close().ok());
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
