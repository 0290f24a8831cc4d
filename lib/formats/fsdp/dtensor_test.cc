#include "lib/formats/fsdp/dtensor.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/formats/fsdp/dtensor_pickle_writer.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_writer.h"

namespace reshard {
namespace {

// The local tensor of these pickles is a marker int: ParseDTensor only points at it.
constexpr int64_t kLocalMarker = 4242;

DTensorToWrite Embedding() {
  DTensorToWrite d;
  d.global_shape = {50, 16};
  d.placements = {DTensorPlacement{true, 0}};
  d.local_tensor = [](PickleWriter& p) { p.Int(kLocalMarker); };
  return d;
}

struct Parsed {
  PickleArena arena;
  absl::StatusOr<std::optional<DTensorValue>> value = std::nullopt;
};

void Parse(const DTensorToWrite& d, Parsed& out) {
  PickleWriter p;
  WriteDTensor(p, d);
  const std::string bytes = p.Finish();
  absl::StatusOr<PickleValue*> root = ParsePickle(bytes, out.arena, {});
  ASSERT_TRUE(root.ok()) << root.status();
  out.value = ParseDTensor(*root);
}

TEST(ParseDTensorTest, Torch24ModulePaths) {
  Parsed parsed;
  Parse(Embedding(), parsed);
  ASSERT_TRUE(parsed.value.ok()) << parsed.value.status();
  ASSERT_TRUE(parsed.value->has_value());
  const DTensorValue& d = **parsed.value;
  EXPECT_EQ(d.global_shape, (Shape{50, 16}));
  EXPECT_EQ(d.dtype, DType::kF32);
  ASSERT_EQ(d.placements.size(), 1u);
  EXPECT_TRUE(d.placements[0].shard);
  EXPECT_EQ(d.placements[0].dim, 0);
  ASSERT_NE(d.local_tensor, nullptr);
  EXPECT_EQ(d.local_tensor->integer, kLocalMarker);
  EXPECT_EQ(d.mesh_tensor, nullptr);
}

TEST(ParseDTensorTest, Torch20ModulePathsAndTwoPlacements) {
  DTensorToWrite w = Embedding();
  w.torch_24 = false;
  w.dtype = "bfloat16";
  w.placements = {DTensorPlacement{false, 0}, DTensorPlacement{true, 1}};
  Parsed parsed;
  Parse(w, parsed);
  ASSERT_TRUE(parsed.value.ok()) << parsed.value.status();
  ASSERT_TRUE(parsed.value->has_value());
  EXPECT_EQ((*parsed.value)->dtype, DType::kBF16);
  EXPECT_EQ(DescribePlacements((*parsed.value)->placements), "(Replicate(), Shard(1))");
}

TEST(ParseDTensorTest, PartialIsUnimplemented) {
  DTensorToWrite w = Embedding();
  w.other_placement = "Partial";
  Parsed parsed;
  Parse(w, parsed);
  EXPECT_EQ(parsed.value.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(parsed.value.status().message(),
            "placement 0 is Partial: only Shard and Replicate placements are read (a saved "
            "state dict holds no pending reduction)");
}

TEST(ParseDTensorTest, TensorMetaShapeDisagreeing) {
  DTensorToWrite w = Embedding();
  w.meta_shape = {49, 16};
  Parsed parsed;
  Parse(w, parsed);
  EXPECT_EQ(parsed.value.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(parsed.value.status().message(),
            "the DTensorSpec's tensor_meta shape [49, 16] and the size [50, 16] differ");
}

TEST(ParseDTensorTest, ShardDimOutsideTheTensor) {
  DTensorToWrite w = Embedding();
  w.placements = {DTensorPlacement{true, 2}};
  Parsed parsed;
  Parse(w, parsed);
  EXPECT_EQ(parsed.value.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(parsed.value.status().message(),
            "placement 0 is Shard(2) of a tensor of 2 dimensions");
}

TEST(ParseDTensorTest, PlainValueIsNoDTensor) {
  PickleWriter p;
  p.Int(3);
  PickleArena arena;
  absl::StatusOr<PickleValue*> root = ParsePickle(p.Finish(), arena, {});
  ASSERT_TRUE(root.ok());
  absl::StatusOr<std::optional<DTensorValue>> value = ParseDTensor(*root);
  ASSERT_TRUE(value.ok());
  EXPECT_FALSE(value->has_value());
}

TEST(CheckDTensorStateDictGlobalsTest, RefusesAnyOtherGlobal) {
  PickleWriter p;
  p.BeginDict(true);
  p.String("w");
  WriteDTensor(p, Embedding());
  p.String("extra");
  p.Global("posix", "system");
  p.BeginTuple();
  p.String("true");
  p.EndTuple();
  p.Reduce();
  p.EndDict();
  PickleArena arena;
  absl::StatusOr<PickleValue*> root = ParsePickle(p.Finish(), arena, {});
  ASSERT_TRUE(root.ok()) << root.status();
  absl::Status status = CheckDTensorStateDictGlobals(*root);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "entry \"extra\" holds the Python global posix.system, which is not part of a "
            "DTensor state dict (allowed: tensor rebuild functions, torch dtypes, devices and "
            "sizes, DTensor, DTensorSpec, TensorMeta, placements, DeviceMesh)");
}

TEST(CheckDTensorStateDictGlobalsTest, AcceptsDTensors) {
  PickleWriter p;
  p.BeginDict(true);
  p.String("w");
  WriteDTensor(p, Embedding());
  p.EndDict();
  PickleArena arena;
  absl::StatusOr<PickleValue*> root = ParsePickle(p.Finish(), arena, {});
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_TRUE(CheckDTensorStateDictGlobals(*root).ok());
}

std::string LocalBox(const Shape& shape, const std::vector<DTensorPlacement>& placements,
                     const Shape& mesh, int64_t world, int64_t rank) {
  absl::StatusOr<Box> box = DTensorLocalBox(shape, placements, mesh, world, rank);
  if (!box.ok()) return std::string(box.status().message());
  return BoxToString(*box);
}

TEST(DTensorLocalBoxTest, TorchChunkLeavesTheLastRanksShorterOrEmpty) {
  const std::vector<DTensorPlacement> shard0 = {DTensorPlacement{true, 0}};
  // torch.chunk of 5 rows into 4: 2, 2, 1, 0.
  EXPECT_EQ(LocalBox({5, 16}, shard0, {4}, 4, 0), "[0:2, 0:16]");
  EXPECT_EQ(LocalBox({5, 16}, shard0, {4}, 4, 1), "[2:4, 0:16]");
  EXPECT_EQ(LocalBox({5, 16}, shard0, {4}, 4, 2), "[4:5, 0:16]");
  EXPECT_EQ(LocalBox({5, 16}, shard0, {4}, 4, 3), "[5:5, 0:16]");
  // 3 rows into 4: 1, 1, 1, 0.
  EXPECT_EQ(LocalBox({3}, shard0, {4}, 4, 3), "[3:3]");
  EXPECT_EQ(LocalBox({50, 16}, shard0, {2}, 2, 1), "[25:50, 0:16]");
}

TEST(DTensorLocalBoxTest, HybridMeshRowMajor) {
  const std::vector<DTensorPlacement> hsdp = {DTensorPlacement{false, 0},
                                              DTensorPlacement{true, 0}};
  EXPECT_EQ(LocalBox({5, 4}, hsdp, {2, 2}, 4, 0), "[0:3, 0:4]");
  EXPECT_EQ(LocalBox({5, 4}, hsdp, {2, 2}, 4, 1), "[3:5, 0:4]");
  EXPECT_EQ(LocalBox({5, 4}, hsdp, {2, 2}, 4, 2), "[0:3, 0:4]");
  EXPECT_EQ(LocalBox({5, 4}, hsdp, {2, 2}, 4, 3), "[3:5, 0:4]");
  // Shard twice: dimension 0 over both mesh dimensions, chunked in turn.
  const std::vector<DTensorPlacement> twice = {DTensorPlacement{true, 0},
                                               DTensorPlacement{true, 0}};
  EXPECT_EQ(LocalBox({7, 2}, twice, {2, 2}, 4, 1), "[2:4, 0:2]");
  EXPECT_EQ(LocalBox({7, 2}, twice, {2, 2}, 4, 3), "[6:7, 0:2]");
}

TEST(DTensorLocalBoxTest, MeshOfAnotherSize) {
  EXPECT_EQ(LocalBox({4}, {DTensorPlacement{true, 0}}, {3}, 4, 0),
            "the device mesh of shape [3] holds 3 ranks, the save 4");
  EXPECT_EQ(LocalBox({4}, {DTensorPlacement{true, 0}}, {2, 2}, 4, 0),
            "1 placements Shard(0) on a device mesh of shape [2, 2]");
}

}  // namespace
}  // namespace reshard
