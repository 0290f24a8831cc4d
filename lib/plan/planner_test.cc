#include "lib/plan/planner.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace {

// A [rows, cols] F32 tensor stored as the given column ranges, each piece dense row-major in
// its own region of file 0.
Catalog ColumnPieces(int64_t rows, int64_t cols,
                     const std::vector<std::pair<int64_t, int64_t>>& column_ranges,
                     DType dtype = DType::kF32) {
  Catalog catalog;
  catalog.format = "test";
  catalog.files.push_back({"/src/a.bin", 1 << 20});
  CatalogTensor tensor{"w", dtype, {rows, cols}, {}};
  uint64_t offset = 0;
  for (const auto& [begin, end] : column_ranges) {
    const int64_t width = end - begin;
    tensor.pieces.push_back({0, offset, Box{{0, begin}, {rows, width}}, {width, 1}});
    offset += rows * width * DTypeSize(dtype);
  }
  catalog.tensors.push_back(tensor);
  catalog.Reindex();
  return catalog;
}

TargetLayout OneFile(const Catalog& catalog, Box region, DType dtype) {
  TargetLayout layout;
  layout.files.push_back({"out.bin", {{"w", 0, region, dtype}}, {}});
  return layout;
}

FileFraming HeaderAndTensor(const std::string& header = "HDR!") {
  FileFraming framing;
  framing.segments.push_back({FramingSegment::Kind::kBytes, header, -1});
  framing.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
  return framing;
}

TEST(PlannerTest, CanConvert) {
  EXPECT_TRUE(CanConvert(DType::kF32, DType::kBF16));
  EXPECT_TRUE(CanConvert(DType::kF16, DType::kBF16));
  EXPECT_TRUE(CanConvert(DType::kI32, DType::kI32));
  EXPECT_FALSE(CanConvert(DType::kF32, DType::kI32));
  EXPECT_FALSE(CanConvert(DType::kF64, DType::kF32));
  EXPECT_FALSE(CanConvert(DType::kF8E4M3, DType::kF16));
}

TEST(PlannerTest, FullContiguousTensorCollapsesTo1D) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 10}});
  auto plan = BuildCopyPlan(catalog, OneFile(catalog, Box::Full({6, 10}), DType::kF32),
                            {HeaderAndTensor()});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->files.size(), 1u);
  const FilePlan& file = plan->files[0];
  EXPECT_EQ(file.name, "out.bin");
  EXPECT_EQ(file.bytes, 4u + 240u);
  EXPECT_EQ(plan->total_bytes, 244u);
  EXPECT_EQ(plan->source_bytes_read, 240u);
  ASSERT_EQ(file.tensors.size(), 1u);
  const TensorCopy& copy = file.tensors[0];
  EXPECT_EQ(copy.num_elements, 60);
  EXPECT_EQ(copy.dst_bytes(), 240u);
  ASSERT_EQ(copy.items.size(), 1u);
  EXPECT_EQ(copy.items[0].extent, (std::vector<int64_t>{60}));
  EXPECT_EQ(copy.items[0].src_strides, (std::vector<int64_t>{1}));
  EXPECT_EQ(copy.items[0].dst_strides, (std::vector<int64_t>{1}));
  EXPECT_EQ(copy.items[0].dst_offset, 0);
  EXPECT_EQ(copy.items[0].src_offset, 0u);
  EXPECT_EQ(plan->sources.size(), 1u);
}

TEST(PlannerTest, ColumnPiecesGiveStridedItems) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 4}, {4, 10}});
  // Region rows 1..4, columns 2..8 in BF16.
  auto plan = BuildCopyPlan(catalog, OneFile(catalog, Box{{1, 2}, {4, 6}}, DType::kBF16),
                            {HeaderAndTensor()});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const TensorCopy& copy = plan->files[0].tensors[0];
  EXPECT_EQ(copy.src_dtype, DType::kF32);
  EXPECT_EQ(copy.dst_dtype, DType::kBF16);
  EXPECT_EQ(copy.num_elements, 24);
  EXPECT_EQ(plan->files[0].bytes, 4u + 48u);
  ASSERT_EQ(copy.items.size(), 2u);
  // Piece 0 (columns 0..4, width 4) contributes columns 2..4 of rows 1..5.
  const CopyItem& a = copy.items[0];
  EXPECT_EQ(a.extent, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a.src_strides, (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(a.dst_strides, (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(a.dst_offset, 0);
  EXPECT_EQ(a.src_offset, (1 * 4 + 2) * 4u);
  // Piece 1 (columns 4..10, width 6, stored after piece 0's 96 bytes).
  const CopyItem& b = copy.items[1];
  EXPECT_EQ(b.extent, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(b.src_strides, (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(b.dst_offset, 2);
  EXPECT_EQ(b.src_offset, 96u + (1 * 6 + 0) * 4u);
}

TEST(PlannerTest, OneColumnSliceHasUnitRows) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 10}});
  auto plan = BuildCopyPlan(catalog, OneFile(catalog, Box{{0, 3}, {6, 1}}, DType::kF32),
                            {HeaderAndTensor()});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const CopyItem& item = plan->files[0].tensors[0].items[0];
  // The 6 elements are contiguous in the output, strided by 10 in the source.
  EXPECT_EQ(item.extent, (std::vector<int64_t>{6}));
  EXPECT_EQ(item.src_strides, (std::vector<int64_t>{10}));
  EXPECT_EQ(item.dst_strides, (std::vector<int64_t>{1}));
  EXPECT_EQ(item.src_offset, 12u);
}

TEST(PlannerTest, HoleIsDataLoss) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 4}, {5, 10}});  // column 4 missing
  auto plan = BuildCopyPlan(catalog, OneFile(catalog, Box::Full({6, 10}), DType::kF32),
                            {HeaderAndTensor()});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(plan.status().message().find("missing"), absl::string_view::npos) << plan.status();
  EXPECT_NE(plan.status().message().find("\"w\""), absl::string_view::npos) << plan.status();
  // A region avoiding the hole plans fine.
  auto left = BuildCopyPlan(catalog, OneFile(catalog, Box{{0, 0}, {6, 4}}, DType::kF32),
                            {HeaderAndTensor()});
  EXPECT_TRUE(left.ok()) << left.status();
}

TEST(PlannerTest, OverlapIsDataLoss) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 6}, {5, 10}});  // column 5 twice
  auto plan = BuildCopyPlan(catalog, OneFile(catalog, Box::Full({6, 10}), DType::kF32),
                            {HeaderAndTensor()});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(plan.status().message().find("overlap"), absl::string_view::npos) << plan.status();
}

TEST(PlannerTest, OverlapHiddenByVolumeIsCaught) {
  // Overlap on rows plus a hole elsewhere: the volumes add up, only the overlap check sees it.
  Catalog catalog;
  catalog.files.push_back({"/src/a.bin", 1 << 20});
  CatalogTensor tensor{"w", DType::kF32, {4, 4}, {}};
  tensor.pieces.push_back({0, 0, Box{{0, 0}, {2, 4}}, {4, 1}});
  tensor.pieces.push_back({0, 0, Box{{1, 0}, {2, 4}}, {4, 1}});  // overlaps row 1, leaves row 3
  catalog.tensors.push_back(tensor);
  catalog.Reindex();
  auto plan =
      BuildCopyPlan(catalog, OneFile(catalog, Box::Full({4, 4}), DType::kF32), {HeaderAndTensor()});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(plan.status().message().find("overlap"), absl::string_view::npos) << plan.status();
}

TEST(PlannerTest, ScalarDuplicatesOverlap) {
  Catalog catalog;
  catalog.files.push_back({"/src/a.bin", 1 << 20});
  CatalogTensor tensor{"s", DType::kF32, {}, {}};
  tensor.pieces.push_back({0, 0, Box{}, {}});
  tensor.pieces.push_back({0, 4, Box{}, {}});
  catalog.tensors.push_back(tensor);
  catalog.Reindex();
  TargetLayout layout;
  layout.files.push_back({"out.bin", {{"s", 0, Box{}, DType::kF32}}, {}});
  auto plan = BuildCopyPlan(catalog, layout, {HeaderAndTensor()});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kDataLoss);
  catalog.tensors[0].pieces.pop_back();
  auto good = BuildCopyPlan(catalog, layout, {HeaderAndTensor()});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->files[0].tensors[0].num_elements, 1);
  ASSERT_EQ(good->files[0].tensors[0].items.size(), 1u);
  EXPECT_EQ(good->files[0].tensors[0].items[0].extent, (std::vector<int64_t>{1}));
}

TEST(PlannerTest, UnsupportedConversion) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 10}});
  auto plan = BuildCopyPlan(catalog, OneFile(catalog, Box::Full({6, 10}), DType::kI32),
                            {HeaderAndTensor()});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("F32"), absl::string_view::npos) << plan.status();
  EXPECT_NE(plan.status().message().find("I32"), absl::string_view::npos) << plan.status();
}

TEST(PlannerTest, FramingErrorsAreInternal) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 10}});
  TargetLayout layout = OneFile(catalog, Box::Full({6, 10}), DType::kF32);
  FileFraming omits;
  omits.segments.push_back({FramingSegment::Kind::kBytes, "header", -1});
  auto plan = BuildCopyPlan(catalog, layout, {omits});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(plan.status().message().find("out.bin"), absl::string_view::npos) << plan.status();

  FileFraming twice = HeaderAndTensor();
  twice.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
  EXPECT_EQ(BuildCopyPlan(catalog, layout, {twice}).status().code(), absl::StatusCode::kInternal);
  FileFraming out_of_range = HeaderAndTensor();
  out_of_range.segments[1].tensor = 1;
  EXPECT_EQ(BuildCopyPlan(catalog, layout, {out_of_range}).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(BuildCopyPlan(catalog, layout, {}).status().code(), absl::StatusCode::kInternal);
}

TEST(PlannerTest, RegionOutsideShapeIsInternal) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 10}});
  auto plan = BuildCopyPlan(catalog, OneFile(catalog, Box{{5, 0}, {2, 10}}, DType::kF32),
                            {HeaderAndTensor()});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInternal);
}

// A zero-filled region may reach beyond the shape: only the rows inside are copied, and the
// plan reads only those.
TEST(PlannerTest, ZeroFilledRegionCopiesOnlyWhatTheSourceHolds) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 4}, {4, 10}});
  TargetLayout layout = OneFile(catalog, Box{{4, 0}, {5, 10}}, DType::kF32);
  layout.files[0].tensors[0].zero_fill = true;
  auto plan = BuildCopyPlan(catalog, layout, {HeaderAndTensor()});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const TensorCopy& copy = plan->files[0].tensors[0];
  EXPECT_TRUE(copy.zero_fill);
  EXPECT_EQ(copy.num_elements, 50);
  int64_t copied = 0;
  for (const CopyItem& item : copy.items) {
    int64_t n = 1;
    for (int64_t e : item.extent) n *= e;
    copied += n;
    EXPECT_LT(item.dst_offset, 20);  // rows 4 and 5 are the first two of the output
  }
  EXPECT_EQ(copied, 20);
  EXPECT_EQ(plan->source_bytes_read, 20u * 4);
  EXPECT_EQ(plan->files[0].bytes, 4u + 50 * 4);
  // Wholly outside: nothing is read, all 20 elements are zeros.
  layout.files[0].tensors[0].region = Box{{6, 0}, {2, 10}};
  plan = BuildCopyPlan(catalog, layout, {HeaderAndTensor()});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->files[0].tensors[0].items.empty());
  EXPECT_TRUE(plan->files[0].tensors[0].zero_fill);
  EXPECT_EQ(plan->source_bytes_read, 0u);
  // Inside the shape, zero_fill changes nothing.
  layout.files[0].tensors[0].region = Box{{0, 0}, {6, 10}};
  plan = BuildCopyPlan(catalog, layout, {HeaderAndTensor()});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->files[0].tensors[0].zero_fill);
}

TEST(PlannerTest, PlanWholeTensor) {
  Catalog catalog = ColumnPieces(6, 10, {{0, 3}, {3, 10}});
  auto copy = PlanWholeTensor(catalog, 0, DType::kF16);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->name, "w");
  EXPECT_EQ(copy->num_elements, 60);
  EXPECT_EQ(copy->dst_dtype, DType::kF16);
  ASSERT_EQ(copy->items.size(), 2u);
  EXPECT_LT(copy->items[0].dst_offset, copy->items[1].dst_offset);  // sorted front to back
}

}  // namespace
}  // namespace reshard
