#include "lib/formats/fsdp/sharded_tensor.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/formats/fsdp/sharded_tensor_pickle_writer.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace {

// The local tensors of these pickles are marker ints: ParseShardedTensor only points at them.
constexpr int64_t kLocalMarker = 4242;

// Rank `rank` of 3 saving a [7, 4] tensor: rows 3 + 3 + 1 (torch.chunk).
ShardedTensorToWrite Chunked(int64_t rank) {
  ShardedTensorToWrite st;
  st.global_shape = {7, 4};
  st.shards = ChunkShards(st.global_shape, 3);
  st.rank = rank;
  st.world_size = 3;
  st.local = {static_cast<size_t>(rank)};
  st.local_tensor = [](PickleWriter& p, size_t index) { p.Int(kLocalMarker + index); };
  return st;
}

struct Parsed {
  PickleArena arena;
  PickleValue* root = nullptr;
  absl::StatusOr<std::optional<ShardedTensorValue>> value = std::nullopt;
};

void Parse(const ShardedTensorToWrite& st, Parsed& out) {
  PickleWriter p;
  p.BeginDict(true);
  p.String("w");
  WriteShardedTensor(p, st);
  p.EndDict();
  const std::string bytes = p.Finish();
  absl::StatusOr<PickleValue*> root = ParsePickle(bytes, out.arena, {});
  ASSERT_TRUE(root.ok()) << root.status();
  out.root = *root;
  out.value = ParseShardedTensor(PickleField(*root, "w"));
}

TEST(ChunkShardsTest, TorchChunkLeavesTheLastRanksShortOrNothing) {
  const std::vector<ShardedTensorToWrite::Entry> rows7 = ChunkShards({7, 4}, 3);
  ASSERT_EQ(rows7.size(), 3u);
  EXPECT_EQ(rows7[2].box.origin, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(rows7[2].box.extent, (std::vector<int64_t>{1, 4}));
  // 2 rows over 3 ranks: chunks of 1 on ranks 0 and 1, nothing on rank 2.
  EXPECT_EQ(ChunkShards({2, 4}, 3).size(), 2u);
}

TEST(ParseShardedTensorTest, ChunkedRowsOfTheLastRank) {
  Parsed parsed;
  Parse(Chunked(2), parsed);
  ASSERT_TRUE(parsed.value.ok()) << parsed.value.status();
  ASSERT_TRUE(parsed.value->has_value());
  const ShardedTensorValue& st = **parsed.value;
  EXPECT_EQ(st.global_shape, (Shape{7, 4}));
  EXPECT_EQ(st.dtype, DType::kF32);
  EXPECT_EQ(st.rank, 2);
  EXPECT_EQ(st.world_size, 3);
  EXPECT_EQ(DescribeShards(st.shards_metadata),
            "[0, 3) x [0, 4) on rank 0, [3, 6) x [0, 4) on rank 1, [6, 7) x [0, 4) on rank 2");
  ASSERT_EQ(st.local_shards.size(), 1u);
  EXPECT_EQ(st.local_shards[0].box.origin, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(st.local_shards[0].box.extent, (std::vector<int64_t>{1, 4}));
  ASSERT_NE(st.local_shards[0].tensor, nullptr);
  EXPECT_EQ(st.local_shards[0].tensor->integer, kLocalMarker + 2);
  EXPECT_TRUE(CheckShardedTensorStateDictGlobals(parsed.root).ok())
      << CheckShardedTensorStateDictGlobals(parsed.root);
}

TEST(ParseShardedTensorTest, ARankWithoutLocalShards) {
  ShardedTensorToWrite st = Chunked(2);
  st.global_shape = {2, 4};
  st.shards = ChunkShards(st.global_shape, 3);
  st.local.clear();
  Parsed parsed;
  Parse(st, parsed);
  ASSERT_TRUE(parsed.value.ok()) << parsed.value.status();
  ASSERT_TRUE(parsed.value->has_value());
  EXPECT_TRUE((*parsed.value)->local_shards.empty());
  EXPECT_EQ((*parsed.value)->shards_metadata.size(), 2u);
}

TEST(ParseShardedTensorTest, PlainValuesAreNoShardedTensor) {
  PickleArena arena;
  PickleWriter p;
  p.Int(3);
  const std::string bytes = p.Finish();
  absl::StatusOr<PickleValue*> root = ParsePickle(bytes, arena, {});
  ASSERT_TRUE(root.ok());
  absl::StatusOr<std::optional<ShardedTensorValue>> value = ParseShardedTensor(*root);
  ASSERT_TRUE(value.ok());
  EXPECT_FALSE(value->has_value());
}

TEST(ParseShardedTensorTest, ALocalShardTheMetadataDoesNotList) {
  ShardedTensorToWrite st = Chunked(1);
  st.local = {0};  // rank 1 holding rank 0's rows
  Parsed parsed;
  Parse(st, parsed);
  ASSERT_FALSE(parsed.value.ok());
  EXPECT_EQ(parsed.value.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(parsed.value.status().message(),
            "local shard 0 holds elements [0, 3) x [0, 4) on rank 0, which the "
            "ShardedTensorMetadata does not list on the saving rank 1 (it lists [0, 3) x [0, 4) "
            "on rank 0, [3, 6) x [0, 4) on rank 1, [6, 7) x [0, 4) on rank 2)");
}

TEST(ParseShardedTensorTest, AShardLeavingTheTensor) {
  ShardedTensorToWrite st = Chunked(0);
  st.shards[2].box.extent[0] = 2;  // rows [6, 8) of 7
  Parsed parsed;
  Parse(st, parsed);
  ASSERT_FALSE(parsed.value.ok());
  EXPECT_EQ(parsed.value.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(parsed.value.status().message(),
            "shards_metadata[2]: elements [6, 8) x [0, 4) leave the tensor of shape [7, 4]");
}

TEST(ParseShardedTensorTest, ARankOutsideItsWorldSize) {
  ShardedTensorToWrite st = Chunked(0);
  st.rank = 3;
  st.local.clear();
  Parsed parsed;
  Parse(st, parsed);
  ASSERT_FALSE(parsed.value.ok());
  EXPECT_EQ(parsed.value.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(parsed.value.status().message().find(
                "not a ProcessGroupState of a rank inside its world size"),
            absl::string_view::npos)
      << parsed.value.status();
}

TEST(ShardedTensorGlobalsTest, OtherGlobalsAreRefused) {
  ShardedTensorToWrite st = Chunked(0);
  st.local_tensor = [](PickleWriter& p, size_t) {
    p.Global("os", "system");
    p.BeginTuple();
    p.String("true");
    p.EndTuple();
    p.Reduce();
  };
  Parsed parsed;
  Parse(st, parsed);
  const absl::Status status = CheckShardedTensorStateDictGlobals(parsed.root);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("entry \"w\" holds the Python global os.system"),
            absl::string_view::npos)
      << status;
  // DTensor classes belong to verl's state dicts, not to these.
  EXPECT_FALSE(IsShardedTensorStateDictGlobal("torch.distributed.tensor", "DTensor"));
  EXPECT_TRUE(IsShardedTensorStateDictGlobal("torch._utils", "_rebuild_tensor_v2"));
}

}  // namespace
}  // namespace reshard
