#include "lib/exec/tensor_filler.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/exec/span_reader.h"
#include "lib/io/mapped_file.h"
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

  std::vector<MappedFile> sources_;
  TensorCopy copy_;
  uint64_t input_bytes_ = 0;
};

// Windows of a few rows: each chunk takes its turn in every window. Every element is right, and
// the chunks are read about once in all, not a span per chunk per window (a DCP consolidation
// read 3x its input when each chunk's span read ahead of the window and was evicted by the
// next chunk's).
TEST_F(TensorFillerTest, ChunksTakingTurnsAreReadOnce) {
  for (int64_t window : {int64_t{7 * kChunks * kChunkCols}, int64_t{2 * kChunks * kChunkCols + 13},
                         int64_t{40 * kChunks * kChunkCols}}) {
    SCOPED_TRACE("window " + std::to_string(window));
    SpanReader spans(64 << 10);
    TensorFiller filler(copy_, sources_, nullptr, &spans);
    std::vector<float> out(static_cast<size_t>(copy_.num_elements));
    for (int64_t begin = 0; begin < copy_.num_elements; begin += window) {
      const int64_t end = std::min(copy_.num_elements, begin + window);
      ASSERT_TRUE(filler.Fill(begin, end, reinterpret_cast<std::byte*>(out.data() + begin)).ok());
      filler.ReleaseConsumed();
    }
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < kChunks * kChunkCols; ++c) {
        ASSERT_EQ(out[r * kChunks * kChunkCols + c], Value(r, c)) << r << ", " << c;
      }
    }
    // Windows that cut rows cost some reads again (12% at 2 rows and 13 elements).
    EXPECT_LE(spans.bytes_read(), input_bytes_ + input_bytes_ / 4);
    EXPECT_EQ(filler.bytes_read(), input_bytes_);
  }
}

}  // namespace
}  // namespace reshard
