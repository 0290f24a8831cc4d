#include "lib/exec/tensor_filler.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/core/status.h"
#include "lib/exec/span_reader.h"
#include "lib/io/crc32.h"
#include "lib/io/crc32_source.h"
#include "lib/io/mapped_file.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/plan/layout.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 1000;
constexpr int64_t kChunkCols = 100;  // 400-byte rows in each chunk
constexpr int kChunks = 4;

float Value(int64_t r, int64_t c) { return static_cast<float>(r * 10000 + c) + 0.25f; }

// A [kRows, kChunks * kChunkCols] F32 tensor stored as kChunks column chunks, each dense in its
// own file (as DCP stores the chunks of a tensor cut by columns), read with direct I/O.
class TensorFillerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    store_ = new kvstore::MemoryDriver;  // registered drivers are never destroyed
    kvstore::RegisterDriver(store_);
  }

  void SetUp() override {
    const std::string dir = MakeTempDir("filler");
    copy_.name = "w";
    copy_.num_elements = kRows * kChunks * kChunkCols;
    for (int p = 0; p < kChunks; ++p) {
      std::string data;
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t c = 0; c < kChunkCols; ++c) {
          const float v = Value(r, p * kChunkCols + c);
          data.append(reinterpret_cast<const char*>(&v), 4);
        }
      }
      const std::string path = dir + "/chunk" + std::to_string(p);
      WriteAll(path, data);
      // The same chunk as a remote file.
      const std::string url = "mem://b/chunk" + std::to_string(p);
      store_->Put(url, data);
      auto remote = MappedFile::Open(url);
      ASSERT_TRUE(remote.ok()) << remote.status();
      remote_sources_.push_back(*std::move(remote));
      auto file = MappedFile::Open(path);
      ASSERT_TRUE(file.ok()) << file.status();
      sources_.push_back(*std::move(file));
      ASSERT_TRUE(sources_.back().EnableDirectReads()) << "the test folder takes O_DIRECT";
      CopyItem item;
      item.src_file = p;
      item.src_offset = 0;
      item.extent = {kRows, kChunkCols};
      item.src_strides = {kChunkCols, 1};
      item.dst_offset = p * kChunkCols;
      item.dst_strides = {kChunks * kChunkCols, 1};
      copy_.items.push_back(item);
      input_bytes_ += data.size();
    }
  }

  // Fills the whole tensor in windows of `window` elements; the elements, or the first error.
  static absl::StatusOr<std::vector<float>> FillAll(TensorFiller& filler, int64_t count,
                                                    int64_t window) {
    std::vector<float> out(static_cast<size_t>(count));
    for (int64_t begin = 0; begin < count; begin += window) {
      const int64_t end = std::min(count, begin + window);
      absl::Status status =
          filler.Fill(begin, end, reinterpret_cast<std::byte*>(out.data() + begin));
      if (!status.ok()) return status;
      filler.ReleaseConsumed();
    }
    return out;
  }

  void ExpectValues(const std::vector<float>& out) {
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kChunks * kChunkCols; ++c) {
        ASSERT_EQ(out[r * kChunks * kChunkCols + c], Value(r, c)) << r << ", " << c;
      }
    }
  }

  static kvstore::MemoryDriver* store_;
  std::vector<MappedFile> sources_;
  std::vector<MappedFile> remote_sources_;
  TensorCopy copy_;
  uint64_t input_bytes_ = 0;
};
kvstore::MemoryDriver* TensorFillerTest::store_ = nullptr;

// Windows of a few rows: each chunk takes its turn in every window. Every element is right, and
// the chunks are read about once in all, not a span per chunk per window (a DCP consolidation
// read 3x its input when each chunk's span read ahead of the window and was evicted by the
// next chunk's). From remote files too: runs that take turns are not read in whole spans,
// which would be read again for every window.
TEST_F(TensorFillerTest, ChunksTakingTurnsAreReadOnce) {
  for (const bool remote : {false, true}) {
    for (int64_t window :
         {int64_t{7 * kChunks * kChunkCols}, int64_t{2 * kChunks * kChunkCols + 13},
          int64_t{40 * kChunks * kChunkCols}}) {
      SCOPED_TRACE(absl::StrCat(remote ? "remote" : "local", ", window ", window));
      SpanReader spans(64 << 10);
      TensorFiller filler(copy_, remote ? remote_sources_ : sources_, &spans);
      absl::StatusOr<std::vector<float>> out = FillAll(filler, copy_.num_elements, window);
      ASSERT_TRUE(out.ok()) << out.status();
      ExpectValues(*out);
      // Windows that cut rows cost some reads again (12% at 2 rows and 13 elements).
      EXPECT_LE(spans.bytes_read(), input_bytes_ + input_bytes_ / 4);
      EXPECT_EQ(filler.bytes_read(), input_bytes_);
    }
  }
}

// Without a SpanReader (verify, the terms of a mean), converted runs of a remote file are read
// into a scratch buffer: the same values as from the local files.
TEST_F(TensorFillerTest, RemoteConvertedWithoutSpans) {
  copy_.dst_dtype = DType::kBF16;
  TensorFiller local(copy_, sources_);
  TensorFiller remote(copy_, remote_sources_);
  const int64_t window = 7 * kChunks * kChunkCols;
  std::vector<uint16_t> a(static_cast<size_t>(copy_.num_elements));
  std::vector<uint16_t> b(a.size());
  for (int64_t begin = 0; begin < copy_.num_elements; begin += window) {
    const int64_t end = std::min(copy_.num_elements, begin + window);
    ASSERT_TRUE(local.Fill(begin, end, reinterpret_cast<std::byte*>(a.data() + begin)).ok());
    absl::Status status = remote.Fill(begin, end, reinterpret_cast<std::byte*>(b.data() + begin));
    ASSERT_TRUE(status.ok()) << status;
  }
  EXPECT_EQ(a, b);
}

// Fills all `copy` from `sources` in windows of `window` elements through a SpanReader, as
// the executor does; the output bytes, or the first error. `staged` gets the filler's
// staged_bytes().
absl::StatusOr<std::string> FillBytes(const TensorCopy& copy,
                                      const std::vector<MappedFile>& sources, int64_t window,
                                      uint64_t* staged = nullptr) {
  SpanReader spans(1 << 20);
  TensorFiller filler(copy, sources, &spans);
  const size_t element_size = DTypeSize(copy.dst_dtype);
  std::string out(static_cast<size_t>(copy.num_elements) * element_size, '\0');
  for (int64_t begin = 0; begin < copy.num_elements; begin += window) {
    const int64_t end = std::min(copy.num_elements, begin + window);
    RETURN_IF_ERROR(
        filler.Fill(begin, end, reinterpret_cast<std::byte*>(&out[begin * element_size])));
    filler.ReleaseConsumed();
  }
  if (staged != nullptr) *staged = filler.staged_bytes();
  return out;
}

// Sets $TMPDIR (where scratch files go) for its lifetime.
class ScopedTmpdir {
 public:
  explicit ScopedTmpdir(const std::string& dir) {
    const char* saved = std::getenv("TMPDIR");
    if (saved != nullptr) saved_ = saved;
    had_ = saved != nullptr;
    ::setenv("TMPDIR", dir.c_str(), 1);
  }
  ~ScopedTmpdir() {
    if (had_) {
      ::setenv("TMPDIR", saved_.c_str(), 1);
    } else {
      ::unsetenv("TMPDIR");
    }
  }

 private:
  std::string saved_;
  bool had_ = false;
};

// The remote bytes the store served since `before` (kvstore::MemoryDriver::ranges) were read.
uint64_t BytesFetchedSince(const kvstore::MemoryDriver& store, size_t before) {
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = store.ranges();
  uint64_t bytes = 0;
  for (size_t i = before; i < ranges.size(); ++i) bytes += ranges[i].second;
  return bytes;
}

// Chunks stored column-major (DCP Col(4, column_major=True)): each chunk file, row-major
// [kRows, kChunkCols], is the transposed storage of a [kChunkCols, kRows] chunk of a
// [kChunkCols, kChunks * kRows] tensor cut by columns. Its elements are strided in the source,
// and the chunks take turns in every window. From the remote files they are gathered from
// local copies in memory (1.6 MB in all): the same bytes as from the local files, F32 and
// BF16 (the same rounding code), and every byte of each chunk fetched exactly once.
TEST_F(TensorFillerTest, RemoteStridedChunksInMemoryAsLocal) {
  TensorCopy transposed;
  transposed.name = "w";
  transposed.num_elements = kRows * kChunks * kChunkCols;
  for (int p = 0; p < kChunks; ++p) {
    CopyItem item = copy_.items[p];
    item.extent = {kChunkCols, kRows};  // column c of the chunk is output row c
    item.src_strides = {1, kChunkCols};
    item.dst_offset = p * kRows;
    item.dst_strides = {kChunks * kRows, 1};
    transposed.items.push_back(item);
  }
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    transposed.dst_dtype = dtype;
    const int64_t window = 7 * kChunks * kRows + 13;
    absl::StatusOr<std::string> local = FillBytes(transposed, sources_, window);
    ASSERT_TRUE(local.ok()) << local.status();
    const size_t reads = store_->reads();
    uint64_t staged = 0;
    // In memory: no scratch folder needed.
    ScopedTmpdir tmpdir("/nonexistent/scratch");
    absl::StatusOr<std::string> remote = FillBytes(transposed, remote_sources_, window, &staged);
    ASSERT_TRUE(remote.ok()) << remote.status();
    EXPECT_TRUE(*remote == *local);
    EXPECT_EQ(staged, input_bytes_);
    EXPECT_EQ(BytesFetchedSince(*store_, reads), input_bytes_);
    if (dtype != DType::kF32) continue;
    const float* out = reinterpret_cast<const float*>(remote->data());
    for (int64_t c = 0; c < kChunkCols; ++c) {
      for (int p = 0; p < kChunks; ++p) {
        for (int64_t r = 0; r < kRows; ++r) {
          ASSERT_EQ(out[c * kChunks * kRows + p * kRows + r], Value(r, p * kChunkCols + c));
        }
      }
    }
  }
}

// A transposed piece larger than the memory for copies (TensorFiller::kStagedMemoryBytes) is
// gathered from a scratch file: the same bytes as from the local file, F32 and BF16, each byte
// of the object fetched once, in requests of at most 1 MiB. Where no scratch file can be made,
// the error names the tensor, the object and the folder.
TEST_F(TensorFillerTest, RemoteStridedBeyondMemoryInScratchFileAsLocal) {
  constexpr int64_t kBigRows = 1100;
  constexpr int64_t kBigCols = 1024;  // 4.3 MiB of F32
  std::string data;
  for (int64_t c = 0; c < kBigCols; ++c) {  // column-major
    for (int64_t r = 0; r < kBigRows; ++r) {
      const float v = Value(r, c);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  ASSERT_GT(data.size(), TensorFiller::kStagedMemoryBytes);
  const std::string dir = MakeTempDir("filler_big");
  WriteAll(dir + "/big", data);
  store_->Put("mem://b/big", data);
  std::vector<MappedFile> local_sources, remote_sources;
  for (const std::string& path : {dir + "/big", std::string("mem://b/big")}) {
    absl::StatusOr<MappedFile> file = MappedFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    (path == "mem://b/big" ? remote_sources : local_sources).push_back(*std::move(file));
  }
  TensorCopy big;
  big.name = "big.w";
  big.num_elements = kBigRows * kBigCols;
  CopyItem item;
  item.src_file = 0;
  item.extent = {kBigRows, kBigCols};
  item.src_strides = {1, kBigRows};
  item.dst_strides = {kBigCols, 1};
  big.items.push_back(item);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    big.dst_dtype = dtype;
    const int64_t window = 3 * kBigCols + 7;
    absl::StatusOr<std::string> local = FillBytes(big, local_sources, window);
    ASSERT_TRUE(local.ok()) << local.status();
    const size_t reads = store_->reads();
    uint64_t staged = 0;
    absl::StatusOr<std::string> remote = FillBytes(big, remote_sources, window, &staged);
    ASSERT_TRUE(remote.ok()) << remote.status();
    EXPECT_TRUE(*remote == *local);
    EXPECT_EQ(staged, data.size());
    EXPECT_EQ(BytesFetchedSince(*store_, reads), data.size());
    for (size_t i = reads; i < store_->ranges().size(); ++i) {
      EXPECT_LE(store_->ranges()[i].second, MappedFile::kRemotePieceBytes);
    }
    if (dtype == DType::kF32) {
      const float* out = reinterpret_cast<const float*>(remote->data());
      for (int64_t r = 0; r < kBigRows; ++r) {
        for (int64_t c = 0; c < kBigCols; ++c) ASSERT_EQ(out[r * kBigCols + c], Value(r, c));
      }
    }
  }
  // The scratch folder is $TMPDIR: missing, the piece cannot be staged.
  const std::string missing = dir + "/missing";
  ScopedTmpdir tmpdir(missing);
  absl::StatusOr<std::string> refused = FillBytes(big, remote_sources, kBigCols);
  ASSERT_TRUE(absl::IsNotFound(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("\"big.w\""));
  EXPECT_THAT(refused.status().message(), HasSubstr("mem://b/big"));
  EXPECT_THAT(refused.status().message(), HasSubstr(missing));
}

// A failed or short range read while staging names the tensor, the object and the offset.
TEST_F(TensorFillerTest, RemoteStridedReadErrorsNamed) {
  TensorCopy transposed = copy_;
  transposed.items.resize(1);
  transposed.items[0].extent = {kChunkCols, kRows};
  transposed.items[0].src_strides = {1, kChunkCols};
  transposed.items[0].dst_strides = {kRows, 1};
  transposed.items[0].dst_offset = 0;
  transposed.num_elements = kRows * kChunkCols;
  transposed.zero_fill = false;
  // A copy of chunk 0 of its own, damaged below.
  store_->Put("mem://b/broken", ReadAll(sources_[0].path()));
  std::vector<MappedFile> broken;
  absl::StatusOr<MappedFile> file = MappedFile::Open("mem://b/broken");
  ASSERT_TRUE(file.ok()) << file.status();
  broken.push_back(*std::move(file));
  // The object shrank after it was opened (another upload under its key).
  store_->Put("mem://b/broken", std::string(1000, 'x'));
  absl::StatusOr<std::string> shrunk = FillBytes(transposed, broken, kRows);
  ASSERT_FALSE(shrunk.ok());
  EXPECT_THAT(shrunk.status().message(), HasSubstr("\"w\""));
  EXPECT_THAT(shrunk.status().message(), HasSubstr("mem://b/broken at byte offset 0"));
  store_->Fail("mem://b/broken", absl::UnavailableError("connection reset"));
  absl::StatusOr<std::string> failed = FillBytes(transposed, broken, kRows);
  ASSERT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("\"w\""));
  EXPECT_THAT(failed.status().message(), HasSubstr("mem://b/broken at byte offset 0"));
}

// A ZeRO-3 parameter: a [kRanks * kRankElements] F32 tensor of which each rank's file holds
// one run, after other bytes (the parameters before it).
constexpr int kRanks = 8;
constexpr int64_t kRankElements = 600000;  // 2.4 MB each, more than kRunScratchBytes in all
constexpr uint64_t kRankLead = 4096 + 12;

// The gather, its files local and the same as remote objects "mem://b/rank<r>".
struct RankFiles {
  TensorCopy copy;
  std::vector<MappedFile> local;
  std::vector<MappedFile> remote;
};

RankFiles MakeRankFiles(kvstore::MemoryDriver& store) {
  RankFiles files;
  files.copy.name = "layers.0.w";
  files.copy.num_elements = kRanks * kRankElements;
  const std::string dir = MakeTempDir("ranks");
  for (int r = 0; r < kRanks; ++r) {
    std::string data(kRankLead + r, 'h');
    for (int64_t e = 0; e < kRankElements; ++e) {
      const float v = Value(r, e) * (e % 2 == 0 ? 1.0f : -1.0f);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
    data.append(100, 't');
    const std::string path = dir + "/rank" + std::to_string(r);
    WriteAll(path, data);
    const std::string url = "mem://b/rank" + std::to_string(r);
    store.Put(url, data);
    files.local.push_back(*MappedFile::Open(path));
    files.remote.push_back(*MappedFile::Open(url));
    CopyItem item;
    item.src_file = r;
    item.src_offset = kRankLead + r;
    item.extent = {kRankElements};
    item.src_strides = {1};
    item.dst_offset = r * kRankElements;
    item.dst_strides = {1};
    files.copy.items.push_back(item);
  }
  return files;
}

// A gather of one run per remote file (ZeRO-3) fetches each window's runs together: the
// requests overlap (up to kRemotePiecesInFlight), so a window costs a round trip or two, not
// one per run, and the bytes are those of the local conversion, in fp32 (read into the output)
// and bf16 (converted out of batches of kRunScratchBytes). Windows that cut runs too, and
// windows inside one run.
TEST_F(TensorFillerTest, RemoteGatherFetchesRunsInFlightAsLocal) {
  RankFiles files = MakeRankFiles(*store_);
  auto remote = [&files](int file) { return !files.remote[file].mapped(); };
  EXPECT_TRUE(TensorFiller::GathersRemoteRuns(files.copy, remote));
  EXPECT_FALSE(TensorFiller::GathersRemoteRuns(
      files.copy, [&files](int file) { return !files.local[file].mapped(); }));
  EXPECT_FALSE(TensorFiller::GathersRemoteRuns(copy_, remote));  // chunks cut by columns
  store_->set_read_delay(absl::Milliseconds(20));
  int max_in_flight = 0;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t window :
         {files.copy.num_elements, 3 * kRankElements + 1234, kRankElements / 3}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), ", window ", window));
      files.copy.dst_dtype = dtype;
      absl::StatusOr<std::string> local = FillBytes(files.copy, files.local, window);
      ASSERT_TRUE(local.ok()) << local.status();
      const size_t before = store_->ranges().size();
      store_->reset_max_concurrent_reads();
      absl::StatusOr<std::string> fetched = FillBytes(files.copy, files.remote, window);
      ASSERT_TRUE(fetched.ok()) << fetched.status();
      EXPECT_TRUE(*fetched == *local);
      // Every source byte fetched once.
      const std::vector<std::pair<uint64_t, uint64_t>> ranges = store_->ranges();
      uint64_t bytes = 0;
      for (size_t i = before; i < ranges.size(); ++i) bytes += ranges[i].second;
      EXPECT_EQ(bytes, static_cast<uint64_t>(files.copy.num_elements) * 4);
      // Windows holding several runs have their requests in flight together (each is held for
      // `delay`, so requests that overlap are seen under way at once); a window inside one run
      // is one request at a time.
      if (window > kRankElements) {
        EXPECT_GT(store_->max_concurrent_reads(), 1);
        max_in_flight = std::max(max_in_flight, store_->max_concurrent_reads());
      } else {
        EXPECT_EQ(store_->max_concurrent_reads(), 1);
      }
    }
  }
  EXPECT_EQ(max_in_flight, MappedFile::kRemotePiecesInFlight);
  store_->set_read_delay(absl::ZeroDuration());
}

// A failed request of a gather names the tensor, the object and the byte offset.
TEST_F(TensorFillerTest, RemoteGatherErrorsNamed) {
  RankFiles files = MakeRankFiles(*store_);
  // Rank 5's object of its own, failing.
  store_->Put("mem://b/rank5-broken", ReadAll(files.local[5].path()));
  files.remote[5] = *MappedFile::Open("mem://b/rank5-broken");
  store_->Fail("mem://b/rank5-broken", absl::UnavailableError("connection reset"));
  absl::StatusOr<std::string> failed = FillBytes(files.copy, files.remote, files.copy.num_elements);
  ASSERT_TRUE(absl::IsUnavailable(failed.status())) << failed.status();
  EXPECT_THAT(failed.status().message(), HasSubstr("tensor \"layers.0.w\""));
  EXPECT_THAT(failed.status().message(),
              HasSubstr(absl::StrCat("mem://b/rank5-broken: reading ", kRankElements * 4,
                                     " bytes at byte offset ", kRankLead + 5)));
  EXPECT_THAT(failed.status().message(), HasSubstr("connection reset"));
}

// The memory estimate counts the scratch of a converted gather of remote runs, and only that.
TEST_F(TensorFillerTest, RemoteGatherScratchInMemoryBound) {
  RankFiles files = MakeRankFiles(*store_);
  std::vector<SourceFile> remote(kRanks);
  std::vector<SourceFile> local(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    remote[r].path = files.remote[r].path();
    local[r].path = files.local[r].path();
  }
  EXPECT_EQ(TensorFiller::StagingMemoryBound(files.copy, remote), 0u);  // into the output
  files.copy.dst_dtype = DType::kBF16;
  EXPECT_EQ(TensorFiller::StagingMemoryBound(files.copy, remote), TensorFiller::kRunScratchBytes);
  EXPECT_EQ(TensorFiller::StagingMemoryBound(files.copy, local), 0u);
}

// A Crc32Source attached to each of `files` (catalog indexed alike), as the executor does.
class Crc32Checks {
 public:
  Crc32Checks(const std::vector<SourceFile>& catalog, std::vector<MappedFile>& files)
      : files_(files) {
    for (size_t f = 0; f < files.size(); ++f) {
      stages_.push_back(std::make_unique<Crc32Source>(catalog[f].checksummed, &budget_));
      files[f].set_read_stage(stages_.back().get());
    }
  }
  ~Crc32Checks() {
    for (MappedFile& file : files_) file.set_read_stage(nullptr);
  }
  // Detaches the stages and checks every file's ranges.
  absl::Status Verify() {
    for (size_t f = 0; f < files_.size(); ++f) {
      files_[f].set_read_stage(nullptr);
      if (absl::Status status = stages_[f]->Verify(files_[f]); !status.ok()) return status;
    }
    return absl::OkStatus();
  }
  uint64_t bytes_reread() const {
    uint64_t bytes = 0;
    for (const auto& stage : stages_) bytes += stage->bytes_reread();
    return bytes;
  }

 private:
  std::vector<MappedFile>& files_;
  Crc32Source::FragmentBudget budget_{0};
  std::vector<std::unique_ptr<Crc32Source>> stages_;
};

// The runs a gather fetches feed the CRC-32 checks of the records they are in (a ZeRO-3 rank
// file is a torch.save archive): every record is checked from the bytes read, none read again,
// in fp32 and bf16, whole or in windows; a damaged byte fails Verify naming the record.
TEST_F(TensorFillerTest, RemoteGatherFeedsChecksums) {
  RankFiles files = MakeRankFiles(*store_);
  std::vector<SourceFile> catalog(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    catalog[r].path = files.remote[r].path();
    catalog[r].size = files.remote[r].size();
    const std::string bytes = ReadAll(files.local[r].path());
    const uint64_t run = static_cast<uint64_t>(kRankElements) * 4;
    catalog[r].checksummed.push_back(ChecksummedRange{
        kRankLead + r, run, Crc32(0, bytes.data() + kRankLead + r, run), "record"});
  }
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const int64_t window : {files.copy.num_elements, 3 * kRankElements + 1234}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), ", window ", window));
      files.copy.dst_dtype = dtype;
      Crc32Checks checksums(catalog, files.remote);
      TensorFiller filler(files.copy, files.remote);
      std::string out(static_cast<size_t>(files.copy.num_elements) * DTypeSize(dtype), '\0');
      for (int64_t begin = 0; begin < files.copy.num_elements; begin += window) {
        const int64_t end = std::min(files.copy.num_elements, begin + window);
        ASSERT_TRUE(
            filler.Fill(begin, end, reinterpret_cast<std::byte*>(&out[begin * DTypeSize(dtype)]))
                .ok());
      }
      const absl::Status verified = checksums.Verify();
      EXPECT_TRUE(verified.ok()) << verified;
      EXPECT_EQ(checksums.bytes_reread(), 0u);
    }
  }
  catalog[3].checksummed[0].crc32 ^= 1;  // as if a byte of rank 3's record were damaged
  Crc32Checks checksums(catalog, files.remote);
  TensorFiller filler(files.copy, files.remote);
  std::string out(static_cast<size_t>(files.copy.num_elements) * 2, '\0');
  ASSERT_TRUE(
      filler.Fill(0, files.copy.num_elements, reinterpret_cast<std::byte*>(out.data())).ok());
  const absl::Status damaged = checksums.Verify();
  EXPECT_TRUE(absl::IsDataLoss(damaged)) << damaged;
  EXPECT_THAT(damaged.message(), HasSubstr("mem://b/rank3"));
}

// Pages of `file`'s mapping this process has mapped, or -1 when the kernel does not say.
int64_t MappedPages(const MappedFile& file) {
  return reshard::MappedPages(file.data(), file.size());
}

// A transposed view (a Hugging Face Conv1D weight [in, out] of a Megatron [out, in] one) is a
// strided gather through the mapping: every window reads a column of every source row. Once
// a window is filled and released, no page of the source stays in the process's resident
// set: neither the pages at the ends of a gather block nor those the kernel mapped with the
// faulting ones (fault-around, the page cache's large folios). Left behind, they add up window
// after window (a GPT-2 export of 585 MiB held 13 MiB of source pages at its end).
TEST(TensorFillerGatherTest, TransposedViewLeavesNoSourcePagesMapped) {
  constexpr int64_t kSrcRows = 2048, kSrcCols = 1024;  // [out, in], 8 MiB of F32
  constexpr uint64_t kHeader = 100;                     // rows straddle pages
  std::string data(kHeader, 'h');
  for (int64_t r = 0; r < kSrcRows; ++r) {
    for (int64_t c = 0; c < kSrcCols; ++c) {
      const float v = static_cast<float>(r * kSrcCols + c);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  data.append(100 << 10, 't');
  const std::string path = MakeTempDir("gather") + "/w.bin";
  WriteAll(path, data);
  std::vector<MappedFile> sources;
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  sources.push_back(*std::move(file));
  TensorCopy copy;
  copy.name = "h.0.mlp.c_fc.weight";
  copy.num_elements = kSrcRows * kSrcCols;
  CopyItem item;
  item.src_file = 0;
  item.src_offset = kHeader;
  item.extent = {kSrcCols, kSrcRows};
  item.src_strides = {1, kSrcCols};
  item.dst_offset = 0;
  item.dst_strides = {kSrcRows, 1};
  copy.items.push_back(item);
  ASSERT_EQ(MappedPages(sources[0]), 0) << "nothing read yet";
  TensorFiller filler(copy, sources);
  // Windows of 300 output rows (a column range of the source that starts inside a page).
  const int64_t window = 300 * kSrcRows;
  std::vector<float> out(static_cast<size_t>(copy.num_elements));
  for (int64_t begin = 0; begin < copy.num_elements; begin += window) {
    const int64_t end = std::min(copy.num_elements, begin + window);
    ASSERT_TRUE(filler.Fill(begin, end, reinterpret_cast<std::byte*>(out.data() + begin)).ok());
    filler.ReleaseConsumed();
    EXPECT_EQ(MappedPages(sources[0]), 0) << "after elements [" << begin << ", " << end << ")";
  }
  for (int64_t c = 0; c < kSrcCols; ++c) {
    for (int64_t r = 0; r < kSrcRows; ++r) {
      ASSERT_EQ(out[c * kSrcRows + r], static_cast<float>(r * kSrcCols + c)) << c << ", " << r;
    }
  }
}

}  // namespace
}  // namespace reshard
