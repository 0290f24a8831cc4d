#include "lib/formats/fsdp/flat_param.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/fsdp/dtensor_pickle_writer.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_writer.h"

namespace reshard {
namespace {

// A flat parameter of "a" ([2, 3], 6 elements) then "b" ([5], 5 elements) over 3 ranks, as
// FSDP's FlatParamHandle shards it: 11 elements padded to 12, chunks of 4. Rank 0 holds a[0, 4);
// rank 1 a[4, 6) then b[0, 2) ("a" spans ranks 0 and 1); rank 2 b[2, 5) then 1 padding zero.
constexpr int64_t kChunk = 4;

// One parameter's slice in a rank's shard: (parameter, first, last inclusive, offset).
struct Slice {
  int param;
  int64_t first, last, offset;
};
std::vector<Slice> RankSlices(int64_t rank) {
  switch (rank) {
    case 0:
      return {{0, 0, 3, 0}};
    case 1:
      return {{0, 4, 5, 0}, {1, 0, 1, 2}};
    default:
      return {{1, 2, 4, 0}};
  }
}

// The handle of `rank` with torch >= 2.1's _shard_param_infos, or torch <= 2.0's fields.
std::string Handle(const std::vector<Slice>& slices, bool new_fields) {
  PickleWriter p;
  p.BeginDict(false);
  p.String("flat_param._fqns");
  p.BeginTuple();
  p.String("a");
  p.String("b");
  p.EndTuple();
  p.String("flat_param._shapes");
  p.BeginTuple();
  WriteTorchSize(p, {2, 3});
  WriteTorchSize(p, {5});
  p.EndTuple();
  if (new_fields) {
    p.String("flat_param._shard_param_infos");
    p.BeginTuple();
    for (int param = 0; param < 2; ++param) {
      // _ShardParamInfo: a NamedTuple, cls.__new__(cls, *fields).
      p.Global("torch.distributed.fsdp._flat_param", "_ShardParamInfo");
      p.BeginTuple();
      const Slice* found = nullptr;
      for (const Slice& s : slices) found = s.param == param ? &s : found;
      if (found == nullptr) {
        p.Bool(false);
        for (int i = 0; i < 4; ++i) p.None();
      } else {
        p.Bool(true);
        p.Int(found->offset);
        p.Int(found->last - found->first + 1);
        p.Int(found->first);
        p.Int(found->last);
      }
      p.EndTuple();
      p.NewObj();
    }
    p.EndTuple();
  } else {
    p.String("flat_param._shard_indices");
    WritePickleIntTuple(p, {slices.front().param, slices.back().param});
    p.String("flat_param._shard_param_offsets");
    p.BeginList();
    for (const Slice& s : slices) WritePickleIntTuple(p, {s.first, s.last});
    p.EndList();
  }
  p.EndDict();
  return p.Finish();
}

absl::StatusOr<std::vector<FlatParamSlice>> Parse(const std::string& pickle,
                                                  int64_t flat_numel = kChunk) {
  PickleArena arena;
  absl::StatusOr<PickleValue*> root = ParsePickle(pickle, arena, {});
  if (!root.ok()) return root.status();
  return ParseFlatParamHandle(*root, flat_numel);
}

std::string Describe(const FlatRange& r) {
  return absl::StrCat("[", r.begin, ", ", r.end, ") of rank ", r.rank);
}

// Every rank's ranges of "a" and of "b", from their parsed handles.
void Gather(bool new_fields, std::vector<FlatRange>& a, std::vector<FlatRange>& b) {
  for (int64_t rank = 0; rank < 3; ++rank) {
    absl::StatusOr<std::vector<FlatParamSlice>> slices =
        Parse(Handle(RankSlices(rank), new_fields));
    ASSERT_TRUE(slices.ok()) << slices.status();
    for (const FlatParamSlice& s : *slices) {
      (s.fqn == "a" ? a : b).push_back(FlatRange{s.begin, s.end, rank, s.offset_in_shard, 0});
    }
  }
}

TEST(ParseFlatParamHandleTest, Torch21FieldsOfTheMiddleRank) {
  absl::StatusOr<std::vector<FlatParamSlice>> slices = Parse(Handle(RankSlices(1), true));
  ASSERT_TRUE(slices.ok()) << slices.status();
  ASSERT_EQ(slices->size(), 2u);
  EXPECT_EQ((*slices)[0].fqn, "a");
  EXPECT_EQ((*slices)[0].shape, (Shape{2, 3}));
  EXPECT_EQ((*slices)[0].begin, 4);
  EXPECT_EQ((*slices)[0].end, 6);
  EXPECT_EQ((*slices)[0].offset_in_shard, 0);
  EXPECT_EQ((*slices)[1].fqn, "b");
  EXPECT_EQ((*slices)[1].begin, 0);
  EXPECT_EQ((*slices)[1].end, 2);
  EXPECT_EQ((*slices)[1].offset_in_shard, 2);
}

TEST(ParseFlatParamHandleTest, Torch20FieldsGiveTheSameSlices) {
  for (int64_t rank = 0; rank < 3; ++rank) {
    absl::StatusOr<std::vector<FlatParamSlice>> older = Parse(Handle(RankSlices(rank), false));
    absl::StatusOr<std::vector<FlatParamSlice>> newer = Parse(Handle(RankSlices(rank), true));
    ASSERT_TRUE(older.ok()) << older.status();
    ASSERT_TRUE(newer.ok()) << newer.status();
    ASSERT_EQ(older->size(), newer->size()) << "rank " << rank;
    for (size_t i = 0; i < older->size(); ++i) {
      EXPECT_EQ((*older)[i].fqn, (*newer)[i].fqn);
      EXPECT_EQ((*older)[i].begin, (*newer)[i].begin);
      EXPECT_EQ((*older)[i].end, (*newer)[i].end);
      EXPECT_EQ((*older)[i].offset_in_shard, (*newer)[i].offset_in_shard);
    }
  }
}

TEST(CheckFlatRangesTileTest, AParameterSpanningTwoRanksAndPaddingOnTheLast) {
  for (bool new_fields : {true, false}) {
    std::vector<FlatRange> a, b;
    Gather(new_fields, a, b);
    ASSERT_EQ(a.size(), 2u);  // ranks 0 and 1
    EXPECT_TRUE(CheckFlatRangesTile(a, 6, Describe).ok()) << CheckFlatRangesTile(a, 6, Describe);
    // Rank 2's shard ends with a padding element past b: never part of a range.
    ASSERT_EQ(b.size(), 2u);
    EXPECT_EQ(b.back().end, 5);
    EXPECT_TRUE(CheckFlatRangesTile(b, 5, Describe).ok()) << CheckFlatRangesTile(b, 5, Describe);
  }
}

TEST(CheckFlatRangesTileTest, ShardsThatDoNotTileAFlatParameter) {
  std::vector<FlatRange> a, b;
  Gather(true, a, b);
  a[1].begin = 5;  // rank 1 starts "a" one element late
  absl::Status hole = CheckFlatRangesTile(a, 6, Describe);
  EXPECT_EQ(hole.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(hole.message(),
            "elements [4, 5) are in no rank's shard (after [0, 4) of rank 0 the next is [5, 6) "
            "of rank 1)");
  a[1].begin = 3;
  absl::Status overlap = CheckFlatRangesTile(a, 6, Describe);
  EXPECT_EQ(overlap.message(), "elements [3, 6) of rank 1 overlap [0, 4) of rank 0");
  a.pop_back();
  absl::Status short_end = CheckFlatRangesTile(a, 6, Describe);
  EXPECT_EQ(short_end.message(),
            "elements [4, 6) are in no rank's shard (the last is [0, 4) of rank 0)");
}

TEST(ParseFlatParamHandleTest, ASliceLeavingTheShard) {
  // Rank 2's b[2, 5) at offset 2 of a 4-element shard.
  absl::StatusOr<std::vector<FlatParamSlice>> slices = Parse(Handle({{1, 2, 4, 2}}, true));
  ASSERT_FALSE(slices.ok());
  EXPECT_EQ(slices.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(slices.status().message(),
            "parameter \"b\": elements [2, 5) at offset 2 of the shard leave its 4 elements");
}

TEST(ParseFlatParamHandleTest, NumelDisagreeingWithItsIndices) {
  std::string pickle = Handle(RankSlices(0), true);
  // numel_in_shard 4 of a[0, 3] written as 5: same length in the pickle (BININT1 4 -> 5).
  const std::string four = std::string("K\x04K\x00K\x03", 6);
  const size_t at = pickle.find(four);
  ASSERT_NE(at, std::string::npos);
  pickle[at + 1] = '\x05';
  absl::StatusOr<std::vector<FlatParamSlice>> slices = Parse(pickle);
  ASSERT_FALSE(slices.ok());
  EXPECT_EQ(slices.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(slices.status().message().find("_shard_param_infos[0] of parameter \"a\""),
            absl::string_view::npos)
      << slices.status();
}

TEST(ParseFlatParamHandleTest, NeitherGenerationOfFields) {
  PickleWriter p;
  p.BeginDict(false);
  p.String("flat_param._fqns");
  p.BeginTuple();
  p.EndTuple();
  p.String("flat_param._shapes");
  p.BeginTuple();
  p.EndTuple();
  p.EndDict();
  absl::StatusOr<std::vector<FlatParamSlice>> slices = Parse(p.Finish());
  ASSERT_FALSE(slices.ok());
  EXPECT_EQ(slices.status().message(),
            "has neither flat_param._shard_param_infos (torch >= 2.1) nor _shard_indices and "
            "_shard_param_offsets (torch <= 2.0)");
}

}  // namespace
}  // namespace reshard
