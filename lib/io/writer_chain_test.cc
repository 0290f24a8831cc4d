#include "lib/io/writer_chain.h"

#include <xxhash.h>
#include <zlib.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/io/directory.h"
#include "lib/io/io_mode.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

uint32_t ZlibCrc32(absl::string_view bytes) {
  return static_cast<uint32_t>(
      ::crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

std::string Hex8(uint32_t value) { return absl::StrCat(absl::Hex(value, absl::kZeroPad8)); }

// A zip-like stream: "H" + record A + its 8-byte trailer (A's CRC-32 in hex) + record B + a
// trailer of both: the trailers are produced when the stream reaches them.
struct Framed {
  std::string record_a = TestPattern(10000, 1);
  std::string record_b = TestPattern(777, 2);
  ByteRange a{1, 10000};
  ByteRange trailer_a{10001, 8};
  ByteRange b{10009, 777};
  ByteRange trailer_b{10786, 16};
  uint64_t size = 10802;

  // What the file must hold.
  std::string Expected() const {
    return absl::StrCat("H", record_a, Hex8(ZlibCrc32(record_a)), record_b,
                        Hex8(ZlibCrc32(record_a)), Hex8(ZlibCrc32(record_b)));
  }
  // What the filling side writes: the trailers are placeholders.
  std::string Placeholders() const {
    return absl::StrCat("H", record_a, std::string(8, '?'), record_b, std::string(16, '?'));
  }
  WriterChainSpec Spec(const std::string& name) const {
    WriterChainSpec spec;
    spec.name = name;
    spec.size = size;
    spec.crc32_ranges = {b, a};  // indexed as the framing likes, in any order
    spec.deferred = {trailer_a, trailer_b};
    spec.produce = [](size_t range, const std::vector<uint32_t>& crcs)
        -> absl::StatusOr<std::string> {
      if (range == 0) return Hex8(crcs[1]);
      return absl::StrCat(Hex8(crcs[1]), Hex8(crcs[0]));
    };
    return spec;
  }
};

// Collects what it is given.
class StringWriter final : public ByteWriter {
 public:
  explicit StringWriter(std::string* out) : out_(out) {}
  absl::Status Write(absl::string_view data) override {
    out_->append(data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status Close() override { return absl::OkStatus(); }
  uint64_t pos() const override { return out_->size(); }

 private:
  std::string* out_;
};

// Written in pieces of every size from 1 to 4097 bytes (the deferred ranges and the CRC-32
// ranges cut across Writes), the stream comes out with its trailers produced from the CRC-32s
// of the records before them, and the digests of the bytes as written.
TEST(WriterChainTest, DeferredBytesCarryTheCrcOfTheRangesBefore) {
  const Framed framed;
  const std::string expected = framed.Expected();
  const std::string input = framed.Placeholders();
  ASSERT_EQ(expected.size(), framed.size);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{8}, size_t{4096}, size_t{4097}}) {
    std::string out;
    auto chain = WriterChain::To(std::make_unique<StringWriter>(&out), framed.Spec("framed.bin"));
    ASSERT_TRUE(chain.ok()) << chain.status();
    for (size_t at = 0; at < input.size(); at += piece) {
      ASSERT_TRUE((*chain)->front().Write(absl::string_view(input).substr(at, piece)).ok());
    }
    ASSERT_TRUE((*chain)->Close().ok());
    EXPECT_EQ(out, expected) << "in pieces of " << piece;
    EXPECT_EQ((*chain)->crc32s(),
              (std::vector<uint32_t>{ZlibCrc32(framed.record_b), ZlibCrc32(framed.record_a)}));
    EXPECT_EQ((*chain)->xxh3_64(), XXH3_64bits(expected.data(), expected.size()));
  }
}

// The CRC-32s and the XXH3 computed in one pass, a piece of Crc32Writer::kPieceBytes at a
// time: streams one byte short of a piece, a piece, a byte more and a few pieces, written in
// Writes of one byte, of a piece less 3, of a piece and a half and whole, with CRC-32 ranges
// that start, end and cross pieces and Writes, give zlib's CRC-32s and XXH3_64bits of the
// bytes, which pass unchanged.
TEST(WriterChainTest, Crc32AndXxh3InOnePassMatchTheReferences) {
  constexpr uint64_t kPiece = Crc32Writer::kPieceBytes;
  for (uint64_t size : {kPiece - 1, kPiece, kPiece + 1, 3 * kPiece + 17}) {
    const std::string bytes = TestPattern(size, 5);
    // The rest of the stream from a byte before the first piece's end, the first byte, the
    // bytes between, and nothing at the piece's end.
    const std::vector<ByteRange> ranges = {
        {kPiece - 1, size - (kPiece - 1)}, {0, 1}, {1, kPiece - 2}, {kPiece, 0}};
    for (uint64_t write : {uint64_t{1}, kPiece - 3, kPiece + kPiece / 2, size}) {
      if (write == 1 && size > kPiece + 1) continue;  // byte by byte: the short streams suffice
      std::string out;
      WriterChainSpec spec;
      spec.name = "digests.bin";
      spec.size = size;
      spec.crc32_ranges = ranges;
      auto chain = WriterChain::To(std::make_unique<StringWriter>(&out), std::move(spec));
      ASSERT_TRUE(chain.ok()) << chain.status();
      for (uint64_t at = 0; at < size; at += write) {
        ASSERT_TRUE((*chain)->front().Write(absl::string_view(bytes).substr(at, write)).ok());
      }
      ASSERT_TRUE((*chain)->Close().ok());
      SCOPED_TRACE(absl::StrCat("size ", size, " in Writes of ", write));
      EXPECT_EQ(out, bytes);
      EXPECT_EQ((*chain)->xxh3_64(), XXH3_64bits(bytes.data(), bytes.size()));
      std::vector<uint32_t> expected;
      for (const ByteRange& range : ranges) {
        expected.push_back(range.length == 0 ? 0u
                                             : ZlibCrc32(bytes.substr(range.offset, range.length)));
      }
      EXPECT_EQ((*chain)->crc32s(), expected);
    }
  }
}

// To a local file, buffered or direct where the filesystem takes it: the same bytes, committed
// under the final name by Close.
TEST(WriterChainTest, ToFileCommitsTheFramedBytes) {
  const Framed framed;
  for (IoMode io : {IoMode::kBuffered, IoMode::kAuto}) {
    const std::string dir = MakeTempDir();
    auto opened = Directory::Open(dir);
    ASSERT_TRUE(opened.ok()) << opened.status();
    auto chain = WriterChain::ToFile(*opened, io, framed.Spec("model.bin"));
    ASSERT_TRUE(chain.ok()) << chain.status();
    ASSERT_TRUE((*chain)->front().Write(framed.Placeholders()).ok());
    ASSERT_TRUE((*chain)->Close().ok());
    EXPECT_EQ(ReadAll(dir + "/model.bin"), framed.Expected());
    if (io == IoMode::kBuffered) {
      EXPECT_FALSE((*chain)->direct());
    }
  }
}

// Produced bytes of the wrong length are a bug named with the file and the byte offset, and
// the file never gets its final name.
TEST(WriterChainTest, DeferredBytesOfTheWrongSizeAreInternal) {
  const Framed framed;
  const std::string dir = MakeTempDir();
  auto opened = Directory::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  WriterChainSpec spec = framed.Spec("model.bin");
  spec.produce = [](size_t, const std::vector<uint32_t>&) -> absl::StatusOr<std::string> {
    return std::string("short");
  };
  {
    auto chain = WriterChain::ToFile(*opened, IoMode::kBuffered, std::move(spec));
    ASSERT_TRUE(chain.ok()) << chain.status();
    const absl::Status status = (*chain)->front().Write(framed.Placeholders());
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
    EXPECT_EQ(status.message(),
              "model.bin: the deferred bytes at byte offset 10001 are 5 bytes, the framing "
              "promised 8");
  }
  EXPECT_EQ(opened->List()->size(), 0u) << "a partial or final file was left";
}

TEST(WriterChainTest, OverlappingCrcRangesAreRefused) {
  std::string out;
  WriterChainSpec spec;
  spec.name = "x.bin";
  spec.size = 100;
  spec.crc32_ranges = {{0, 50}, {40, 20}};
  auto chain = WriterChain::To(std::make_unique<StringWriter>(&out), std::move(spec));
  EXPECT_EQ(chain.status().code(), absl::StatusCode::kInvalidArgument) << chain.status();
}

// A chain asked for nothing but the size passes the bytes as given and digests nothing.
TEST(WriterChainTest, OnlyTheStagesAskedFor) {
  std::string out;
  WriterChainSpec spec;
  spec.name = "plain.bin";
  spec.size = 5;
  spec.xxh3_64 = false;
  auto chain = WriterChain::To(std::make_unique<StringWriter>(&out), std::move(spec));
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_TRUE((*chain)->front().Write("hello").ok());
  EXPECT_EQ((*chain)->front().Write("!").code(), absl::StatusCode::kInternal);
  ASSERT_TRUE((*chain)->Close().ok());
  EXPECT_EQ(out, "hello");
  EXPECT_EQ((*chain)->xxh3_64(), 0u);
  EXPECT_TRUE((*chain)->crc32s().empty());
}

}  // namespace
}  // namespace reshard
