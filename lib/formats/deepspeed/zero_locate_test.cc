#include "lib/formats/deepspeed/zero_locate.h"

#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace zero_internal {
namespace {

// (file, byte offset, origin, extent) of each piece of a 1-D tensor.
using Piece = std::tuple<int, uint64_t, int64_t, int64_t>;

std::vector<Piece> Pieces(const CatalogTensor& tensor) {
  std::vector<Piece> pieces;
  for (const SourcePiece& piece : tensor.pieces) {
    pieces.emplace_back(piece.file, piece.byte_offset, piece.box.origin.at(0),
                        piece.box.extent.at(0));
  }
  return pieces;
}

// Rank r's flat group of `numel` floats at byte 64 of file r.
RankFlats OneFlat(int rank, int64_t numel) {
  RankFlats flats;
  flats.fp32.push_back(FlatTensor{rank, 64, numel});
  flats.paddings.push_back(std::nullopt);
  return flats;
}

ZeroFlats Input(const std::vector<ParamInfo>& params, const std::vector<RankFlats>& flats) {
  ZeroFlats in{static_cast<int>(flats.size()), 1, params, flats, false};
  for (size_t r = 0; r < flats.size(); ++r) {
    in.optimizer_paths.push_back("ckpt/zero_pp_rank_" + std::to_string(r) + "_optim.pt");
  }
  in.model_path = "ckpt/model.pt";
  in.model_name = "model.pt";
  in.optimizer0_name = "zero_pp_rank_0_optim.pt";
  in.dir = "ckpt";
  in.setup = "ZeRO-test";
  return in;
}

// a (3 elements) and b (2) over 2 ranks.
const std::vector<ParamInfo>& TwoParams() {
  static const auto* const params = new std::vector<ParamInfo>{{"a", {3}, 3, 0}, {"b", {2}, 2, 0}};
  return *params;
}

// ZeRO-3: each param padded to 2 x ceil(n / 2); every rank holds its slice of a, then of b.
TEST(LocateZero3Test, SlicesOfEveryParamOnEveryRank) {
  const std::vector<RankFlats> flats = {OneFlat(0, 3), OneFlat(1, 3)};
  std::vector<CatalogTensor> moments;
  auto located = LocateZero3(Input(TwoParams(), flats), moments);
  ASSERT_TRUE(located.ok()) << located.status();
  ASSERT_EQ(located->size(), 2u);
  EXPECT_EQ((*located)[0].name, "a");
  EXPECT_EQ((*located)[0].dtype, DType::kF32);
  EXPECT_EQ(Pieces((*located)[0]), (std::vector<Piece>{{0, 64, 0, 2}, {1, 64, 2, 1}}));
  EXPECT_EQ(Pieces((*located)[1]), (std::vector<Piece>{{0, 72, 0, 1}, {1, 72, 1, 1}}));
  EXPECT_TRUE(moments.empty());
}

TEST(LocateZero3Test, RanksWithOtherSubGroupsAreDataLoss) {
  const std::vector<RankFlats> flats = {OneFlat(0, 3), OneFlat(1, 4)};
  std::vector<CatalogTensor> moments;
  auto located = LocateZero3(Input(TwoParams(), flats), moments);
  EXPECT_EQ(located.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(located.status().message().find("ckpt/zero_pp_rank_1_optim.pt"),
            absl::string_view::npos)
      << located.status();
}

// ZeRO-1/2: 5 elements aligned to 8, partitions of 4: rank 0 holds a and b's first element,
// rank 1 b's second (saved unpadded: 1 element).
TEST(LocateZero12Test, OneFlatBufferCutIntoPartitions) {
  const std::vector<RankFlats> flats = {OneFlat(0, 4), OneFlat(1, 1)};
  std::vector<CatalogTensor> moments;
  auto located = LocateZero12(Input(TwoParams(), flats), moments);
  ASSERT_TRUE(located.ok()) << located.status();
  ASSERT_EQ(located->size(), 2u);
  EXPECT_EQ(Pieces((*located)[0]), (std::vector<Piece>{{0, 64, 0, 3}}));
  EXPECT_EQ(Pieces((*located)[1]), (std::vector<Piece>{{0, 76, 0, 1}, {1, 64, 1, 1}}));
}

TEST(LocateZero12Test, WrongPartitionLengthIsDataLoss) {
  const std::vector<RankFlats> flats = {OneFlat(0, 4), OneFlat(1, 2)};
  std::vector<CatalogTensor> moments;
  auto located = LocateZero12(Input(TwoParams(), flats), moments);
  EXPECT_EQ(located.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(located.status().message().find("zero_pp_rank_1"), absl::string_view::npos)
      << located.status();
}

}  // namespace
}  // namespace zero_internal
}  // namespace reshard
