#include "lib/formats/colossalai/colossalai_meta.h"

#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

Box B(std::vector<int64_t> origin, std::vector<int64_t> extent) {
  return Box{std::move(origin), std::move(extent)};
}

TEST(ColossalMetaTest, DistIdsOfFileNames) {
  EXPECT_EQ(ColossalMetaDistId("pytorch_model-meta-dist-00003.json"), 3);
  EXPECT_EQ(ColossalMetaDistId("pytorch_model-meta-dist-00012.index.json"), 12);
  EXPECT_EQ(ColossalMetaDistId("pytorch_model-meta-dist-.json"), std::nullopt);
  EXPECT_EQ(ColossalMetaDistId("pytorch_model-meta-dist-0x1.json"), std::nullopt);
  EXPECT_EQ(ColossalMetaDistId("pytorch_model.bin.index.json"), std::nullopt);
  EXPECT_EQ(ColossalMetaDistId("pytorch_model-dist-00000.bin"), std::nullopt);
}

TEST(ColossalMetaTest, ParsesWhatThePrWrites) {
  const std::string json = R"({
    "checkpoint_version": "1.0",
    "total_size": null,
    "metadata": {
        "embed.weight": {"offsets": [26, 0], "lengths": [24, 16], "global_shape": [50, 16],
                         "file": "/ckpt/pytorch_model-dist-00001.bin", "rank": 1},
        "ln.weight": {"offsets": [0], "lengths": [16], "global_shape": [16],
                      "file": "/ckpt/pytorch_model-dist-00001.bin", "rank": 1}
    }
  })";
  absl::StatusOr<ColossalMeta> meta = ParseColossalMeta(json, "m.json", 1);
  ASSERT_TRUE(meta.ok()) << meta.status();
  ASSERT_EQ(meta->params.size(), 2u);
  EXPECT_EQ(meta->params[0].name, "embed.weight");
  EXPECT_EQ(meta->params[0].box.origin, (std::vector<int64_t>{26, 0}));
  EXPECT_EQ(meta->params[0].box.extent, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(meta->params[0].global_shape, (Shape{50, 16}));
  EXPECT_EQ(meta->params[0].file, "/ckpt/pytorch_model-dist-00001.bin");
  EXPECT_EQ(meta->params[1].rank, 1);
}

TEST(ColossalMetaTest, RefusesMalformedEntries) {
  const std::vector<std::string> bad = {
      "not json",
      R"({"metadata": 3})",
      R"({"metadata": {"w": {"offsets": [0], "lengths": [2], "global_shape": [2]}}})",
      R"({"metadata": {"w": {"offsets": [0], "lengths": [2, 1], "global_shape": [2],
          "file": "f.bin"}}})",
      R"({"metadata": {"w": {"offsets": [1], "lengths": [2], "global_shape": [2],
          "file": "f.bin"}}})",
      R"({"metadata": {"w": {"offsets": [-1], "lengths": [2], "global_shape": [2],
          "file": "f.bin"}}})",
  };
  for (const std::string& json : bad) {
    absl::StatusOr<ColossalMeta> meta = ParseColossalMeta(json, "m.json", 0);
    EXPECT_EQ(meta.status().code(), absl::StatusCode::kDataLoss) << json;
    EXPECT_NE(meta.status().message().find("m.json"), std::string::npos) << meta.status();
  }
}

TEST(ColossalMetaTest, FindsTheHoleAMissingRankLeaves) {
  // Rows split over 4 ranks, rank 2 missing.
  std::optional<Box> hole =
      FindUncoveredBox({50, 16}, {B({0, 0}, {13, 16}), B({13, 0}, {13, 16}), B({39, 0}, {11, 16})});
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(BoxRanges(*hole), "[26, 39) x [0, 16)");
  // Columns, two adjacent ranks missing: one hole spanning both.
  hole = FindUncoveredBox({4, 12}, {B({0, 0}, {4, 3}), B({0, 9}, {4, 3})});
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(BoxRanges(*hole), "[0, 4) x [3, 9)");
  // A 2-d grid with one block missing.
  hole = FindUncoveredBox({4, 4}, {B({0, 0}, {2, 2}), B({0, 2}, {2, 2}), B({2, 0}, {2, 2})});
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(BoxRanges(*hole), "[2, 4) x [2, 4)");
  // A box of zero length (a rank that holds no rows) covers nothing: the hole is the rest.
  hole = FindUncoveredBox({16, 16}, {B({0, 8}, {16, 0})});
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(BoxRanges(*hole), "[0, 16) x [0, 16)");
  hole = FindUncoveredBox({16, 16}, {B({0, 0}, {16, 8}), B({0, 8}, {16, 0})});
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(BoxRanges(*hole), "[0, 16) x [8, 16)");
  // Complete tilings, overlapping ones, empty tensors, 0-d tensors.
  EXPECT_FALSE(FindUncoveredBox({4, 4}, {B({0, 0}, {2, 4}), B({2, 0}, {2, 4})}).has_value());
  EXPECT_FALSE(FindUncoveredBox({4}, {B({0}, {3}), B({1}, {3})}).has_value());
  EXPECT_FALSE(FindUncoveredBox({0, 4}, {}).has_value());
  EXPECT_FALSE(FindUncoveredBox({}, {B({}, {})}).has_value());
  hole = FindUncoveredBox({}, {});
  ASSERT_TRUE(hole.has_value());
  EXPECT_EQ(BoxRanges(*hole), "(all of it)");
}

}  // namespace
}  // namespace reshard
