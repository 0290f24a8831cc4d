#include "lib/formats/dcp/dcp_output.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/formats/dcp/dcp_metadata.h"

namespace reshard {
namespace {

// {"model": {"w": T, "b": T}, "optim": {"state": {0: {"m": T}}, "groups": [{"lr": 0.5}],
//  "ids": [1, 2]}, "betas": (1, 2)} over tensors model.w [4, 2], model.b [2], optim.m [4, 2].
Catalog TrainingCatalog() {
  Catalog catalog;
  catalog.tensors = {{"model.w", DType::kF32, {4, 2}, {}},
                     {"model.b", DType::kBF16, {2}, {}},
                     {"optim.state.0.m", DType::kF32, {4, 2}, {}}};
  StructureNode model = StructureNode::Dict();
  model.Add(StructureNode::String("w"), StructureNode::Tensor("model.w"));
  model.Add(StructureNode::String("b"), StructureNode::Tensor("model.b"));
  StructureNode moments = StructureNode::Dict();
  moments.Add(StructureNode::String("m"), StructureNode::Tensor("optim.state.0.m"));
  StructureNode state = StructureNode::Dict();
  state.Add(StructureNode::Int(0), std::move(moments));
  StructureNode group = StructureNode::Dict();
  StructureNode lr;
  lr.kind = StructureNode::Kind::kFloat;
  lr.real = 0.5;
  group.Add(StructureNode::String("lr"), std::move(lr));
  StructureNode groups;
  groups.kind = StructureNode::Kind::kList;
  groups.items.push_back(std::move(group));
  StructureNode ids;
  ids.kind = StructureNode::Kind::kList;
  ids.items = {StructureNode::Int(1), StructureNode::Int(2)};
  StructureNode optim = StructureNode::Dict();
  optim.Add(StructureNode::String("state"), std::move(state));
  optim.Add(StructureNode::String("groups"), std::move(groups));
  optim.Add(StructureNode::String("ids"), std::move(ids));
  StructureNode betas;
  betas.kind = StructureNode::Kind::kTuple;
  betas.items = {StructureNode::Int(1), StructureNode::Int(2)};
  StructureNode root = StructureNode::Dict();
  root.Add(StructureNode::String("model"), std::move(model));
  root.Add(StructureNode::String("optim"), std::move(optim));
  root.Add(StructureNode::String("betas"), std::move(betas));
  catalog.structure = std::make_shared<const StructureNode>(std::move(root));
  return catalog;
}

OutputTensor Region(const Catalog& catalog, int source, Box box) {
  return {catalog.tensors[source].name, source, std::move(box), catalog.tensors[source].dtype};
}

// Two ranks: model.w and optim.m split by rows, model.b replicated (in both parts).
TargetLayout TwoParts(const Catalog& catalog) {
  TargetLayout layout;
  layout.kind = TargetLayout::Kind::kParts;
  const OutputNaming naming = DcpOutput().naming();
  for (int rank = 0; rank < 2; ++rank) {
    OutputFileLayout file;
    file.name = naming.part_file(rank, 2);
    file.structure = catalog.structure;
    file.tensors = {Region(catalog, 0, Box{{2 * rank, 0}, {2, 2}}),
                    Region(catalog, 1, Box::Full({2})),
                    Region(catalog, 2, Box{{2 * rank, 0}, {2, 2}})};
    layout.files.push_back(std::move(file));
  }
  return layout;
}

std::string PathText(const std::vector<DcpPathItem>& path) {
  std::string out;
  for (const DcpPathItem& item : path) {
    out += item.is_index ? "#" + std::to_string(item.index) : "'" + item.key + "'";
    out += " ";
  }
  return out;
}

TEST(DcpOutputTest, MetadataDescribesChunksValuesAndKeyPaths) {
  const Catalog catalog = TrainingCatalog();
  const InputModel model;
  const DcpOutput output;
  auto arranged = output.Arrange(TwoParts(catalog), ArrangeRequest{model, catalog});
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const TargetLayout& layout = arranged->layout;
  ASSERT_EQ(layout.files.size(), 2u);
  EXPECT_EQ(layout.files[0].name, "__0_0.distcp");
  EXPECT_EQ(layout.files[1].name, "__1_0.distcp");
  // The replicated tensor is stored once, by rank 0; only rank 0 carries the values.
  EXPECT_EQ(layout.files[0].tensors.size(), 3u);
  ASSERT_EQ(layout.files[1].tensors.size(), 2u);
  EXPECT_EQ(layout.files[1].tensors[1].name, "optim.state.0.m");
  EXPECT_EQ(layout.files[1].structure, nullptr);

  auto companions = output.CompanionFiles(layout);
  ASSERT_TRUE(companions.ok()) << companions.status();
  ASSERT_EQ(companions->size(), 1u);
  EXPECT_EQ((*companions)[0].first, ".metadata");
  auto metadata = ParseDcpMetadata((*companions)[0].second, ".metadata");
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_TRUE(metadata->has_planner_data);
  EXPECT_EQ(metadata->version, "1.0.0");

  // torch's flattening: dicts descended (int keys str()-ed), a list of dicts descended, a
  // list of ints and a tuple are leaves.
  std::vector<std::string> got;
  for (const DcpEntry& entry : metadata->entries) {
    got.push_back(entry.fqn + (entry.is_tensor ? " T " : " V ") + PathText(entry.path));
  }
  EXPECT_EQ(got, (std::vector<std::string>{
                     "model.w T 'model' 'w' ",
                     "model.b T 'model' 'b' ",
                     "optim.state.0.m T 'optim' 'state' '0' 'm' ",
                     "optim.groups.0.lr V 'optim' 'groups' #0 'lr' ",
                     "optim.ids V 'optim' 'ids' ",
                     "betas V 'betas' ",
                 }));
  const DcpEntry& w = metadata->entries[0];
  EXPECT_EQ(w.size, (Shape{4, 2}));
  ASSERT_EQ(w.chunks.size(), 2u);
  EXPECT_EQ(w.chunks[1].origin, (Shape{2, 0}));
  EXPECT_EQ(w.storage[0].relative_path, "__0_0.distcp");
  EXPECT_EQ(w.storage[1].relative_path, "__1_0.distcp");
  EXPECT_EQ(metadata->entries[1].dtype, DType::kBF16);
  EXPECT_EQ(metadata->entries[1].chunks.size(), 1u);
  // Values come first in rank 0's file; each item follows the previous without a gap.
  EXPECT_EQ(metadata->entries[3].storage[0].offset, 0u);
  uint64_t end = 0;
  for (const DcpEntry& entry : metadata->entries) {
    for (const DcpStorage& storage : entry.storage) {
      if (storage.relative_path == "__0_0.distcp")
        end = std::max(end, storage.offset + storage.length);
    }
  }
  auto framing = output.Frame(layout.files[0]);
  ASSERT_TRUE(framing.ok()) << framing.status();
  uint64_t size = 0;
  for (const FramingSegment& segment : framing->segments) {
    size += segment.kind == FramingSegment::Kind::kBytes ? segment.bytes.size()
            : segment.kind == FramingSegment::Kind::kTensor
                ? layout.files[0].tensors[segment.tensor].bytes()
                : segment.size;
  }
  EXPECT_EQ(end, size);
}

TEST(DcpOutputTest, RefusesFusedSplits) {
  const Catalog catalog = TrainingCatalog();
  const InputModel model;
  TargetLayout fused = TwoParts(catalog);
  fused.files[0].tensors[0].written_shape = {2, 2};
  auto status = DcpOutput().Arrange(fused, ArrangeRequest{model, catalog}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("\"model.w\""), absl::string_view::npos) << status;
}

// {"rng": (model.b, "philox")} beside the nesting: model.b is a chunk of its own and a storage
// of the value's item too, as torch writes both.
TEST(DcpOutputTest, ValuesHoldingTensorsPickleThemInTheirItem) {
  Catalog catalog = TrainingCatalog();
  StructureNode root = *catalog.structure;
  StructureNode rng;
  rng.kind = StructureNode::Kind::kTuple;
  rng.items = {StructureNode::Tensor("model.b"), StructureNode::String("philox")};
  root.Add(StructureNode::String("rng"), std::move(rng));
  catalog.structure = std::make_shared<const StructureNode>(std::move(root));
  const InputModel model;
  const DcpOutput output;
  auto arranged = output.Arrange(TwoParts(catalog), ArrangeRequest{model, catalog});
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const OutputFileLayout& rank0 = arranged->layout.files[0];
  ASSERT_EQ(rank0.tensors.size(), 4u);
  EXPECT_EQ(rank0.tensors[3].name, "model.b");  // the value's copy, last
  auto companions = output.CompanionFiles(arranged->layout);
  ASSERT_TRUE(companions.ok()) << companions.status();
  auto metadata = ParseDcpMetadata((*companions)[0].second, ".metadata");
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  std::vector<std::string> got;
  for (const DcpEntry& entry : metadata->entries) {
    got.push_back(entry.fqn + (entry.is_tensor ? " T" : " V"));
  }
  EXPECT_EQ(got,
            (std::vector<std::string>{"model.w T", "model.b T", "optim.state.0.m T",
                                      "optim.groups.0.lr V", "optim.ids V", "betas V", "rng V"}));
  // The rng item holds the 4 bytes of model.b (BF16 [2]) as a storage: one kTensor segment
  // more than the chunks.
  auto framing = output.Frame(rank0);
  ASSERT_TRUE(framing.ok()) << framing.status();
  int tensor_segments = 0;
  for (const FramingSegment& segment : framing->segments) {
    tensor_segments += segment.kind == FramingSegment::Kind::kTensor;
  }
  EXPECT_EQ(tensor_segments, 4);

  // Split by the rules, it cannot be pickled whole.
  TargetLayout split = TwoParts(catalog);
  for (OutputFileLayout& file : split.files)
    file.tensors[1].region = Box{{file.name == "__0_0.distcp" ? 0 : 1}, {1}};
  auto status = output.Arrange(split, ArrangeRequest{model, catalog}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("tensor \"model.b\" is held by a value"), absl::string_view::npos)
      << status;
}

TEST(DcpOutputTest, ConsolidatedBucketsAreRankZeroFiles) {
  const OutputNaming naming = DcpOutput().naming();
  EXPECT_EQ(naming.shard_file(0, 1), "__0_0.distcp");
  EXPECT_EQ(naming.shard_file(2, 3), "__0_2.distcp");
  EXPECT_EQ(naming.part_file(7, 8), "__7_0.distcp");
}

}  // namespace
}  // namespace reshard
