#include "lib/exec/tensor_filler.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/exec/span_reader.h"
#include "lib/io/mapped_file.h"
#include "lib/io/remote_store.h"
#include "lib/io/testing/memory_store.h"
#include "lib/plan/layout.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

constexpr int64_t kRows = 1000;
constexpr int64_t kChunkCols = 100;  // 400-byte rows in each chunk
constexpr int kChunks = 4;

float Value(int64_t r, int64_t c) { return static_cast<float>(r * 10000 + c) + 0.25f; }

// A [kRows, kChunks * kChunkCols] F32 tensor stored as kChunks column chunks, each dense in its
// own file (as DCP stores the chunks of a tensor cut by columns), read with direct I/O.
class TensorFillerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    store_ = new MemoryStore;  // registered stores are never destroyed
    RegisterRemoteStore("mem", store_);
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

  static MemoryStore* store_;
  std::vector<MappedFile> sources_;
  std::vector<MappedFile> remote_sources_;
  TensorCopy copy_;
  uint64_t input_bytes_ = 0;
};
MemoryStore* TensorFillerTest::store_ = nullptr;

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
      TensorFiller filler(copy_, remote ? remote_sources_ : sources_, nullptr, &spans);
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

// Strided elements need a mapping: refused for a remote file, naming the tensor and the file,
// by CheckReadable (before anything is written) and by Fill, never read through data().
TEST_F(TensorFillerTest, RemoteStridedElementsAreRefused) {
  TensorCopy transposed = copy_;
  transposed.items.resize(1);
  transposed.items[0].extent = {kChunkCols, kRows};  // column c of the chunk is output row c
  transposed.items[0].src_strides = {1, kChunkCols};
  transposed.items[0].dst_strides = {kRows, 1};
  transposed.items[0].dst_offset = 0;
  transposed.num_elements = kRows * kChunkCols;
  transposed.zero_fill = false;
  EXPECT_TRUE(TensorFiller::CheckReadable(transposed, sources_).ok());
  absl::Status refused = TensorFiller::CheckReadable(transposed, remote_sources_);
  EXPECT_TRUE(absl::IsUnimplemented(refused)) << refused;
  EXPECT_NE(refused.message().find("\"w\""), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("mem://b/chunk0"), absl::string_view::npos) << refused;
  TensorFiller filler(transposed, remote_sources_);
  std::vector<float> out(static_cast<size_t>(transposed.num_elements));
  EXPECT_TRUE(absl::IsUnimplemented(
      filler.Fill(0, transposed.num_elements, reinterpret_cast<std::byte*>(out.data()))));
}

}  // namespace
}  // namespace reshard
