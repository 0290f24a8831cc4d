#include "lib/exec/testing/plan_fixture.h"

#include <cstring>

#include "gtest/gtest.h"
#include "lib/exec/dtype_convert.h"
#include "lib/plan/planner.h"
#include "lib/testing/test_files.h"

namespace reshard {

float Value(int64_t r, int64_t c) {
  const float base = static_cast<float>(r * 1000 + c) * 1.0009765625f + 0.3333f;
  return (r + c) % 7 == 3 ? -base : base;
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

std::string EncodeElement(float value, DType dtype) {
  std::string out;
  if (dtype == DType::kF32) {
    out.resize(4);
    std::memcpy(out.data(), &value, 4);
  } else {
    const uint16_t h =
        dtype == DType::kBF16 ? F32BitsToBF16Bits(Bits(value)) : F32BitsToF16Bits(Bits(value));
    out.resize(2);
    std::memcpy(out.data(), &h, 2);
  }
  return out;
}

std::string Expected(const Box& region, DType dtype) {
  std::string out;
  for (int64_t r = region.origin[0]; r < region.origin[0] + region.extent[0]; ++r) {
    for (int64_t c = region.origin[1]; c < region.origin[1] + region.extent[1]; ++c) {
      out += EncodeElement(Value(r, c), dtype);
    }
  }
  return out;
}

Fixture MakeSource(const std::string& dir, int64_t rows, int64_t cols, int64_t split) {
  Fixture fixture;
  fixture.rows = rows;
  fixture.cols = cols;
  const std::string junk_a = "JUNKJUNKJUNKJUNK";  // 16 bytes
  const std::string junk_b = "12345678";
  std::string a = junk_a, b = junk_b;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      (c < split ? a : b) += EncodeElement(Value(r, c), DType::kF32);
    }
  }
  a += "TRAILER";
  WriteAll(dir + "/a.bin", a);
  WriteAll(dir + "/b.bin", b);
  Catalog& catalog = fixture.catalog;
  catalog.format = "test";
  catalog.files.push_back({dir + "/a.bin", a.size()});
  catalog.files.push_back({dir + "/b.bin", b.size()});
  CatalogTensor tensor{"w", DType::kF32, {rows, cols}, {}};
  tensor.pieces.push_back({0, junk_a.size(), Box{{0, 0}, {rows, split}}, {split, 1}});
  tensor.pieces.push_back(
      {1, junk_b.size(), Box{{0, split}, {rows, cols - split}}, {cols - split, 1}});
  catalog.tensors.push_back(tensor);
  catalog.Reindex();
  EXPECT_TRUE(ValidateCatalog(catalog).ok()) << ValidateCatalog(catalog);
  return fixture;
}

Case MakeCase(const Fixture& fixture) {
  Case c;
  const Box full = Box::Full({fixture.rows, fixture.cols});
  const Box sub{{1, 2}, {fixture.rows - 2, fixture.cols - 5}};
  const Box tail{{1, 0}, {fixture.rows - 1, fixture.cols}};
  const Box column{{0, fixture.cols - 2}, {fixture.rows, 1}};
  c.layout.files.push_back(
      {"full.bin", {{"w", 0, full, DType::kF32}, {"w_sub", 0, sub, DType::kBF16}}, {}});
  c.layout.files.push_back(
      {"rows.bin", {{"w_rows", 0, tail, DType::kF16}, {"w_col", 0, column, DType::kF32}}, {}});
  FileFraming f0;
  f0.segments.push_back({FramingSegment::Kind::kBytes, "HEADER--", -1});
  f0.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
  f0.segments.push_back({FramingSegment::Kind::kBytes, "MID", -1});
  f0.segments.push_back({FramingSegment::Kind::kTensor, "", 1});
  f0.segments.push_back({FramingSegment::Kind::kBytes, "END", -1});
  FileFraming f1;
  f1.segments.push_back({FramingSegment::Kind::kTensor, "", 1});  // out of layout order
  f1.segments.push_back({FramingSegment::Kind::kBytes, std::string(5000, 'h'), -1});
  f1.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
  c.framings = {f0, f1};
  c.expected.push_back("HEADER--" + Expected(full, DType::kF32) + "MID" +
                       Expected(sub, DType::kBF16) + "END");
  c.expected.push_back(Expected(column, DType::kF32) + std::string(5000, 'h') +
                       Expected(tail, DType::kF16));
  return c;
}

absl::StatusOr<CopyPlan> WholeTensorPlan(const Fixture& fixture) {
  TargetLayout layout;
  layout.files.push_back(
      {"whole.bin", {{"w", 0, Box::Full({fixture.rows, fixture.cols}), DType::kF32}}, {}});
  FileFraming framing;
  framing.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
  return BuildCopyPlan(fixture.catalog, layout, {framing});
}

OneFilePerBox BoxesOfW(const std::vector<std::pair<std::string, Box>>& boxes,
                       const std::string& header) {
  OneFilePerBox files;
  for (const auto& [name, box] : boxes) {
    files.layout.files.push_back({name, {{"w", 0, box, DType::kF32}}, {}});
    FileFraming framing;
    if (!header.empty()) framing.segments.push_back({FramingSegment::Kind::kBytes, header, 0});
    framing.segments.push_back({FramingSegment::Kind::kTensor, "", 0});
    files.framings.push_back(framing);
    files.expected.push_back(header + Expected(box, DType::kF32));
  }
  return files;
}

OneFilePerBox ColumnParts(const Fixture& fixture, int parts) {
  std::vector<std::pair<std::string, Box>> boxes;
  for (int p = 0; p < parts; ++p) {
    const int64_t begin = fixture.cols * p / parts, end = fixture.cols * (p + 1) / parts;
    boxes.push_back(
        {absl::StrCat("part", p, ".bin"), Box{{0, begin}, {fixture.rows, end - begin}}});
  }
  return BoxesOfW(boxes, "HEADER");
}

}  // namespace reshard
