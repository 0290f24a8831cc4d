#include "lib/exec/read_analysis.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/exec/testing/plan_fixture.h"
#include "lib/plan/planner.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

TEST(ReadAnalysisTest, AnalyzeSourceReadsSeesRepeatedReads) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 57, 181, 97);
  // MakeCase reads "w" whole, and parts of it again in other boxes: both sources are read
  // more than once.
  Case c = MakeCase(fixture);
  auto repeated = BuildCopyPlan(fixture.catalog, c.layout, c.framings);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  for (const SourceReads& reads : AnalyzeSourceReads(*repeated)) {
    EXPECT_FALSE(reads.read_once);
  }
  auto once = WholeTensorPlan(fixture);
  ASSERT_TRUE(once.ok()) << once.status();
  for (const SourceReads& reads : AnalyzeSourceReads(*once)) {
    EXPECT_TRUE(reads.read_once);
    EXPECT_TRUE(reads.repeated.empty());
  }

  // Strips of rows that interleave (a split along the last dimension) are still read once.
  // The same strip read again (a replicated tensor) is a repeated range of a source that is
  // otherwise read once; a strip that overlaps another without being the same box is not.
  CopyPlan strips;
  strips.sources.push_back({"s.bin", 4 * 100});
  auto strip = [](uint64_t offset, int64_t width) {
    TensorCopy copy;
    copy.name = "t";
    copy.num_elements = 4 * width;
    copy.items.push_back({0, offset, {4, width}, {10, 1}, 0, {width, 1}});
    return copy;
  };
  strips.files.push_back({"left.bin", {}, {strip(0, 5)}, 80, nullptr, false});
  strips.files.push_back({"right.bin", {}, {strip(5 * 4, 5)}, 80, nullptr, false});
  std::vector<SourceReads> reads = AnalyzeSourceReads(strips);
  EXPECT_TRUE(reads[0].read_once);
  EXPECT_TRUE(reads[0].repeated.empty());
  strips.files.push_back({"again.bin", {}, {strip(0, 5)}, 80, nullptr, false});
  reads = AnalyzeSourceReads(strips);
  EXPECT_TRUE(reads[0].read_once);
  EXPECT_EQ(reads[0].repeated, (std::vector<std::pair<uint64_t, uint64_t>>{{0, (3 * 10 + 5) * 4}}));
  strips.files.push_back({"wider.bin", {}, {strip(0, 6)}, 96, nullptr, false});
  EXPECT_FALSE(AnalyzeSourceReads(strips)[0].read_once);
}

TEST(ReadAnalysisTest, SourcesReadDenseTellsWholeBoxesFromStrips) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 57, 181, 97);
  auto whole = WholeTensorPlan(fixture);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(SourcesReadDense(*whole), std::vector<bool>({true, true}));

  // The strips of a split along the last dimension skip bytes between their rows; a box of
  // whole rows does not.
  CopyPlan plan;
  plan.sources.push_back({"strips.bin", 4 * 100});
  plan.sources.push_back({"rows.bin", 4 * 100});
  TensorCopy strip;
  strip.name = "strip";
  strip.num_elements = 4 * 5;
  strip.items.push_back({0, 0, {4, 5}, {10, 1}, 0, {5, 1}});
  TensorCopy rows;
  rows.name = "rows";
  rows.num_elements = 4 * 10;
  rows.items.push_back({1, 40, {4, 10}, {10, 1}, 0, {10, 1}});
  plan.files.push_back({"out.bin", {}, {strip, rows}, 240, nullptr, false});
  EXPECT_EQ(SourcesReadDense(plan), std::vector<bool>({false, true}));
}

// Files with the same tensors, read in strips from the same source files, are written in turns
// by one worker (up to 8 at once); files of whole tensors each on their own.
TEST(ReadAnalysisTest, WorkUnitsGroupThePartsOfASplit) {
  const std::string src = MakeTempDir("src");
  Fixture fixture = MakeSource(src, 20, 100, 60);
  using Files = std::vector<std::vector<size_t>>;
  // Up to 8 parts in one unit, which reads their rows whole; more in units as even as can be.
  // But only parts that share a source file go together: of 10 parts of 10 columns, the first
  // six read a.bin (columns 0-59) only and the other four b.bin only, so they make two units
  // that each read their rows whole.
  const std::map<int, std::pair<Files, bool>> cases = {
      {2, {{{0, 1}}, true}},
      {4, {{{0, 1, 2, 3}}, true}},
      {8, {{{0, 1, 2, 3, 4, 5, 6, 7}}, true}},
      {10, {{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9}}, true}},
      {17, {{{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9, 10}, {11, 12, 13, 14, 15, 16}}, false}},
  };
  for (const auto& [parts, expected] : cases) {
    SCOPED_TRACE(absl::StrCat(parts, " parts"));
    const OneFilePerBox files_of_parts = ColumnParts(fixture, parts);
    auto plan = BuildCopyPlan(fixture.catalog, files_of_parts.layout, files_of_parts.framings);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<WorkUnit> units = WorkUnits(*plan);
    Files files;
    for (const WorkUnit& unit : units) {
      files.push_back(unit.files);
      EXPECT_EQ(unit.whole_rows, expected.second);
    }
    EXPECT_EQ(files, expected.first);
  }
  auto whole = WholeTensorPlan(fixture);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::vector<WorkUnit> units = WorkUnits(*whole);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].files, std::vector<size_t>{0});
  EXPECT_FALSE(units[0].whole_rows);
}

}  // namespace
}  // namespace reshard
