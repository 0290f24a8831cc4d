// Tests of ByteSource: views of a buffer, and range reads that load only what is asked for,
// prefetched in few reads (neighbours merged, far ranges apart), within the memory limit.

#include "lib/io/byte_source.h"

#include <string>
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

// A RangeReadSource over `bytes` that records its reads.
struct Counted {
  explicit Counted(std::string data, RangeReadSource::Options options = {})
      : bytes(std::move(data)),
        source(
            "s3://b/k", bytes.size(),
            [this](uint64_t offset, absl::Span<char> out) {
              absl::MutexLock lock(&mu);
              reads.emplace_back(offset, out.size());
              if (fail) return absl::UnavailableError("503 SlowDown");
              bytes.copy(out.data(), out.size(), offset);
              return absl::OkStatus();
            },
            options) {}
  std::string bytes;
  absl::Mutex mu;
  bool fail = false;
  std::vector<std::pair<uint64_t, uint64_t>> reads;
  RangeReadSource source;
};

TEST(ViewByteSourceTest, SlicesAndRefusesPastTheEnd) {
  const std::string bytes = TestPattern(100);
  ViewByteSource source(bytes, "/m.pt");
  EXPECT_EQ(source.size(), 100u);
  EXPECT_EQ(*source.Read(10, 5, "x"), bytes.substr(10, 5));
  EXPECT_EQ(source.Read(10, 5, "x")->data(), bytes.data() + 10);  // no copy
  absl::StatusOr<absl::string_view> past = source.Read(98, 3, "the header");
  ASSERT_TRUE(absl::IsDataLoss(past.status())) << past.status();
  EXPECT_THAT(past.status().message(), HasSubstr("/m.pt: the header (3 bytes at byte offset 98)"));
  EXPECT_TRUE(absl::IsDataLoss(source.Read(UINT64_MAX, 2, "x").status()));
}

TEST(RangeReadSourceTest, ReadLoadsOnceAndServesFromMemory) {
  Counted c(TestPattern(1000));
  EXPECT_EQ(*c.source.Read(100, 50, "a"), c.bytes.substr(100, 50));
  EXPECT_EQ(*c.source.Read(110, 20, "b"), c.bytes.substr(110, 20));  // inside: no read
  EXPECT_EQ(c.source.reads(), 1);
  EXPECT_EQ(*c.source.Read(140, 20, "c"), c.bytes.substr(140, 20));  // partly outside: read
  EXPECT_EQ(c.source.reads(), 2);
  EXPECT_EQ(*c.source.Read(100, 50, "a"), c.bytes.substr(100, 50));
  EXPECT_EQ(c.source.reads(), 2);
  absl::StatusOr<absl::string_view> past = c.source.Read(990, 11, "data.pkl");
  ASSERT_TRUE(absl::IsDataLoss(past.status()));
  EXPECT_THAT(past.status().message(),
              HasSubstr("s3://b/k: data.pkl (11 bytes at byte offset 990)"));
  EXPECT_EQ(c.source.reads(), 2);  // refused before any request
}

TEST(RangeReadSourceTest, PrefetchMergesNeighboursAndKeepsOnlyWhatWasAsked) {
  RangeReadSource::Options options;
  options.merge_gap = 100;
  options.max_read = 10'000;
  Counted c(TestPattern(1 << 20), options);
  // 1000 headers of 30 bytes, 64 bytes apart: one read; far ones: one read each.
  std::vector<ByteRange> ranges;
  for (uint64_t i = 0; i < 100; ++i) ranges.push_back({i * 64, 30});
  ranges.push_back({500'000, 30});
  ranges.push_back({700'000, 30});
  ranges.push_back({(1 << 20) - 10, 30});  // clipped to the end
  ASSERT_TRUE(c.source.Prefetch(ranges).ok());
  EXPECT_EQ(c.source.reads(), 4);
  for (uint64_t i = 0; i < 100; ++i) {
    EXPECT_EQ(*c.source.Read(i * 64, 30, "h"), c.bytes.substr(i * 64, 30));
  }
  EXPECT_EQ(*c.source.Read(700'000, 30, "h"), c.bytes.substr(700'000, 30));
  EXPECT_EQ(c.source.reads(), 4);
  // Prefetching what is loaded reads nothing.
  ASSERT_TRUE(c.source.Prefetch(ranges).ok());
  EXPECT_EQ(c.source.reads(), 4);
  // The gap bytes were not kept: a read between two headers goes to the file.
  ASSERT_TRUE(c.source.Read(35, 10, "gap").ok());
  EXPECT_EQ(c.source.reads(), 5);
}

TEST(SliceByteSourceTest, OffsetsAreRelativeAndPrefetchesGoToTheFile) {
  Counted c(TestPattern(10'000));
  SliceByteSource slice(c.source, 4000, 1000, "s3://b/k at byte offset 4000");
  EXPECT_EQ(slice.size(), 1000u);
  EXPECT_EQ(slice.path(), "s3://b/k at byte offset 4000");
  // Both ends of the slice in one read of the file (they are close), clipped to the slice.
  ASSERT_TRUE(slice.Prefetch({{0, 100}, {950, 100}, {2000, 10}}).ok());
  ASSERT_EQ(c.reads.size(), 1u);
  EXPECT_EQ(c.reads[0].first, 4000u);
  EXPECT_EQ(c.reads[0].first + c.reads[0].second, 5000u);
  EXPECT_EQ(*slice.Read(10, 20, "h"), c.bytes.substr(4010, 20));
  EXPECT_EQ(*slice.Read(990, 10, "end"), c.bytes.substr(4990, 10));
  EXPECT_EQ(c.source.reads(), 1);
  // Past the slice's end (not the file's): refused naming the slice, before any read.
  absl::StatusOr<absl::string_view> past = slice.Read(995, 10, "end record");
  ASSERT_TRUE(absl::IsDataLoss(past.status())) << past.status();
  EXPECT_THAT(past.status().message(),
              HasSubstr("s3://b/k at byte offset 4000: end record (10 bytes at byte offset 995)"));
  EXPECT_EQ(c.source.reads(), 1);
}

TEST(RangeReadSourceTest, PrefetchSplitsAtMaxRead) {
  RangeReadSource::Options options;
  options.merge_gap = 1 << 20;
  options.max_read = 1000;
  Counted c(TestPattern(100'000), options);
  std::vector<ByteRange> ranges;
  for (uint64_t i = 0; i < 100; ++i) ranges.push_back({i * 500, 30});
  ASSERT_TRUE(c.source.Prefetch(ranges).ok());
  EXPECT_EQ(c.source.reads(), 50);  // two headers per read of at most 1000 bytes
  for (const auto& [offset, length] : c.reads) EXPECT_LE(length, 1000u);
}

TEST(RangeReadSourceTest, LimitsTheBytesHeld) {
  RangeReadSource::Options options;
  options.max_loaded_bytes = 1000;
  Counted c(TestPattern(1 << 20), options);
  ASSERT_TRUE(c.source.Read(0, 600, "a").ok());
  absl::StatusOr<absl::string_view> more = c.source.Read(10'000, 600, "the central directory");
  ASSERT_TRUE(absl::IsResourceExhausted(more.status())) << more.status();
  EXPECT_THAT(more.status().message(), HasSubstr("s3://b/k: reading the central directory"));
  EXPECT_THAT(more.status().message(), HasSubstr("byte offset 10000"));
  EXPECT_TRUE(absl::IsResourceExhausted(c.source.Prefetch({{20'000, 600}})));
  EXPECT_EQ(c.source.reads(), 1);  // refused before reading
}

TEST(RangeReadSourceTest, ReadErrorsNameFileWhatAndRange) {
  Counted c(TestPattern(1000));
  c.fail = true;
  absl::StatusOr<absl::string_view> read = c.source.Read(64, 30, "local header of \"m/data/0\"");
  ASSERT_TRUE(absl::IsUnavailable(read.status())) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr("local header of \"m/data/0\""));
  EXPECT_THAT(read.status().message(), HasSubstr("s3://b/k: reading 30 bytes at byte offset 64"));
  EXPECT_THAT(read.status().message(), HasSubstr("503 SlowDown"));
  EXPECT_TRUE(absl::IsUnavailable(c.source.Prefetch({{0, 10}, {900, 10}})));
}

TEST(ByteSourceForTest, LocalFilesAreViewsAndRemoteOnesRangeReads) {
  auto* store = new kvstore::MemoryDriver;  // registered drivers are never destroyed
  kvstore::RegisterDriver(store);
  store->Put("mem://b/f", TestPattern(5000));
  absl::StatusOr<MappedFile> remote = MappedFile::Open("mem://b/f");
  ASSERT_TRUE(remote.ok()) << remote.status();
  std::unique_ptr<ByteSource> source = ByteSourceFor(*remote);
  const int before = store->reads();
  EXPECT_EQ(*source->Read(4000, 100, "x"), TestPattern(5000).substr(4000, 100));
  EXPECT_EQ(*source->Read(4010, 10, "x"), TestPattern(5000).substr(4010, 10));
  EXPECT_EQ(store->reads(), before + 1);

  const std::string path = MakeTempDir("byte_source") + "/local.bin";
  WriteAll(path, TestPattern(5000));
  absl::StatusOr<MappedFile> local = MappedFile::Open(path);
  ASSERT_TRUE(local.ok()) << local.status();
  std::unique_ptr<ByteSource> view = ByteSourceFor(*local);
  EXPECT_EQ(view->path(), path);
  EXPECT_EQ(view->Read(100, 10, "x")->data(), reinterpret_cast<const char*>(local->data()) + 100);
}

}  // namespace
}  // namespace reshard
