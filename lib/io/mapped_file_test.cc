#include "lib/io/mapped_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "lib/io/page_buffer.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

std::string WriteTemp(const std::string& name, const std::string& contents) {
  std::string pattern = testing::TempDir() + "/mapped_XXXXXX";
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  const std::string path = pattern + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  return path;
}

// Writes the file's dirty pages back (only clean pages can be dropped from the page cache).
void WriteBack(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

std::string Pattern(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>((i * 131 + i / 4096) & 0xff);
  return data;
}

TEST(MappedFileTest, MapsContent) {
  const std::string data = Pattern(10000);
  const std::string path = WriteTemp("a.bin", data);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), data.size());
  EXPECT_EQ(file->path(), path);
  ASSERT_NE(file->data(), nullptr);
  EXPECT_EQ(std::memcmp(file->data(), data.data(), data.size()), 0);
  // The matching expected size is accepted.
  EXPECT_TRUE(MappedFile::Open(path, 10000).ok());
}

TEST(MappedFileTest, SizeMismatchIsDataLoss) {
  const std::string path = WriteTemp("b.bin", Pattern(100));
  auto file = MappedFile::Open(path, 101);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find(path), absl::string_view::npos) << file.status();
}

TEST(MappedFileTest, MissingFileIsNotFound) {
  auto file = MappedFile::Open(testing::TempDir() + "/does/not/exist.bin");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
}

TEST(MappedFileTest, EmptyFile) {
  const std::string path = WriteTemp("empty.bin", "");
  auto file = MappedFile::Open(path, 0);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 0u);
  file->Release(0, 100);  // no-ops on an empty mapping
  file->WillNeed(0, 100);
}

TEST(MappedFileTest, ReleaseKeepsDataReadable) {
  const size_t size = 5 * 65536 + 123;
  const std::string data = Pattern(size);
  const std::string path = WriteTemp("c.bin", data);
  auto file = MappedFile::Open(path, static_cast<int64_t>(size));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(std::memcmp(file->data(), data.data(), size), 0);
  file->Release(0, size);
  file->Release(100, 70000);       // unaligned range
  file->Release(size - 10, 1000);  // runs past the end
  file->WillNeed(4096, 8192);
  EXPECT_EQ(std::memcmp(file->data(), data.data(), size), 0);
}

// Windows read through the mapping one after another, each released once read: none of the
// source's pages stays in the process's resident set. Neither the page a window shares with
// the next (its end and the next one's start fall inside it), nor those a fault maps with the
// faulting one (fault-around; the page cache's large folio, which a fault maps whole on this
// kernel, up to 2 MiB), which hold bytes of windows released before.
TEST(MappedFileTest, ReleasedWindowsLeaveNoPagesMapped) {
  const size_t size = (8 << 20) + 1000;
  const std::string data = Pattern(size);
  const std::string path = WriteTemp("windows.bin", data);
  auto file = MappedFile::Open(path, static_cast<int64_t>(size));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(MappedPages(file->data(), size), 0) << "nothing read yet";
  const size_t window = (3 << 19) + 100;  // 1.5 MiB and a bit: starts inside pages and folios
  for (size_t begin = 0; begin < size; begin += window) {
    const size_t length = std::min(window, size - begin);
    const std::byte* run = file->Run(begin, length);
    ASSERT_EQ(std::memcmp(run, data.data() + begin, length), 0) << "window at " << begin;
    file->Release(begin, length);
    EXPECT_EQ(MappedPages(file->data(), size), 0) << "after window [" << begin << ", "
                                                   << begin + length << ")";
  }
}

// The mapping starts a page past a kFaultAroundBytes boundary of the address space, so a read
// of one byte through it maps less than a 2 MiB folio of the page cache: the kernel maps such
// a folio neither with one PMD nor whole with page table entries.
TEST(MappedFileTest, OneByteReadMapsLessThanAFolio) {
  const size_t size = 32 << 20;
  const std::string data = Pattern(size);
  const std::string path = WriteTemp("folio.bin", data);
  auto file = MappedFile::Open(path, static_cast<int64_t>(size));
  ASSERT_TRUE(file.ok()) << file.status();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(file->data()) % MappedFile::kFaultAroundBytes, page);
  const size_t at = (27 << 20) + 5;  // in the middle of a 2 MiB block of the file
  EXPECT_EQ(static_cast<char>(*file->Run(at, 1)), data[at]);
  const int64_t mapped = MappedPages(file->data(), size);
  EXPECT_GT(mapped, 0);
  EXPECT_LT(mapped, static_cast<int64_t>(MappedFile::kFaultAroundBytes / page)) << mapped;
}

TEST(MappedFileTest, MoveKeepsMapping) {
  const std::string data = Pattern(5000);
  const std::string path = WriteTemp("d.bin", data);
  auto opened = MappedFile::Open(path);
  ASSERT_TRUE(opened.ok());
  MappedFile a = *std::move(opened);
  MappedFile b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  ASSERT_EQ(b.size(), data.size());
  EXPECT_EQ(std::memcmp(b.data(), data.data(), data.size()), 0);
  MappedFile c;
  c = std::move(b);
  EXPECT_EQ(std::memcmp(c.data(), data.data(), data.size()), 0);
}

// Dropped with drop_behind, the pages read leave the page cache; without, they stay; and a
// partly read page stays either way.
TEST(MappedFileTest, DropBehindEmptiesThePageCache) {
  const size_t size = 64 * 4096;
  const std::string data = Pattern(size);
  for (bool drop : {false, true}) {
    SCOPED_TRACE(drop ? "drop behind" : "keep");
    const std::string path = WriteTemp(drop ? "drop.bin" : "keep.bin", data);
    WriteBack(path);  // dirty pages cannot be dropped
    auto file = MappedFile::Open(path, static_cast<int64_t>(size));
    ASSERT_TRUE(file.ok()) << file.status();
    file->set_drop_behind(drop);
    std::string read(size, '\0');
    ASSERT_TRUE(file->ReadAt(0, size, reinterpret_cast<std::byte*>(read.data())).ok());
    ASSERT_TRUE(read == data);
    ASSERT_GT(CachedPages(path), 32);
    file->Release(0, size);
    file->DropCached(0, size);
    if (drop) {
      EXPECT_EQ(CachedPages(path), 0);
    } else {
      EXPECT_GT(CachedPages(path), 32);
    }
    EXPECT_EQ(std::memcmp(file->data(), data.data(), size), 0) << "still readable";
    file->Release(0, size);          // the memcmp mapped every page again
    file->DropCached(0, 4096 + 10);  // page 0, and page 1 only partly
    EXPECT_EQ(CachedPages(path), drop ? 63 : 64) << "only the wholly read page goes";
  }
}

// Repeated ranges (read by several boxes) are never read directly in dense-only mode, and
// their pages, with the pages they share with the bytes around them, stay in the page cache
// when the rest is dropped behind.
TEST(MappedFileTest, RepeatedRangesStayBufferedAndCached) {
  const size_t size = 64 * 4096;
  const std::string data = Pattern(size);
  const std::string path = WriteTemp("repeated.bin", data);
  WriteBack(path);
  auto file = MappedFile::Open(path, static_cast<int64_t>(size));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->EnableDirectReads()) << "the test folder's filesystem takes O_DIRECT";
  file->set_direct_reads_dense_only(true);
  // Pages 10-11 (one range ending inside page 11) and 40 (a range inside it).
  file->set_repeated_ranges({{10 * 4096, 11 * 4096 + 100}, {40 * 4096 + 8, 40 * 4096 + 16}});
  EXPECT_TRUE(file->ReadsDirectly(true, 0, 10 * 4096));
  EXPECT_FALSE(file->ReadsDirectly(true, 0, 10 * 4096 + 1));
  EXPECT_FALSE(file->ReadsDirectly(true, 11 * 4096 + 99, 12 * 4096));
  EXPECT_TRUE(file->ReadsDirectly(true, 11 * 4096 + 100, 40 * 4096 + 8));
  EXPECT_FALSE(file->ReadsDirectly(true, 40 * 4096, 41 * 4096));
  EXPECT_TRUE(file->ReadsDirectly(true, 40 * 4096 + 16, size));
  EXPECT_FALSE(file->ReadsDirectly(false, 0, 4096)) << "strips stay buffered";

  file->set_drop_behind(true);
  // Paged in again through the mapping, in single pages (writes and read(2) may fill the page
  // cache with large folios, which the kernel drops only whole).
  file->set_repeated_ranges({});
  file->DropCached(0, size);
  ASSERT_EQ(CachedPages(path), 0);
  file->set_repeated_ranges({{10 * 4096, 11 * 4096 + 100}, {40 * 4096 + 8, 40 * 4096 + 16}});
  ASSERT_EQ(std::memcmp(file->data(), data.data(), size), 0);
  file->Release(0, size);
  ASSERT_EQ(CachedPages(path), 64);
  file->DropCached(0, size);
  EXPECT_EQ(CachedPages(path), 3) << "pages 10, 11 and 40 stay";
  file->set_repeated_ranges({});
  file->DropCached(0, size);
  EXPECT_EQ(CachedPages(path), 0);
}

// Direct reads return exactly the bytes asked for, wherever they start and end relative to the
// blocks, up to a file end inside a block; past the end is DataLoss naming the file.
TEST(MappedFileTest, DirectReadsReturnTheBytesAskedFor) {
  const size_t size = 3 * 4096 + 123;
  const std::string data = Pattern(size);
  const std::string path = WriteTemp("direct.bin", data);
  {  // out of the page cache, so that what is read comes from the disk
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fsync(fd), 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  auto file = MappedFile::Open(path, static_cast<int64_t>(size));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->EnableDirectReads()) << "the test folder's filesystem takes O_DIRECT";
  ASSERT_TRUE(file->direct_reads());
  PageBuffer buffer(size + 2 * MappedFile::kDirectAlignment);
  for (uint64_t offset : {0, 1, 4095, 4096, 5000, static_cast<int>(size) - 1}) {
    for (uint64_t length : {1, 100, 4096, 8000, 20000}) {
      SCOPED_TRACE(testing::Message() << "offset " << offset << " length " << length);
      ASSERT_LE(MappedFile::DirectReadSpan(offset, length), buffer.size() + 4096);
      if (offset + length > size) {
        if (MappedFile::DirectReadSpan(offset, length) > buffer.size()) continue;
        auto past = file->ReadDirect(offset, length, reinterpret_cast<std::byte*>(buffer.data()));
        EXPECT_EQ(past.status().code(), absl::StatusCode::kDataLoss);
        EXPECT_NE(past.status().message().find(path), std::string::npos);
        continue;
      }
      auto read = file->ReadDirect(offset, length, reinterpret_cast<std::byte*>(buffer.data()));
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(std::memcmp(*read, data.data() + offset, length), 0);
    }
  }
  EXPECT_EQ(CachedPages(path), 0) << "direct reads do not fill the page cache";
}

}  // namespace
}  // namespace reshard
