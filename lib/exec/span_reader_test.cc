#include "lib/exec/span_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

std::string Pattern(size_t size) {
  std::string data(size, '\0');
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<char>((i * 13 + i / 4099) % 253);
  return data;
}

// Two sources, one read directly and one buffered, read in the ways the executor reads them.
class SpanReaderTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = MakeTempDir("spans");
    for (int f = 0; f < 2; ++f) {
      data_.push_back(Pattern(3 * kSpan + 777 + f * 5000));
      const std::string path = dir + "/s" + std::to_string(f) + ".bin";
      WriteAll(path, data_.back());
      auto file = MappedFile::Open(path);
      ASSERT_TRUE(file.ok()) << file.status();
      sources_.push_back(*std::move(file));
    }
    ASSERT_TRUE(sources_[0].EnableDirectReads()) << "the test folder's filesystem takes O_DIRECT";
  }

  void ExpectBytes(SpanReader& reader, int file, uint64_t offset, uint64_t length, uint64_t limit) {
    auto bytes = reader.Get(sources_, file, offset, length, limit);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_GE(bytes->size, length);
    ASSERT_LE(offset + bytes->size, data_[file].size());
    // Everything it hands out is right, not only what was asked for.
    EXPECT_EQ(std::memcmp(bytes->data, data_[file].data() + offset, bytes->size), 0)
        << "file " << file << " offset " << offset << " length " << length;
  }

  static constexpr uint64_t kSpan = 64 << 10;
  std::vector<std::string> data_;
  std::vector<MappedFile> sources_;
};

// Reading a file front to back in pieces: after the first span, every span was read ahead.
TEST_F(SpanReaderTest, SequentialReadsAreReadAhead) {
  SpanReader reader(kSpan);
  const uint64_t size = data_[0].size();
  for (uint64_t offset = 0; offset < size; offset += 1000) {
    ExpectBytes(reader, 0, offset, std::min<uint64_t>(1000, size - offset), size);
  }
  EXPECT_EQ(reader.reads_waited(), 1u);
  EXPECT_GE(reader.reads_ahead_used(), 3u);
}

// Output files written in turns read the strips of the same rows one after the other: a
// buffered span that another caller moved past is still there (the previous span), and a
// span read with a lead holds the strips before the one asked for.
TEST_F(SpanReaderTest, CallersTakingTurnsFindThePreviousSpanAndTheLead) {
  SpanReader reader(kSpan);
  const uint64_t size = data_[1].size();
  auto get = [&](uint64_t offset, uint64_t lead) {
    auto bytes = reader.Get(sources_, 1, offset, 100, size, nullptr, /*direct=*/false, lead);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(std::memcmp(bytes->data, data_[1].data() + offset, 100), 0) << offset;
  };
  get(1000, 0);  // span [1000, 1000 + kSpan)
  EXPECT_EQ(reader.reads_waited(), 1u);
  get(kSpan + 2000, 0);  // the next one
  EXPECT_EQ(reader.reads_waited(), 2u);
  get(5000, 0);  // back in the previous span: no read
  get(kSpan + 900, 0);
  EXPECT_EQ(reader.reads_waited(), 2u);
  get(3 * kSpan, 500);  // a third span, from 500 bytes before
  EXPECT_EQ(reader.reads_waited(), 3u);
  get(3 * kSpan - 400, 0);  // inside the lead
  get(kSpan + 3000, 0);     // the span before it is still there
  EXPECT_EQ(reader.reads_waited(), 3u);
  get(100, 0);  // two spans back: read again
  EXPECT_EQ(reader.reads_waited(), 4u);
}

// Files written in turns over a source read directly: the span after the current one is read
// ahead, and the previous one still serves the files that come back to it (a third buffer); a
// short run of another file goes to the side buffer and pushes no span out.
TEST_F(SpanReaderTest, FilesInTurnsKeepThePreviousSpanWhileReadingAhead) {
  SpanReader reader(kSpan);
  reader.set_files_in_turns(true);
  const uint64_t size = data_[0].size();
  const SpanReader::Run none;
  auto get = [&](int file, uint64_t offset, uint64_t limit) {
    auto bytes = reader.Get(sources_, file, offset, 100, limit, &none, /*direct=*/true);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(std::memcmp(bytes->data, data_[file].data() + offset, 100), 0) << offset;
  };
  get(0, 0, size);      // span 0, the next one read ahead
  get(0, kSpan, size);  // from the read ahead; the next one read ahead
  EXPECT_EQ(reader.reads_waited(), 1u);
  EXPECT_GE(reader.reads_ahead_used(), 1u);
  get(0, 1000, size);  // the previous span, kept while the third buffer was read into
  EXPECT_EQ(reader.reads_waited(), 1u);
  get(1, 5000, 5000 + 3000);  // a short run of the other file: the side buffer
  EXPECT_EQ(reader.reads_waited(), 2u);
  get(0, 2000, size);        // the previous span is still there
  get(0, kSpan + 10, size);  // and the current one
  EXPECT_EQ(reader.reads_waited(), 2u);
}

// Jumps between files and back, pieces that straddle spans, runs up to the file's end, and a
// `limit` shorter than a span: every byte right, whatever was read ahead.
TEST_F(SpanReaderTest, RandomReadsReturnTheBytes) {
  SpanReader reader(kSpan);
  std::mt19937_64 random(7);
  for (int i = 0; i < 2000; ++i) {
    const int file = static_cast<int>(random() % 2);
    const uint64_t size = data_[file].size();
    const uint64_t offset = random() % size;
    const uint64_t length = 1 + random() % std::min<uint64_t>(kSpan, size - offset);
    const uint64_t limit = offset + length + random() % (2 * kSpan);
    ExpectBytes(reader, file, offset, length, std::min(limit, size));
  }
}

// A ZeRO-3 parameter: one run in each rank's file, the runs of the next parameter following
// them in the same files. Told the run that follows, the reader reads each next run while the
// current one is copied: one read waited for in all, none read for nothing.
TEST_F(SpanReaderTest, GatheredRunsAreReadAheadAcrossFiles) {
  ASSERT_TRUE(sources_[1].EnableDirectReads());
  SpanReader reader(kSpan);
  // (file, begin, end) in the order they are copied.
  const uint64_t half = 3 * kSpan / 2 + 40;
  const std::vector<SpanReader::Run> runs = {
      {0, 0, half}, {1, 0, half}, {0, half, 3 * kSpan}, {1, half, 3 * kSpan}};
  for (size_t r = 0; r < runs.size(); ++r) {
    const SpanReader::Run next = r + 1 < runs.size() ? runs[r + 1] : SpanReader::Run{};
    for (uint64_t offset = runs[r].offset; offset < runs[r].limit; offset += 4) {
      auto bytes = reader.Get(sources_, runs[r].file, offset, 4, runs[r].limit, &next);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      ASSERT_GE(bytes->size, 4u);
      ASSERT_EQ(std::memcmp(bytes->data, data_[runs[r].file].data() + offset, 4), 0)
          << "run " << r << " offset " << offset;
      offset += (std::min(bytes->size, runs[r].limit - offset) - 4) & ~uint64_t{3};
    }
  }
  EXPECT_EQ(reader.reads_waited(), 1u);
  EXPECT_EQ(reader.reads_ahead_unused(), 0u);
  EXPECT_GE(reader.reads_ahead_used(), 7u);
}

// Hints that are wrong (another file, another offset, past the end) cost reads, never bytes.
TEST_F(SpanReaderTest, WrongHintsReturnTheBytes) {
  ASSERT_TRUE(sources_[1].EnableDirectReads());
  SpanReader reader(kSpan);
  std::mt19937_64 random(11);
  for (int i = 0; i < 2000; ++i) {
    const int file = static_cast<int>(random() % 2);
    const uint64_t size = data_[file].size();
    const uint64_t offset = random() % size;
    const uint64_t length = 1 + random() % std::min<uint64_t>(kSpan, size - offset);
    const uint64_t limit = std::min(size, offset + length + random() % (2 * kSpan));
    const int next_file = static_cast<int>(random() % 3) - 1;  // -1: nothing follows
    const uint64_t next_offset = random() % (size + 100);
    const SpanReader::Run next{next_file, next_offset, next_offset + random() % (2 * kSpan)};
    auto bytes = reader.Get(sources_, file, offset, length, limit, &next);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_GE(bytes->size, length);
    ASSERT_LE(offset + bytes->size, size);
    EXPECT_EQ(std::memcmp(bytes->data, data_[file].data() + offset, bytes->size), 0);
  }
}

// A file truncated underneath: DataLoss naming it, from the read ahead as from the worker's.
TEST_F(SpanReaderTest, TruncatedSourceIsDataLoss) {
  SpanReader reader(kSpan);
  ExpectBytes(reader, 0, 0, 100, data_[0].size());  // reads the second span ahead
  const std::string path = sources_[0].path();
  ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  auto past = reader.Get(sources_, 0, 2 * kSpan, 100, data_[0].size());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kDataLoss) << past.status();
  EXPECT_NE(past.status().message().find(path), std::string::npos);
}

// One remote source: `data` as an object of a memory store of its own (scheme `scheme`), read
// by range requests as s3:// is.
class SpanReaderRemoteTest : public testing::Test {
 protected:
  void OpenRemote(const std::string& scheme, const std::string& data) {
    store_ = new kvstore::MemoryDriver(scheme);  // registered drivers are never destroyed
    kvstore::RegisterDriver(store_);
    const std::string url = scheme + "://b/f";
    store_->Put(url, data);
    auto file = MappedFile::Open(url);
    ASSERT_TRUE(file.ok()) << file.status();
    sources_.push_back(*std::move(file));
  }

  kvstore::MemoryDriver* store_ = nullptr;
  std::vector<MappedFile> sources_;
};

// A remote source is read in whole spans: short runs that follow each other in the file come
// with the first one's request, and the span after them is read ahead while they are used.
TEST_F(SpanReaderRemoteTest, ShortRunsShareWholeSpans) {
  constexpr uint64_t kSpan = 64 << 10;
  const std::string data = Pattern(3 * kSpan);
  ASSERT_NO_FATAL_FAILURE(OpenRemote("mem", data));
  SpanReader reader(kSpan);
  // Runs of 100 bytes (a layer norm's weights), each followed by the next.
  for (uint64_t offset = 0; offset + 200 <= kSpan; offset += 100) {
    const SpanReader::Run next{0, offset + 100, offset + 200, /*dense=*/true};
    auto bytes = reader.Get(sources_, 0, offset, 4, offset + 100, &next);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_GE(bytes->size, 100u);
    EXPECT_EQ(std::memcmp(bytes->data, data.data() + offset, bytes->size), 0) << offset;
  }
  EXPECT_EQ(reader.reads_waited(), 1u);
  // Reading on from the end of the first span takes the span read ahead.
  auto ahead = reader.Get(sources_, 0, kSpan - 8, 16, 3 * kSpan);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_EQ(std::memcmp(ahead->data, data.data() + kSpan - 8, 16), 0);
  EXPECT_EQ(reader.reads_waited(), 1u);
  EXPECT_EQ(reader.reads_ahead_used(), 1u);
  // The first span and the one after it, each one request (and a third is being read ahead).
  EXPECT_GE(store_->reads(), 2);
  EXPECT_LE(store_->reads(), 3);
}

// A torch.save archive read from a remote store: each tensor is a zip record, and the next
// record's bytes start after a data descriptor and a local header (128 bytes here, as torch
// writes them). Read record after record, each told the next, the records share whole spans
// as the runs of a safetensors file do: one request per span, each span read ahead, not one
// request per record.
TEST_F(SpanReaderRemoteTest, RecordsSeparatedByZipHeadersShareWholeSpans) {
  constexpr uint64_t kSpan = 64 << 10;
  constexpr uint64_t kRecord = 3000;
  constexpr uint64_t kHeaders = 128;
  const std::string data = Pattern(3 * kSpan);
  ASSERT_NO_FATAL_FAILURE(OpenRemote("memzip", data));
  std::vector<SpanReader::Run> records;
  for (uint64_t at = kHeaders; at + kRecord <= data.size(); at += kRecord + kHeaders) {
    records.push_back({0, at, at + kRecord, /*dense=*/true});
  }
  SpanReader reader(kSpan);
  for (size_t r = 0; r < records.size(); ++r) {
    const SpanReader::Run next = r + 1 < records.size() ? records[r + 1] : SpanReader::Run{};
    // As TensorFiller::CopyThroughSpan reads a record: what the span holds, then on from there.
    for (uint64_t offset = records[r].offset; offset < records[r].limit;) {
      auto bytes = reader.Get(sources_, 0, offset, 4, records[r].limit, &next);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      const uint64_t n = std::min(bytes->size, records[r].limit - offset) / 4 * 4;
      ASSERT_EQ(std::memcmp(bytes->data, data.data() + offset, n), 0) << "record " << r;
      offset += n;
    }
  }
  EXPECT_EQ(reader.reads_waited(), 1u);
  EXPECT_EQ(reader.reads_ahead_unused(), 0u);
  // Spans of kSpan from the first record on, each read ahead from one direct-read block
  // (overlap()) before the end of the one before, the last up to the end of the file.
  const uint64_t step = kSpan - reader.overlap();
  const uint64_t first = records.front().offset;
  const std::vector<std::pair<uint64_t, uint64_t>> expected = {
      {first, kSpan},
      {first + step, kSpan},
      {first + 2 * step, kSpan},
      {first + 3 * step, data.size() - (first + 3 * step)}};
  EXPECT_EQ(store_->ranges(), expected);
}

}  // namespace
}  // namespace reshard
