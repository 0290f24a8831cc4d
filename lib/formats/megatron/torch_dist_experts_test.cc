#include "lib/formats/megatron/torch_dist_experts.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

constexpr char kFc1[] = "decoder.layers.mlp.experts.experts.linear_fc1.weight";

TEST(TorchDistExpertKeyTest, TheFourFormsAndTheirNames) {
  struct Case {
    const char* name;
    const char* experts;
    const char* rest;
    int64_t expert;
  };
  for (const Case& c : {
           Case{kFc1, "decoder.layers.mlp.experts", "linear_fc1.weight", -1},
           Case{"decoder.layers.mlp.experts.local_experts.linear_fc2.weight",
                "decoder.layers.mlp.experts", "linear_fc2.weight", -1},
           Case{"decoder.layers.3.mlp.experts.experts.linear_fc1.weight",
                "decoder.layers.3.mlp.experts", "linear_fc1.weight", -1},
           Case{"decoder.layers.mlp.experts.experts.12.linear_fc2.weight",
                "decoder.layers.mlp.experts", "linear_fc2.weight", 12},
       }) {
    const std::optional<TorchDistExpertKey> key = ParseTorchDistExpertKey(c.name);
    ASSERT_TRUE(key.has_value()) << c.name;
    EXPECT_EQ(key->experts, c.experts) << c.name;
    EXPECT_EQ(key->rest, c.rest) << c.name;
    EXPECT_EQ(key->expert, c.expert) << c.name;
  }
  // One expert's tensor already (a legacy save's name), the router, the shared experts.
  for (const char* name : {"decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight",
                           "decoder.layers.mlp.router.weight",
                           "decoder.layers.mlp.shared_experts.linear_fc1.weight"}) {
    EXPECT_FALSE(ParseTorchDistExpertKey(name).has_value()) << name;
  }
  EXPECT_EQ(
      TorchDistExpertName(
          *ParseTorchDistExpertKey("decoder.layers.3.mlp.experts.experts.linear_fc1.weight"), 6),
      "decoder.layers.3.mlp.experts.local_experts.6.linear_fc1.weight");
  EXPECT_EQ(SplitLayerStacked(kFc1),
            std::make_pair(std::string("decoder.layers."),
                           std::string("mlp.experts.experts.linear_fc1.weight")));
  EXPECT_FALSE(SplitLayerStacked("decoder.layers.3.mlp.linear_fc1.weight").has_value());
  EXPECT_EQ(WithoutLayerIndex("decoder.layers.3.mlp.experts.experts.linear_fc1.weight"),
            "decoder.layers.mlp.experts.experts.linear_fc1.weight");
}

// A layer-stacked expert key [2 layers, 4 experts, 6, 8]: one chunk per expert and TP block
// (2 blocks of 3 rows), each spanning both layers, stored by rank t + 2 x (expert / 2) at byte
// offset 1000 x expert + 100 x t.
DcpEntry StackedExperts() {
  DcpEntry entry;
  entry.fqn = kFc1;
  entry.is_tensor = true;
  entry.size = {2, 4, 6, 8};
  for (int64_t e = 0; e < 4; ++e) {
    for (int64_t t = 0; t < 2; ++t) {
      entry.chunks.push_back(Box{{0, e, 3 * t, 0}, {2, 1, 3, 8}});
      DcpStorage storage;
      storage.relative_path = absl::StrCat("__", t + 2 * (e / 2), "_0.distcp");
      storage.offset = static_cast<uint64_t>(1000 * e + 100 * t);
      entry.storage.push_back(std::move(storage));
    }
  }
  return entry;
}

absl::Status Check(DcpEntry entry) {
  DcpMetadata metadata;
  metadata.entries.push_back(std::move(entry));
  return CheckExpertChunks("/ck", metadata, "/ck/.metadata");
}

TEST(CheckExpertChunksTest, EveryExpertOnceIsAccepted) {
  EXPECT_TRUE(Check(StackedExperts()).ok());
  // One chunk per EP rank holding its 2 experts (GroupedMLP) is as good.
  DcpEntry grouped = StackedExperts();
  grouped.chunks = {Box{{0, 0, 0, 0}, {2, 2, 6, 8}}, Box{{0, 2, 0, 0}, {2, 2, 6, 8}}};
  grouped.storage.resize(2);
  EXPECT_TRUE(Check(std::move(grouped)).ok());
}

TEST(CheckExpertChunksTest, AnExpertNoChunkHoldsIsMissing) {
  DcpEntry entry = StackedExperts();
  // Expert 2's two chunks are gone.
  entry.chunks.erase(entry.chunks.begin() + 4, entry.chunks.begin() + 6);
  entry.storage.erase(entry.storage.begin() + 4, entry.storage.begin() + 6);
  EXPECT_EQ(
      Check(std::move(entry)),
      absl::DataLossError(
          "/ck/.metadata: tensor \"decoder.layers.mlp.experts.experts.linear_fc1.weight\" "
          "[2, 4, 6, 8] (experts along axis 1): expert 2 of 4 is missing: no chunk holds it; a "
          "Megatron-Core save holds every expert once, saved by its expert-parallel rank"));
}

TEST(CheckExpertChunksTest, AnExpertHalfHeldIsMissing) {
  DcpEntry entry = StackedExperts();
  // Expert 3's second TP block is gone: 2 x 3 x 8 = 48 of its 96 elements remain.
  entry.chunks.pop_back();
  entry.storage.pop_back();
  EXPECT_EQ(Check(std::move(entry)),
            absl::DataLossError(
                "/ck/.metadata: tensor \"decoder.layers.mlp.experts.experts.linear_fc1.weight\" "
                "[2, 4, 6, 8] (experts along axis 1): expert 3 of 4 is missing: its chunks hold 48 "
                "of its 96 elements; a Megatron-Core save holds every expert once, saved by its "
                "expert-parallel rank"));
}

TEST(CheckExpertChunksTest, AnExpertTwoRanksHoldIsStoredTwiceNamingBothChunks) {
  DcpEntry entry = StackedExperts();
  // EP rank 1's first chunk claims expert 1 (EP rank 0's) instead of expert 2.
  entry.chunks[4].origin[1] = 1;
  EXPECT_EQ(Check(std::move(entry)),
            absl::DataLossError(
                "/ck/.metadata: tensor \"decoder.layers.mlp.experts.experts.linear_fc1.weight\" "
                "[2, 4, 6, 8] (experts along axis 1): expert 1 of 4 is stored twice: chunk "
                "[0:2, 1:2, 0:3, 0:8] in /ck/__0_0.distcp at byte offset 1000, and chunk "
                "[0:2, 1:2, 0:3, 0:8] in /ck/__2_0.distcp at byte offset 2000; each expert of a "
                "Megatron-Core save is held by one expert-parallel rank"));
}

TEST(CheckExpertChunksTest, AChunkOutsideItsTensorNamesItsExpertsAndFile) {
  struct Case {
    size_t chunk;  // of StackedExperts(), replaced by `box`
    Box box;
    const char* refusal;  // after the tensor's description
  };
  for (const Case& c : {
           // EP rank 1's first chunk claims expert 4 of 4 instead of expert 2.
           Case{4, Box{{0, 4, 0, 0}, {2, 1, 3, 8}},
                "expert 4 of 4: chunk [0:2, 4:5, 0:3, 0:8] in /ck/__2_0.distcp at byte offset "
                "2000 lies outside the tensor along axis 1"},
           // Expert 3's second TP block holds rows 4:7 of 6.
           Case{7, Box{{0, 3, 4, 0}, {2, 1, 3, 8}},
                "expert 3 of 4: chunk [0:2, 3:4, 4:7, 0:8] in /ck/__3_0.distcp at byte offset "
                "3100 lies outside the tensor along axis 2"},
           // Chunks of another rank: one expert's, a GroupedMLP chunk of two experts, and one
           // too short to reach the expert axis.
           Case{2, Box{{0, 1, 0}, {2, 1, 3}},
                "expert 1 of 4: chunk [0:2, 1:2, 0:3] in /ck/__0_0.distcp at byte offset 1000 "
                "has 3 dimensions, the tensor 4"},
           Case{0, Box{{0, 0, 0}, {2, 2, 6}},
                "experts 0 to 1 of 4: chunk [0:2, 0:2, 0:6] in /ck/__0_0.distcp at byte offset "
                "0 has 3 dimensions, the tensor 4"},
           Case{0, Box{{0}, {2}},
                "chunk [0:2] in /ck/__0_0.distcp at byte offset 0 has 1 dimension, the tensor 4, "
                "and no expert axis"},
       }) {
    DcpEntry entry = StackedExperts();
    entry.chunks[c.chunk] = c.box;
    EXPECT_EQ(Check(std::move(entry)),
              absl::DataLossError(absl::StrCat(
                  "/ck/.metadata: tensor \"decoder.layers.mlp.experts.experts.linear_fc1.weight\" "
                  "[2, 4, 6, 8] (experts along axis 1): ",
                  c.refusal)));
  }
}

TEST(CheckExpertChunksTest, APerLayerKeyHasItsExpertsOnAxisZero) {
  DcpEntry entry;
  entry.fqn = "decoder.layers.1.mlp.experts.experts.linear_fc2.weight";
  entry.is_tensor = true;
  entry.size = {4, 8, 3};
  for (int64_t e : {0, 1, 3}) {
    entry.chunks.push_back(Box{{e, 0, 0}, {1, 8, 3}});
    entry.storage.push_back(DcpStorage{"__0_0.distcp", static_cast<uint64_t>(e), 0, {}});
  }
  EXPECT_EQ(Check(std::move(entry)),
            absl::DataLossError(
                "/ck/.metadata: tensor \"decoder.layers.1.mlp.experts.experts.linear_fc2.weight\" "
                "[4, 8, 3] (experts along axis 0): expert 2 of 4 is missing: no chunk holds it; a "
                "Megatron-Core save holds every expert once, saved by its expert-parallel rank"));
}

TEST(CheckExpertChunksTest, OtherTensorsAreLeftToTheTilingCheck) {
  // A dense key whose chunks overlap, and a singleton per-expert key (no expert axis).
  for (const char* fqn : {"decoder.layers.mlp.linear_fc1.weight",
                          "decoder.layers.mlp.experts.experts.3.linear_fc1.weight"}) {
    DcpEntry entry;
    entry.fqn = fqn;
    entry.is_tensor = true;
    entry.size = {2, 4};
    entry.chunks = {Box{{0, 0}, {2, 4}}, Box{{0, 0}, {2, 4}}};
    entry.storage.resize(2);
    EXPECT_TRUE(Check(std::move(entry)).ok()) << fqn;
  }
}

}  // namespace
}  // namespace reshard
