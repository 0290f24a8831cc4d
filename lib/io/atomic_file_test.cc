#include "lib/io/atomic_file.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/io/io_mode.h"
#include "lib/io/page_buffer.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

Directory OpenDir(const std::string& path) {
  auto dir = Directory::Open(path);
  EXPECT_TRUE(dir.ok()) << dir.status();
  return dir.ok() ? *std::move(dir) : Directory();
}

TEST(AtomicFileTest, CommitPublishesContent) {
  const std::string dir = MakeTempDir();
  auto file = AtomicFile::Create(OpenDir(dir), "out.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string final_path = dir + "/out.bin";
  EXPECT_EQ(file->final_path(), final_path);
  ASSERT_TRUE(file->Append("hello ").ok());
  ASSERT_TRUE(file->Append(std::string("wor\0ld", 6)).ok());
  EXPECT_EQ(file->bytes_written(), 12u);
  EXPECT_FALSE(Exists(final_path)) << "final file visible before Commit";
  EXPECT_TRUE(Exists(final_path + ".partial"));
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_TRUE(Exists(final_path));
  EXPECT_FALSE(Exists(final_path + ".partial"));
  EXPECT_EQ(ReadAll(final_path), std::string("hello wor\0ld", 12));
  // A committed file is closed.
  EXPECT_EQ(file->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(file->Commit().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AtomicFileTest, UncommittedFileIsRemoved) {
  const std::string dir = MakeTempDir();
  {
    auto file = AtomicFile::Create(OpenDir(dir), "gone.bin");
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(file->Append("partial data").ok());
    EXPECT_TRUE(Exists(dir + "/gone.bin.partial"));
  }
  EXPECT_FALSE(Exists(dir + "/gone.bin.partial"));
  EXPECT_FALSE(Exists(dir + "/gone.bin"));
}

TEST(AtomicFileTest, MoveTransfersOwnership) {
  const std::string dir = MakeTempDir();
  auto created = AtomicFile::Create(OpenDir(dir), "moved.bin");
  ASSERT_TRUE(created.ok());
  AtomicFile a = *std::move(created);
  ASSERT_TRUE(a.Append("abc").ok());
  AtomicFile b = std::move(a);
  EXPECT_TRUE(Exists(dir + "/moved.bin.partial"));  // the moved-from object must not delete it
  ASSERT_TRUE(b.Append("def").ok());
  ASSERT_TRUE(b.Commit().ok());
  EXPECT_EQ(ReadAll(dir + "/moved.bin"), "abcdef");
}

TEST(AtomicFileTest, EmptyCommit) {
  const std::string dir = MakeTempDir();
  auto file = AtomicFile::Create(OpenDir(dir), "empty.bin");
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_TRUE(Exists(dir + "/empty.bin"));
  EXPECT_EQ(ReadAll(dir + "/empty.bin"), "");
}

TEST(AtomicFileTest, RejectsBadNamesAndExistingPartial) {
  const std::string dir = MakeTempDir();
  for (const char* name : {"", "/a", "a/", "a/../b", ".", ".."}) {
    EXPECT_EQ(AtomicFile::Create(OpenDir(dir), name).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  auto first = AtomicFile::Create(OpenDir(dir), "same.bin");
  ASSERT_TRUE(first.ok());
  // Exclusive creation: a second writer of the same name fails instead of clobbering.
  EXPECT_FALSE(AtomicFile::Create(OpenDir(dir), "same.bin").ok());
  EXPECT_EQ(Directory::Open(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(AtomicFileTest, NestedNamesAreWrittenInTheirSubfolders) {
  const std::string dir = MakeTempDir();
  auto file = AtomicFile::Create(OpenDir(dir), "zero/w.weight/fp32.pt");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->final_path(), dir + "/zero/w.weight/fp32.pt");
  EXPECT_TRUE(Exists(dir + "/zero/w.weight/fp32.pt.partial"));
  ASSERT_TRUE(file->Append("x").ok());
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_EQ(ReadAll(dir + "/zero/w.weight/fp32.pt"), "x");
  EXPECT_FALSE(Exists(dir + "/zero/w.weight/fp32.pt.partial"));
}

TEST(AtomicFileTest, WriteFileAtomically) {
  const std::string dir = MakeTempDir();
  ASSERT_TRUE(WriteFileAtomically(OpenDir(dir), "index.json", "{}\n").ok());
  EXPECT_EQ(ReadAll(dir + "/index.json"), "{}\n");
  EXPECT_FALSE(Exists(dir + "/index.json.partial"));
}

// The file lands in the folder it was created in, through the handle, even when the folder's
// path is swapped for a symlink to another folder before the commit.
TEST(AtomicFileTest, CommitsIntoTheFolderNotThePath) {
  const std::string root = MakeTempDir();
  const std::string outside = MakeTempDir();
  ASSERT_EQ(::mkdir((root + "/out").c_str(), 0755), 0);
  auto file = AtomicFile::Create(OpenDir(root + "/out"), "data.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->Append("payload").ok());
  ASSERT_EQ(::rename((root + "/out").c_str(), (root + "/moved").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), (root + "/out").c_str()), 0);
  ASSERT_TRUE(file->Commit().ok());
  EXPECT_EQ(ReadAll(root + "/moved/data.bin"), "payload");
  EXPECT_FALSE(Exists(outside + "/data.bin"));
  EXPECT_FALSE(Exists(outside + "/data.bin.partial"));
}

// Bytes 0, 1, 2, ... with a period that is no power of two, so a block written at the wrong
// offset shows.
std::string Pattern(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>((i * 7 + i / 4093) % 251);
  return data;
}

// Writes `data` through an AtomicFile in `io` mode, cut into the pieces `cuts` lists (lengths;
// the rest in one piece), each piece appended from a page-aligned copy when `aligned_pieces`,
// else from an odd address. Returns the committed file's path.
std::string WriteInPieces(IoMode io, const std::string& data, const std::vector<size_t>& cuts,
                          bool aligned_pieces, bool* direct) {
  const std::string dir = MakeTempDir("direct");
  auto file = AtomicFile::Create(OpenDir(dir), "out.bin", io);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return "";
  PageBuffer scratch(data.size() + 2 * AtomicFile::kDirectAlignment);
  size_t offset = 0;
  auto append = [&](size_t length) {
    char* at = scratch.data() + (aligned_pieces ? 0 : 1);
    std::memcpy(at, data.data() + offset, length);
    EXPECT_TRUE(file->Append(absl::string_view(at, length)).ok());
    offset += length;
  };
  for (size_t cut : cuts) append(std::min(cut, data.size() - offset));
  append(data.size() - offset);
  EXPECT_EQ(file->bytes_written(), data.size());
  *direct = file->direct();
  EXPECT_TRUE(file->Commit().ok());
  return dir + "/out.bin";
}

// Every way a stream reaches the file (whole aligned blocks, an unaligned header before them,
// odd addresses, a tail shorter than a block, more than the stage holds) leaves exactly the
// bytes appended, with the exact size, in every mode.
TEST(AtomicFileTest, DirectAndBufferedWritesKeepEveryByte) {
  const size_t block = AtomicFile::kDirectAlignment;
  const std::vector<std::vector<size_t>> cuttings = {
      {},                               // one piece, unaligned tail
      {1 << 20, 1 << 20},               // whole windows, then the tail
      {123, 1 << 20, 5000},             // a header first: everything staged
      {block, 3 * block, 77, 2 << 20},  // aligned, then a stage longer than it holds
      {1, 1, 1, block - 3, block},      // tiny pieces that fill a block exactly
  };
  for (const size_t size : {size_t{0}, size_t{1}, block, 3 * block + 333, size_t{5u << 20} + 777}) {
    const std::string data = Pattern(size);
    for (IoMode io : {IoMode::kAuto, IoMode::kDirect, IoMode::kBuffered}) {
      for (bool aligned : {true, false}) {
        for (const auto& cuts : cuttings) {
          SCOPED_TRACE(testing::Message() << "size " << size << " io " << IoModeName(io)
                                          << " aligned " << aligned << " cuts " << cuts.size());
          bool direct = false;
          const std::string path = WriteInPieces(io, data, cuts, aligned, &direct);
          EXPECT_EQ(direct, io != IoMode::kBuffered) << "the test folder's filesystem takes "
                                                        "O_DIRECT (ext4, xfs)";
          EXPECT_TRUE(ReadAll(path) == data) << "content differs";
        }
      }
    }
  }
}

// A window cut by bytes written on their own (a writer chain's produced zip descriptor): the
// window's bytes before the cut, the produced bytes, then the rest of the window from its own
// address. Every byte lands where appended.
TEST(AtomicFileTest, DirectWindowCutByProducedBytesKeepsEveryByte) {
  const size_t window = 3 << 20;
  const std::string data = Pattern(window + 16);
  for (const size_t cut : {size_t{100}, size_t{4096}, size_t{(1 << 20) + 5}}) {
    SCOPED_TRACE(testing::Message() << "cut at " << cut);
    const std::string dir = MakeTempDir("direct");
    auto file = AtomicFile::Create(OpenDir(dir), "out.bin", IoMode::kDirect);
    ASSERT_TRUE(file.ok()) << file.status();
    PageBuffer buffer(window + 16);
    std::memcpy(buffer.data(), data.data(), data.size());
    ASSERT_TRUE(file->Append(absl::string_view(buffer.data(), cut)).ok());
    const std::string produced = data.substr(cut, 16);
    ASSERT_TRUE(file->Append(produced).ok());
    ASSERT_TRUE(file->Append(absl::string_view(buffer.data() + cut + 16, window - cut)).ok());
    EXPECT_TRUE(file->direct());
    ASSERT_TRUE(file->Commit().ok());
    EXPECT_TRUE(ReadAll(dir + "/out.bin") == data) << "content differs";
  }
}

// Written with kAuto, neither a direct file nor a buffered one stays in the page cache; with
// kBuffered it does (what the mode is for).
TEST(AtomicFileTest, AutoLeavesNothingInThePageCache) {
  const std::string data = Pattern((8u << 20) + 100);
  bool direct = false;
  const std::string auto_path = WriteInPieces(IoMode::kAuto, data, {1 << 20}, true, &direct);
  ASSERT_TRUE(direct);
  EXPECT_LE(CachedPages(auto_path), 1) << "direct writes left pages in the page cache";
  const std::string buffered_path =
      WriteInPieces(IoMode::kBuffered, data, {1 << 20}, true, &direct);
  EXPECT_GT(CachedPages(buffered_path), 1024) << "buffered writes are expected to stay cached";
}

}  // namespace
}  // namespace reshard
