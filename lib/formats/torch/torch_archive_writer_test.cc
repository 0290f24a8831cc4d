#include "lib/formats/torch/torch_archive_writer.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/crc32.h"

namespace reshard {
namespace {

// Writes a framing front to back as the Executor does: kBytes as given, kTensor from `data`,
// kDeferred from the framing with the CRC-32 of every tensor written before.
std::string Materialize(const FileFraming& framing, const std::vector<std::string>& data) {
  std::string out;
  TensorChecksums crcs(data.size(), 0);
  for (const FramingSegment& segment : framing.segments) {
    switch (segment.kind) {
      case FramingSegment::Kind::kBytes:
        out += segment.bytes;
        break;
      case FramingSegment::Kind::kTensor:
        out += data[segment.tensor];
        crcs[segment.tensor] = Crc32(0, data[segment.tensor].data(), data[segment.tensor].size());
        break;
      case FramingSegment::Kind::kDeferred: {
        const std::string bytes = framing.deferred(segment.deferred, crcs);
        EXPECT_EQ(bytes.size(), segment.size);
        out += bytes;
        break;
      }
    }
  }
  return out;
}

std::string Floats(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string OneTensorPickle(const Shape& shape) {
  PickleWriter pickle;
  pickle.Tensor("FloatStorage", "0", NumElementsUnchecked(shape), shape, RowMajorStrides(shape));
  return pickle.Finish();
}

TEST(TorchArchiveFramerTest, ArchivesBackToBackParseFromTheirOwnFirstByte) {
  const std::vector<std::string> data = {Floats({1, 2, 3, 4, 5, 6}), Floats({-1.5f, 7})};
  TorchArchiveFramer framer;
  const uint64_t first = framer.Add("archive", OneTensorPickle({2, 3}), {0}, {24});
  const uint64_t second = framer.Add("archive", OneTensorPickle({2}), {1}, {8});
  PickleWriter value;
  value.Int(42);
  const uint64_t third = framer.Add("archive", value.Finish(), {}, {});
  const uint64_t size = framer.size();
  const FileFraming framing = framer.Finish();
  EXPECT_TRUE(framing.needs_crc32);
  const std::string file = Materialize(framing, data);
  ASSERT_EQ(file.size(), size);
  EXPECT_EQ(first, 0u);
  ASSERT_LT(second, third);

  const std::vector<std::pair<uint64_t, uint64_t>> spans = {
      {first, second - first}, {second, third - second}, {third, size - third}};
  for (size_t i = 0; i < 2; ++i) {
    const absl::string_view bytes(file.data() + spans[i].first, spans[i].second);
    auto archive = TorchArchive::Parse(bytes, "item");
    ASSERT_TRUE(archive.ok()) << archive.status();
    auto tensor = (*archive)->Tensor((*archive)->root(), "t");
    ASSERT_TRUE(tensor.ok()) << tensor.status();
    ASSERT_TRUE(tensor->has_value());
    // Storages are 64-byte aligned within the archive, as torch.save aligns on its stream.
    EXPECT_EQ((*tensor)->byte_offset % 64, 0u);
    EXPECT_EQ(bytes.substr((*tensor)->byte_offset, data[i].size()), data[i]);
    // The central directory's CRC-32s are the data's.
    const std::vector<ChecksummedRange> ranges = (*archive)->ChecksummedRanges(spans[i].first);
    ASSERT_EQ(ranges.size(), 1u);
    EXPECT_EQ(ranges[0].crc32, Crc32(0, data[i].data(), data[i].size()));
    EXPECT_EQ(ranges[0].offset, spans[i].first + (*tensor)->byte_offset);
  }
  auto value_archive =
      TorchArchive::Parse(absl::string_view(file.data() + third, size - third), "value");
  ASSERT_TRUE(value_archive.ok()) << value_archive.status();
  EXPECT_EQ(DescribePickleValue((*value_archive)->root()), "int");
}

TEST(TorchArchiveFramerTest, StorageClassesAndRefusal) {
  EXPECT_EQ(*TorchStorageClass(DType::kBF16, "w"), "BFloat16Storage");
  EXPECT_EQ(*TorchStorageClass(DType::kBool, "w"), "BoolStorage");
  EXPECT_EQ(*TorchDTypeGlobal(DType::kBF16, "w"), "bfloat16");
  EXPECT_EQ(*TorchDTypeGlobal(DType::kI8, "w"), "int8");
  const absl::Status status = TorchStorageClass(DType::kF8E4M3, "w").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("tensor \"w\""), absl::string_view::npos);
}

}  // namespace
}  // namespace reshard
