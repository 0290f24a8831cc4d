#include "lib/formats/megatron/torch_dist_format.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/core/catalog.h"

namespace reshard {
namespace {

// decoder.layers.qkv.weight F32 [2, 4, 3]: one piece per (layer, half of the rows), at
// consecutive 24-byte runs of file 0; decoder.layers.5.extra F32 [2] (a per-layer key) and
// embed F32 [3] beside it.
Catalog StackedCatalog() {
  Catalog catalog;
  CatalogTensor embed{"embed", DType::kF32, {3}, {{0, 1000, Box::Full({3}), {1}}}};
  CatalogTensor qkv{"decoder.layers.qkv.weight", DType::kF32, {2, 4, 3}, {}};
  uint64_t at = 0;
  for (int64_t layer = 0; layer < 2; ++layer) {
    for (int64_t half = 0; half < 2; ++half) {
      qkv.pieces.push_back({0, at, Box{{layer, 2 * half, 0}, {1, 2, 3}}, {6, 3, 1}});
      at += 24;
    }
  }
  CatalogTensor extra{"decoder.layers.5.extra", DType::kF32, {2}, {{0, 2000, Box::Full({2}), {1}}}};
  catalog.tensors = {embed, qkv, extra};
  StructureNode root = StructureNode::Dict();
  for (const CatalogTensor& tensor : catalog.tensors) {
    root.Add(StructureNode::String(tensor.name), StructureNode::Tensor(tensor.name));
  }
  catalog.structure = std::make_shared<const StructureNode>(std::move(root));
  catalog.Reindex();
  return catalog;
}

TEST(UnstackLayersTest, SlicesTheLayerAxisInPlace) {
  Catalog catalog = StackedCatalog();
  int64_t stacked = 0;
  absl::StatusOr<int64_t> layers = UnstackLayers(catalog, &stacked);
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ(*layers, 2);
  EXPECT_EQ(stacked, 1);
  std::vector<std::string> names;
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"embed", "decoder.layers.0.qkv.weight",
                                      "decoder.layers.1.qkv.weight", "decoder.layers.5.extra"}));
  const CatalogTensor& layer1 = catalog.tensors[catalog.Find("decoder.layers.1.qkv.weight")];
  EXPECT_EQ(layer1.shape, (Shape{4, 3}));
  ASSERT_EQ(layer1.pieces.size(), 2u);
  EXPECT_EQ(layer1.pieces[0].byte_offset, 48u);  // the third 24-byte run
  EXPECT_EQ(layer1.pieces[1].box.origin, (Shape{2, 0}));
  EXPECT_EQ(layer1.pieces[1].box.extent, (Shape{2, 3}));
  EXPECT_EQ(layer1.pieces[1].strides, (std::vector<int64_t>{3, 1}));
  // The structure names the layers, under their own keys.
  ASSERT_NE(catalog.structure, nullptr);
  std::vector<std::string> keys;
  for (const StructureNode& key : catalog.structure->keys) keys.push_back(key.text);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"embed", "decoder.layers.0.qkv.weight",
                                      "decoder.layers.1.qkv.weight", "decoder.layers.5.extra"}));
  EXPECT_EQ(catalog.structure->values[2].text, "decoder.layers.1.qkv.weight");
}

TEST(UnstackLayersTest, ALayerSpanningChunkIsSlicedByItsStride) {
  Catalog catalog;
  catalog.tensors = {{"layers.w", DType::kBF16, {3, 2}, {{0, 100, Box::Full({3, 2}), {2, 1}}}}};
  catalog.Reindex();
  ASSERT_EQ(*UnstackLayers(catalog), 3);
  ASSERT_EQ(catalog.tensors.size(), 3u);
  EXPECT_EQ(catalog.tensors[2].name, "layers.2.w");
  EXPECT_EQ(catalog.tensors[2].pieces[0].byte_offset, 100u + 2 * 2 * 2);
}

TEST(UnstackLayersTest, RefusesLayerCountsThatDisagreeAndTakenNames) {
  Catalog catalog = StackedCatalog();
  catalog.tensors.push_back({"decoder.layers.mlp.bias", DType::kF32, {3, 4}, {}});
  catalog.Reindex();
  absl::Status status = UnstackLayers(catalog).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("\"decoder.layers.qkv.weight\" has 2"), absl::string_view::npos)
      << status;
  EXPECT_NE(status.message().find("\"decoder.layers.mlp.bias\" has 3"), absl::string_view::npos)
      << status;

  catalog = StackedCatalog();
  catalog.tensors.push_back({"decoder.layers.1.qkv.weight", DType::kF32, {4, 3}, {}});
  catalog.Reindex();
  status = UnstackLayers(catalog).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("decoder.layers.1.qkv.weight"), absl::string_view::npos);
}

TEST(UnstackLayersTest, NothingStacked) {
  Catalog catalog;
  catalog.tensors = {{"decoder.layers.0.w", DType::kF32, {2}, {}}, {"head", DType::kF32, {2}, {}}};
  catalog.Reindex();
  EXPECT_EQ(*UnstackLayers(catalog), 0);
  EXPECT_EQ(catalog.tensors[0].name, "decoder.layers.0.w");
}

}  // namespace
}  // namespace reshard
