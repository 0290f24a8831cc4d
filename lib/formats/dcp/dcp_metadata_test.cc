// Tests of the DCP `.metadata` reader on hand-written protocol-4 pickles shaped as torch writes
// them (dataclasses as NEWOBJ + BUILD, TensorProperties' 5-tuple state, torch.Size REDUCEs),
// and of the chunk tiling check on synthetic boxes.

#include "lib/formats/dcp/dcp_metadata.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "lib/formats/dcp/dcp_fixture.h"

namespace reshard {
namespace {

using namespace dcp_testing;  // NOLINT: the pickle fragments

const std::vector<int64_t> kZero2 = {0, 0};
const std::vector<int64_t> kRow3 = {3, 0};

// "model.w" (5x4 bf16, rows 0-2 in __0_0, 3-4 in __1_0) and "step" (a value in __0_0).
std::string TwoRankMetadata(const std::string& properties = Properties("bfloat16")) {
  const std::string sdm = Dict({
      {Str("model.w"),
       TensorMd(properties, {5, 4}, {Chunk({0, 0}, {3, 4}), Chunk({3, 0}, {2, 4})})},
      {Str("step"), Object(kMd, "BytesStorageMetadata")},
  });
  // Index hints swapped on purpose: chunks are matched by (fqn, offsets) only.
  const std::string storage = Dict({
      {Index("step", nullptr, -1), Info("__0_0.distcp", 0, 100)},
      {Index("model.w", &kRow3, 0), Info("__1_0.distcp", 0, 300)},
      {Index("model.w", &kZero2, 1), Info("__0_0.distcp", 100, 400)},
  });
  const std::string planner = Dict({
      {Str("model.w"), Tuple({Str("model"), Str("w")})},
      {Str("step"), Tuple({Str("step")})},
  });
  return Metadata(sdm, storage, planner);
}

TEST(ParseDcpMetadataTest, TensorsValuesStorageAndPaths) {
  absl::StatusOr<DcpMetadata> md = ParseDcpMetadata(TwoRankMetadata(), "ckpt/.metadata");
  ASSERT_TRUE(md.ok()) << md.status();
  ASSERT_EQ(md->entries.size(), 2u);
  EXPECT_TRUE(md->has_planner_data);
  EXPECT_EQ(md->chunk_count, 2);
  const DcpEntry& w = md->entries[0];
  EXPECT_EQ(w.fqn, "model.w");
  EXPECT_TRUE(w.is_tensor);
  EXPECT_EQ(w.dtype, DType::kBF16);
  EXPECT_EQ(w.size, (Shape{5, 4}));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[1], (Box{{3, 0}, {2, 4}}));
  ASSERT_EQ(w.storage.size(), 2u);
  EXPECT_EQ(w.storage[0].relative_path, "__0_0.distcp");
  EXPECT_EQ(w.storage[0].offset, 100u);
  EXPECT_EQ(w.storage[0].length, 400u);
  EXPECT_EQ(w.storage[1].relative_path, "__1_0.distcp");
  ASSERT_EQ(w.path.size(), 2u);
  EXPECT_EQ(w.path[0].key, "model");
  EXPECT_EQ(w.path[1].key, "w");
  const DcpEntry& step = md->entries[1];
  EXPECT_FALSE(step.is_tensor);
  ASSERT_EQ(step.storage.size(), 1u);
  EXPECT_EQ(step.storage[0].length, 100u);
  EXPECT_TRUE(CheckChunkTiling(w.size, w.chunks).ok());
}

TEST(ParseDcpMetadataTest, NewModulePathAndFieldDictProperties) {
  EXPECT_TRUE(ParseDcpMetadata(TwoRankMetadata(Properties("float16", kMd)), "m").ok());
  // Anything following the documented field names: a dtype field instead of the 5-tuple.
  const std::string fields =
      Object(kMd, "TensorProperties", Dict({{Str("dtype"), Global("torch", "int64")}}));
  absl::StatusOr<DcpMetadata> md = ParseDcpMetadata(TwoRankMetadata(fields), "m");
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_EQ(md->entries[0].dtype, DType::kI64);
}

TEST(ParseDcpMetadataTest, ZeroDimTensorAndTransforms) {
  const std::vector<int64_t> none = {};
  const std::string sdm = Dict({{Str("s"), TensorMd(Properties("float32"), {}, {Chunk({}, {})})}});
  const std::string storage =
      Dict({{Index("s", &none, 0), Info("__0_0.distcp", 0, 9, List({Str("stream.zstd/1")}))}});
  absl::StatusOr<DcpMetadata> md = ParseDcpMetadata(Metadata(sdm, storage), "m");
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_FALSE(md->has_planner_data);
  EXPECT_TRUE(md->entries[0].size.empty());
  ASSERT_EQ(md->entries[0].storage[0].transforms.size(), 1u);
  EXPECT_EQ(md->entries[0].storage[0].transforms[0], "stream.zstd/1");
  EXPECT_TRUE(CheckChunkTiling(md->entries[0].size, md->entries[0].chunks).ok());
}

TEST(ParseDcpMetadataTest, ChunkWithoutStorageNamesFqnAndOffsets) {
  const std::string sdm =
      Dict({{Str("w"), TensorMd(Properties("float32"), {4}, {Chunk({0}, {4})})}});
  const std::vector<int64_t> other = {2};
  const std::string storage = Dict({{Index("w", &other, 0), Info("__0_0.distcp", 0, 9)}});
  absl::StatusOr<DcpMetadata> md = ParseDcpMetadata(Metadata(sdm, storage), "ckpt/.metadata");
  ASSERT_FALSE(md.ok());
  EXPECT_EQ(md.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(md.status().message().find("\"w\""), std::string::npos) << md.status();
  EXPECT_NE(md.status().message().find("offsets [0]"), std::string::npos) << md.status();
  EXPECT_NE(md.status().message().find("ckpt/.metadata"), std::string::npos) << md.status();
}

TEST(ParseDcpMetadataTest, Refusals) {
  // Not a Metadata at all.
  EXPECT_EQ(ParseDcpMetadata(Pickle(List({Int(1)})), "m").status().code(),
            absl::StatusCode::kDataLoss);
  // A dtype reshard does not know.
  EXPECT_EQ(ParseDcpMetadata(TwoRankMetadata(Properties("complex64")), "m").status().code(),
            absl::StatusCode::kUnimplemented);
  // Chunk rank differs from the tensor's.
  const std::vector<int64_t> zero = {0};
  std::string md =
      Metadata(Dict({{Str("w"), TensorMd(Properties("float32"), {4, 2}, {Chunk({0}, {4})})}}),
               Dict({{Index("w", &zero, 0), Info("f", 0, 1)}}));
  EXPECT_EQ(ParseDcpMetadata(md, "m").status().code(), absl::StatusCode::kDataLoss);
  // Two storage entries for one chunk (the index hint does not tell them apart).
  md = Metadata(
      Dict({{Str("w"), TensorMd(Properties("float32"), {4}, {Chunk({0}, {4})})}}),
      Dict({{Index("w", &zero, 0), Info("f", 0, 1)}, {Index("w", &zero, 1), Info("g", 0, 1)}}));
  EXPECT_EQ(ParseDcpMetadata(md, "m").status().code(), absl::StatusCode::kDataLoss);
  // Negative byte range.
  md = Metadata(Dict({{Str("w"), TensorMd(Properties("float32"), {4}, {Chunk({0}, {4})})}}),
                Dict({{Index("w", &zero, 0), Info("f", -5, 1)}}));
  EXPECT_EQ(ParseDcpMetadata(md, "m").status().code(), absl::StatusCode::kDataLoss);
  // An entry that is neither kind.
  md = Metadata(Dict({{Str("w"), Object("os", "system")}}), Dict({}));
  EXPECT_EQ(ParseDcpMetadata(md, "m").status().code(), absl::StatusCode::kDataLoss);
  // Too many chunks for the limits.
  DcpLimits limits;
  limits.max_chunks = 1;
  EXPECT_EQ(ParseDcpMetadata(TwoRankMetadata(), "m", limits).status().code(),
            absl::StatusCode::kDataLoss);
  // Truncated pickle.
  const std::string whole = TwoRankMetadata();
  EXPECT_FALSE(ParseDcpMetadata(whole.substr(0, whole.size() / 2), "m").ok());
}

TEST(ParseDcpMetadataTest, MalformedPlannerDataFallsBackToFlat) {
  const std::string sdm = Dict({{Str("step"), Object(kMd, "BytesStorageMetadata")}});
  const std::string storage = Dict({{Index("step", nullptr, -1), Info("__0_0.distcp", 0, 10)}});
  absl::StatusOr<DcpMetadata> md =
      ParseDcpMetadata(Metadata(sdm, storage, Dict({{Str("step"), Int(3)}})), "m");
  ASSERT_TRUE(md.ok()) << md.status();
  EXPECT_FALSE(md->has_planner_data);
  EXPECT_TRUE(md->entries[0].path.empty());
}

// ---- CheckChunkTiling

TEST(CheckChunkTilingTest, ExactTilings) {
  // Rows uneven (10 over 4: 3, 3, 2, 2), columns, a 2x2 grid, an empty tensor, a 0-d tensor.
  EXPECT_TRUE(CheckChunkTiling(
                  {10, 4}, {{{0, 0}, {3, 4}}, {{3, 0}, {3, 4}}, {{6, 0}, {2, 4}}, {{8, 0}, {2, 4}}})
                  .ok());
  EXPECT_TRUE(CheckChunkTiling({4, 6}, {{{0, 3}, {4, 3}}, {{0, 0}, {4, 3}}}).ok());
  EXPECT_TRUE(CheckChunkTiling(
                  {4, 4}, {{{0, 0}, {2, 2}}, {{0, 2}, {2, 2}}, {{2, 0}, {2, 2}}, {{2, 2}, {2, 2}}})
                  .ok());
  EXPECT_TRUE(CheckChunkTiling({0, 4}, {{{0, 0}, {0, 4}}}).ok());
  EXPECT_TRUE(CheckChunkTiling({}, {{{}, {}}}).ok());
  // An empty chunk next to full ones (a rank with no rows).
  EXPECT_TRUE(CheckChunkTiling({3, 2}, {{{0, 0}, {3, 2}}, {{3, 0}, {0, 2}}}).ok());
}

TEST(CheckChunkTilingTest, Gaps) {
  absl::Status status =
      CheckChunkTiling({10, 4}, {{{0, 0}, {3, 4}}, {{3, 0}, {3, 4}}, {{8, 0}, {2, 4}}});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("cover 32 of its 40 elements"), std::string::npos) << status;
  EXPECT_FALSE(CheckChunkTiling({4}, {}).ok());
  EXPECT_FALSE(CheckChunkTiling({}, {}).ok());
}

TEST(CheckChunkTilingTest, Overlaps) {
  absl::Status status = CheckChunkTiling({4, 4}, {{{0, 0}, {3, 4}}, {{2, 0}, {2, 4}}});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("chunks 0 [0:3, 0:4] and 1 [2:4, 0:4] overlap"),
            std::string::npos)
      << status;
  // Same volume as the tensor, yet one element twice and one never.
  EXPECT_FALSE(
      CheckChunkTiling({2, 2}, {{{0, 0}, {1, 2}}, {{0, 1}, {1, 1}}, {{1, 0}, {1, 1}}}).ok());
  // Two 0-d chunks.
  EXPECT_FALSE(CheckChunkTiling({}, {{{}, {}}, {{}, {}}}).ok());
  // Duplicated column chunk (sweep along columns compares neighbours only).
  EXPECT_FALSE(
      CheckChunkTiling({2, 4}, {{{0, 0}, {2, 2}}, {{0, 2}, {2, 2}}, {{0, 2}, {2, 2}}}).ok());
}

TEST(CheckChunkTilingTest, OutOfBounds) {
  absl::Status status = CheckChunkTiling({4, 4}, {{{0, 0}, {4, 4}}, {{4, 0}, {1, 4}}});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("chunk 1 [4:5, 0:4] does not lie inside"), std::string::npos)
      << status;
  // Offsets near INT64_MAX must not overflow into "inside".
  EXPECT_FALSE(CheckChunkTiling({4}, {{{INT64_MAX - 1}, {4}}}).ok());
  EXPECT_FALSE(CheckChunkTiling({4}, {{{0}, {INT64_MAX}}}).ok());
  EXPECT_FALSE(CheckChunkTiling({4, 4}, {{{0}, {4}}}).ok());  // rank differs
}

}  // namespace
}  // namespace reshard
