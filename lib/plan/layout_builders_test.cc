#include "lib/plan/layout_builders.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace {

OutputNaming TestNaming() {
  OutputNaming naming;
  naming.shard_file = [](int index, int count) {
    return "shard_" + std::to_string(index) + "_of_" + std::to_string(count);
  };
  naming.part_file = [](int rank, int parts) {
    return "part_" + std::to_string(rank) + "_of_" + std::to_string(parts);
  };
  return naming;
}

void AddTensor(Catalog& catalog, const std::string& name, DType dtype, Shape shape) {
  if (catalog.files.empty()) catalog.files.push_back({"/src/file.bin", 1ull << 40});
  CatalogTensor tensor{name, dtype, shape, {}};
  // Each tensor gets bytes of its own, so none looks like a tied alias of another.
  uint64_t offset = 0;
  for (const CatalogTensor& other : catalog.tensors) offset += TensorBytes(other) + 1;
  tensor.pieces.push_back({0, offset, Box::Full(shape), RowMajorStrides(shape)});
  catalog.tensors.push_back(tensor);
  catalog.Reindex();
}

TEST(ParseByteSizeTest, Units) {
  EXPECT_EQ(*ParseByteSize("5GB"), 5'000'000'000ull);
  EXPECT_EQ(*ParseByteSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("100"), 100u);
  EXPECT_EQ(*ParseByteSize("100B"), 100u);
  EXPECT_EQ(*ParseByteSize("500MB"), 500'000'000ull);
  EXPECT_EQ(*ParseByteSize("1KiB"), 1024u);
  EXPECT_EQ(*ParseByteSize("3kb"), 3000u);
  EXPECT_EQ(*ParseByteSize(" 1.5 GB "), 1'500'000'000ull);
  EXPECT_EQ(*ParseByteSize("1TiB"), 1ull << 40);
  EXPECT_EQ(*ParseByteSize("32MiB"), 32ull << 20);
}

TEST(ParseByteSizeTest, Errors) {
  for (const char* text : {"5XB", "GB", "", "abc", "5 G B", "-5GB", "1e3", "0", "0GB", "0.1"}) {
    auto size = ParseByteSize(text);
    EXPECT_FALSE(size.ok()) << "\"" << text << "\" parsed as " << (size.ok() ? *size : 0);
    if (!size.ok()) {
      EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << text;
    }
  }
  auto bad_unit = ParseByteSize("5XB");
  EXPECT_NE(bad_unit.status().message().find("unit"), absl::string_view::npos) << bad_unit.status();
  EXPECT_FALSE(ParseByteSize("100000000TB").ok());  // 1e20 bytes: past uint64
}

TEST(DTypePolicyTest, Parse) {
  EXPECT_EQ(*ParseDTypePolicy("keep"), DTypePolicy::kKeep);
  EXPECT_EQ(*ParseDTypePolicy("fp32"), DTypePolicy::kF32);
  EXPECT_EQ(*ParseDTypePolicy("float32"), DTypePolicy::kF32);
  EXPECT_EQ(*ParseDTypePolicy("bf16"), DTypePolicy::kBF16);
  EXPECT_EQ(*ParseDTypePolicy("BFloat16"), DTypePolicy::kBF16);
  EXPECT_EQ(*ParseDTypePolicy("fp16"), DTypePolicy::kF16);
  EXPECT_EQ(*ParseDTypePolicy("float16"), DTypePolicy::kF16);
  for (const char* bad : {"fp8", "int8", "", "f64", "bf"}) {
    auto policy = ParseDTypePolicy(bad);
    ASSERT_FALSE(policy.ok()) << bad;
    EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  }
  for (DTypePolicy policy :
       {DTypePolicy::kKeep, DTypePolicy::kF32, DTypePolicy::kBF16, DTypePolicy::kF16}) {
    EXPECT_EQ(*ParseDTypePolicy(DTypePolicyName(policy)), policy);
  }
}

TEST(DTypePolicyTest, Apply) {
  const DTypePolicy policies[] = {DTypePolicy::kKeep, DTypePolicy::kF32, DTypePolicy::kBF16,
                                  DTypePolicy::kF16};
  const DType targets[] = {DType::kF32, DType::kF32, DType::kBF16, DType::kF16};
  for (DType dtype : kAllDTypes) {
    for (int p = 0; p < 4; ++p) {
      const DType got = ApplyDTypePolicy(policies[p], dtype);
      if (IsConvertibleFloat(dtype) && policies[p] != DTypePolicy::kKeep) {
        EXPECT_EQ(got, targets[p]) << DTypeName(dtype);
      } else {
        // Integers, BOOL, F64 and F8 are never converted.
        EXPECT_EQ(got, dtype) << DTypeName(dtype) << " under " << DTypePolicyName(policies[p]);
      }
    }
  }
}

// Reference: huggingface_hub.serialization._base.split_state_dict_into_shards_factory (without
// storage sharing), transcribed as it reads.
std::vector<std::vector<std::string>> HuggingFaceShards(
    const std::vector<std::pair<std::string, uint64_t>>& state_dict, uint64_t max_shard_size) {
  std::vector<std::vector<std::string>> shard_list;
  std::vector<std::string> current_shard;
  uint64_t current_shard_size = 0;
  for (const auto& [key, tensor_size] : state_dict) {
    // If this tensor is bigger than the maximal size, we put it in its own shard
    if (tensor_size > max_shard_size) {
      shard_list.push_back({key});
      continue;
    }
    // If this tensor is going to tip up over the maximal size, we split.
    if (current_shard_size + tensor_size > max_shard_size) {
      shard_list.push_back(current_shard);
      current_shard.clear();
      current_shard_size = 0;
    }
    current_shard.push_back(key);
    current_shard_size += tensor_size;
  }
  if (!current_shard.empty()) shard_list.push_back(current_shard);
  return shard_list;
}

TEST(BuildConsolidateLayoutTest, MatchesHuggingFaceRule) {
  const uint32_t seed = 1234567;
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kU8, DType::kI64};
  for (int iteration = 0; iteration < 500; ++iteration) {
    Catalog catalog;
    std::vector<std::pair<std::string, uint64_t>> state_dict;
    const int count = std::uniform_int_distribution<int>(1, 30)(rng);
    const uint64_t max_shard_size = std::uniform_int_distribution<uint64_t>(1, 400)(rng);
    for (int i = 0; i < count; ++i) {
      const DType dtype = dtypes[std::uniform_int_distribution<int>(0, 3)(rng)];
      Shape shape = {std::uniform_int_distribution<int64_t>(0, 60)(rng)};
      if (std::uniform_int_distribution<int>(0, 4)(rng) == 0) shape = {};  // scalar
      const std::string name = "t" + std::to_string(i) + "_" + std::to_string(rng() % 1000);
      AddTensor(catalog, name, dtype, shape);
      state_dict.push_back({name, NumElementsUnchecked(shape) * DTypeSize(dtype)});
    }
    const auto expected = HuggingFaceShards(state_dict, max_shard_size);
    auto layout = BuildConsolidateLayout(catalog, DTypePolicy::kKeep, max_shard_size, TestNaming());
    ASSERT_TRUE(layout.ok()) << layout.status();
    const std::string context =
        "seed " + std::to_string(seed) + " iteration " + std::to_string(iteration);
    EXPECT_EQ(layout->kind, TargetLayout::Kind::kConsolidated);
    ASSERT_EQ(layout->files.size(), expected.size()) << context;
    const int files = static_cast<int>(expected.size());
    for (int f = 0; f < files; ++f) {
      const OutputFileLayout& file = layout->files[f];
      EXPECT_EQ(file.name, "shard_" + std::to_string(f) + "_of_" + std::to_string(files))
          << context;
      std::vector<std::string> names;
      for (const OutputTensor& tensor : file.tensors) {
        names.push_back(tensor.name);
        const CatalogTensor& source = catalog.tensors[tensor.source];
        EXPECT_EQ(source.name, tensor.name) << context;
        EXPECT_EQ(tensor.region, Box::Full(source.shape)) << context;
        EXPECT_EQ(tensor.dtype, source.dtype) << context;
      }
      EXPECT_EQ(names, expected[f]) << context << " file " << f;
    }
  }
}

TEST(BuildConsolidateLayoutTest, DTypePolicyChangesSizes) {
  Catalog catalog;
  AddTensor(catalog, "a", DType::kF32, {10});  // 40 bytes, 20 as BF16
  AddTensor(catalog, "b", DType::kF32, {10});
  AddTensor(catalog, "c", DType::kI32, {5});  // 20 bytes, kept
  auto keep = BuildConsolidateLayout(catalog, DTypePolicy::kKeep, 60, TestNaming());
  ASSERT_TRUE(keep.ok());
  EXPECT_EQ(keep->files.size(), 2u);  // [a], [b, c]
  auto bf16 = BuildConsolidateLayout(catalog, DTypePolicy::kBF16, 60, TestNaming());
  ASSERT_TRUE(bf16.ok());
  ASSERT_EQ(bf16->files.size(), 1u);  // 20 + 20 + 20
  EXPECT_EQ(bf16->files[0].tensors[0].dtype, DType::kBF16);
  EXPECT_EQ(bf16->files[0].tensors[2].dtype, DType::kI32);
  EXPECT_EQ(bf16->files[0].name, "shard_0_of_1");
  EXPECT_FALSE(BuildConsolidateLayout(catalog, DTypePolicy::kKeep, 0, TestNaming()).ok());
}

TEST(BuildConsolidateLayoutTest, OversizedTensorGoesAloneWhileCurrentStaysOpen) {
  Catalog catalog;
  AddTensor(catalog, "small1", DType::kU8, {3});
  AddTensor(catalog, "huge", DType::kU8, {100});
  AddTensor(catalog, "small2", DType::kU8, {3});
  auto layout = BuildConsolidateLayout(catalog, DTypePolicy::kKeep, 10, TestNaming());
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->files.size(), 2u);
  ASSERT_EQ(layout->files[0].tensors.size(), 1u);
  EXPECT_EQ(layout->files[0].tensors[0].name, "huge");
  ASSERT_EQ(layout->files[1].tensors.size(), 2u);
  EXPECT_EQ(layout->files[1].tensors[0].name, "small1");
  EXPECT_EQ(layout->files[1].tensors[1].name, "small2");
}

absl::StatusOr<PartitionRules> Rules(const std::string& json) {
  return PartitionRules::FromJson(json, "test-rules");
}

TEST(BuildSplitLayoutTest, RegionsPerRank) {
  Catalog catalog;
  AddTensor(catalog, "q.weight", DType::kF32, {8, 6});
  AddTensor(catalog, "o.weight", DType::kF32, {6, 8});
  AddTensor(catalog, "norm", DType::kF32, {6});
  auto rules = Rules(R"({"rules": [{"pattern": "^q\\.", "split_dim": 0},
                                   {"pattern": "^o\\.", "split_dim": -1},
                                   {"pattern": ".*", "replicate": true}]})");
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto layout = BuildSplitLayout(catalog, *rules, 2, DTypePolicy::kF16, TestNaming());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->kind, TargetLayout::Kind::kParts);
  ASSERT_EQ(layout->files.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const OutputFileLayout& file = layout->files[rank];
    EXPECT_EQ(file.name, "part_" + std::to_string(rank) + "_of_2");
    EXPECT_EQ(file.metadata.at("reshard_part"), std::to_string(rank));
    EXPECT_EQ(file.metadata.at("reshard_parts"), "2");
    ASSERT_EQ(file.tensors.size(), 3u);
    EXPECT_EQ(file.tensors[0].name, "q.weight");
    EXPECT_EQ(file.tensors[0].source, 0);
    EXPECT_EQ(file.tensors[0].region, (Box{{rank * 4, 0}, {4, 6}}));
    EXPECT_EQ(file.tensors[0].dtype, DType::kF16);
    EXPECT_EQ(file.tensors[1].region, (Box{{0, rank * 4}, {6, 4}}));
    EXPECT_EQ(file.tensors[2].region, (Box{{0}, {6}}));  // replicated: whole
  }
}

TEST(BuildSplitLayoutTest, IndivisibleDimension) {
  Catalog catalog;
  AddTensor(catalog, "emb.weight", DType::kF32, {7, 4});
  auto rules = Rules(R"({"rules": [{"pattern": ".*", "split_dim": 0}]})");
  ASSERT_TRUE(rules.ok());
  auto layout = BuildSplitLayout(catalog, *rules, 2, DTypePolicy::kKeep, TestNaming());
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layout.status().message().find("emb.weight"), absl::string_view::npos)
      << layout.status();
  EXPECT_NE(layout.status().message().find("divisible"), absl::string_view::npos)
      << layout.status();
}

TEST(BuildSplitLayoutTest, UnitsStayWhole) {
  // 4 units of 3 rows (attention heads): 2 parts get 2 heads each; 4 parts get 1 each; 3 parts
  // would divide the 12 rows but cut heads, 6 parts would cut every head in half.
  Catalog catalog;
  AddTensor(catalog, "qkv.weight", DType::kF32, {12, 2});
  auto rules = Rules(R"({"rules": [{"pattern": ".*", "split_dim": 0, "unit": 3}]})");
  ASSERT_TRUE(rules.ok()) << rules.status();
  for (int parts : {1, 2, 4}) {
    auto layout = BuildSplitLayout(catalog, *rules, parts, DTypePolicy::kKeep, TestNaming());
    ASSERT_TRUE(layout.ok()) << parts << ": " << layout.status();
    EXPECT_EQ(layout->files[parts - 1].tensors[0].region,
              (Box{{(parts - 1) * (12 / parts), 0}, {12 / parts, 2}}));
  }
  for (int parts : {3, 6}) {
    auto layout = BuildSplitLayout(catalog, *rules, parts, DTypePolicy::kKeep, TestNaming());
    ASSERT_FALSE(layout.ok()) << parts;
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(layout.status().message().find("4 units of 3 rows"), absl::string_view::npos)
        << layout.status();
    EXPECT_NE(layout.status().message().find("divides 4"), absl::string_view::npos)
        << layout.status();
  }
  // Rows that are no whole number of units at all.
  Catalog odd;
  AddTensor(odd, "qkv.weight", DType::kF32, {10, 2});
  auto layout = BuildSplitLayout(odd, *rules, 2, DTypePolicy::kKeep, TestNaming());
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("not a whole number"), absl::string_view::npos)
      << layout.status();
}

TEST(BuildSplitLayoutTest, NoMatchingRule) {
  Catalog catalog;
  AddTensor(catalog, "a.weight", DType::kF32, {4});
  AddTensor(catalog, "lonely.bias", DType::kF32, {4});
  auto rules = Rules(R"({"rules": [{"pattern": "^a\\.", "split_dim": 0}]})");
  ASSERT_TRUE(rules.ok());
  auto layout = BuildSplitLayout(catalog, *rules, 2, DTypePolicy::kKeep, TestNaming());
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("lonely.bias"), absl::string_view::npos)
      << layout.status();
  EXPECT_FALSE(
      BuildSplitLayout(catalog, PartitionRules(), 2, DTypePolicy::kKeep, TestNaming()).ok());
  EXPECT_FALSE(BuildSplitLayout(catalog, *rules, 0, DTypePolicy::kKeep, TestNaming()).ok());
}

TEST(BuildSplitLayoutTest, SplitDimOutOfRange) {
  Catalog catalog;
  AddTensor(catalog, "v", DType::kF32, {4});
  auto rules = Rules(R"({"rules": [{"pattern": ".*", "split_dim": 1}]})");
  ASSERT_TRUE(rules.ok());
  auto layout = BuildSplitLayout(catalog, *rules, 2, DTypePolicy::kKeep, TestNaming());
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("\"v\""), absl::string_view::npos) << layout.status();
}

// A part: each tensor stored whole in its own file of the part.
Catalog Part(const std::string& file, const std::vector<std::pair<std::string, Shape>>& tensors,
             DType dtype = DType::kF32) {
  Catalog catalog;
  catalog.format = "test";
  catalog.files.push_back({file, 1 << 20});
  uint64_t offset = 8;
  for (const auto& [name, shape] : tensors) {
    CatalogTensor tensor{name, dtype, shape, {}};
    tensor.pieces.push_back({0, offset, Box::Full(shape), RowMajorStrides(shape)});
    offset += NumElementsUnchecked(shape) * DTypeSize(dtype);
    catalog.tensors.push_back(tensor);
  }
  catalog.Reindex();
  return catalog;
}

TEST(MergePartsTest, ConcatenatesAlongDim1) {
  std::vector<Catalog> parts = {
      Part("p0", {{"w", {4, 2}}, {"b", {3}}}),
      Part("p1", {{"w", {4, 3}}, {"b", {3}}}),
      Part("p2", {{"w", {4, 1}}, {"b", {3}}}),
  };
  parts[0].metadata = {{"format", "pt"}, {"reshard_part", "0"}, {"reshard_parts", "3"}};
  auto rules = Rules(R"({"rules": [{"pattern": "^w$", "split_dim": 1},
                                   {"pattern": ".*", "replicate": true}]})");
  ASSERT_TRUE(rules.ok());
  auto merged = MergeParts(parts, *rules, {"p0", "p1", "p2"});
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_EQ(merged->files.size(), 3u);
  EXPECT_EQ(merged->files[2].path, "p2");
  EXPECT_EQ(merged->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  const int w = merged->Find("w");
  ASSERT_GE(w, 0);
  const CatalogTensor& tensor = merged->tensors[w];
  EXPECT_EQ(tensor.shape, (Shape{4, 6}));
  ASSERT_EQ(tensor.pieces.size(), 3u);
  EXPECT_EQ(tensor.pieces[0].box, (Box{{0, 0}, {4, 2}}));
  EXPECT_EQ(tensor.pieces[0].file, 0);
  EXPECT_EQ(tensor.pieces[1].box, (Box{{0, 2}, {4, 3}}));
  EXPECT_EQ(tensor.pieces[1].file, 1);
  EXPECT_EQ(tensor.pieces[1].strides, (std::vector<int64_t>{3, 1}));  // local strides kept
  EXPECT_EQ(tensor.pieces[2].box, (Box{{0, 5}, {4, 1}}));
  EXPECT_EQ(tensor.pieces[2].file, 2);
  EXPECT_EQ(tensor.pieces[2].byte_offset, 8u);
  const int b = merged->Find("b");
  ASSERT_GE(b, 0);
  EXPECT_EQ(merged->tensors[b].shape, (Shape{3}));
  ASSERT_EQ(merged->tensors[b].pieces.size(), 1u);  // part 0's copy
  EXPECT_EQ(merged->tensors[b].pieces[0].file, 0);
  EXPECT_TRUE(ValidateCatalog(*merged).ok()) << ValidateCatalog(*merged);
}

TEST(MergePartsTest, MissingTensorNamesPart) {
  std::vector<Catalog> parts = {
      Part("p0", {{"w", {2, 2}}, {"b", {3}}}),
      Part("p1", {{"w", {2, 2}}}),
  };
  auto rules = Rules(R"({"rules": [{"pattern": ".*", "replicate": true}]})");
  ASSERT_TRUE(rules.ok());
  auto merged = MergeParts(parts, *rules, {"first.safetensors", "second.safetensors"});
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("second.safetensors"), absl::string_view::npos)
      << merged.status();
  EXPECT_NE(merged.status().message().find("\"b\""), absl::string_view::npos) << merged.status();

  // An extra tensor in a later part is reported too.
  std::vector<Catalog> extra = {
      Part("p0", {{"w", {2, 2}}}),
      Part("p1", {{"w", {2, 2}}, {"x", {1}}}),
  };
  auto merged_extra = MergeParts(extra, *rules, {"first", "second"});
  ASSERT_FALSE(merged_extra.ok());
  EXPECT_NE(merged_extra.status().message().find("\"x\""), absl::string_view::npos)
      << merged_extra.status();
}

TEST(MergePartsTest, ReplicatedShapeMismatch) {
  std::vector<Catalog> parts = {
      Part("p0", {{"norm", {8}}}),
      Part("p1", {{"norm", {4}}}),
  };
  auto rules = Rules(R"({"rules": [{"pattern": ".*", "replicate": true}]})");
  ASSERT_TRUE(rules.ok());
  auto merged = MergeParts(parts, *rules, {"a", "b"});
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(merged.status().message().find("norm"), absl::string_view::npos) << merged.status();

  // Split tensors may differ only along the split dimension.
  std::vector<Catalog> split = {
      Part("p0", {{"w", {4, 2}}}),
      Part("p1", {{"w", {5, 3}}}),
  };
  auto split_rules = Rules(R"({"rules": [{"pattern": ".*", "split_dim": 1}]})");
  ASSERT_TRUE(split_rules.ok());
  EXPECT_FALSE(MergeParts(split, *split_rules, {"a", "b"}).ok());

  // dtype mismatch.
  std::vector<Catalog> dtypes = {Part("p0", {{"w", {4}}}), Part("p1", {{"w", {4}}}, DType::kBF16)};
  EXPECT_FALSE(MergeParts(dtypes, *rules, {"a", "b"}).ok());
}

TEST(MergePartsTest, NoRulesWithSeveralParts) {
  std::vector<Catalog> parts = {Part("p0", {{"w", {2}}}), Part("p1", {{"w", {2}}})};
  auto merged = MergeParts(parts, PartitionRules(), {"a", "b"});
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(merged.status().message().find("--rules"), absl::string_view::npos) << merged.status();
  // A single part needs no rules.
  auto single = MergeParts({Part("p0", {{"w", {2}}})}, PartitionRules(), {"a"});
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->tensors.size(), 1u);
  EXPECT_FALSE(MergeParts({}, PartitionRules(), {}).ok());
}

TEST(ViewSubTensorsByPartTest, EachPartHoldsItsSliceOfEverySubTensor) {
  // A [q; k; v] of 6, 3 and 3 rows of 2 floats, stored as two pieces (rows 0-7 and 8-11) that
  // the view cuts at the slices' boundaries.
  CatalogTensor qkv{"qkv", DType::kF32, {12, 2}, {}};
  qkv.pieces.push_back({0, 0, Box{{0, 0}, {8, 2}}, {2, 1}});
  qkv.pieces.push_back({0, 64, Box{{8, 0}, {4, 2}}, {2, 1}});
  auto viewed = ViewSubTensorsByPart(qkv, 0, {6, 3, 3}, 3);
  ASSERT_TRUE(viewed.ok()) << viewed.status();
  EXPECT_EQ(viewed->shape, (Shape{12, 2}));
  // Row r of the view reads this row of the tensor (each row exactly once).
  std::vector<int64_t> source(12, -1);
  for (const SourcePiece& piece : viewed->pieces) {
    for (int64_t r = 0; r < piece.box.extent[0]; ++r) {
      ASSERT_EQ(source[piece.box.origin[0] + r], -1) << "row " << piece.box.origin[0] + r;
      source[piece.box.origin[0] + r] = static_cast<int64_t>(piece.byte_offset / 8) + r;
    }
  }
  // [q_0; k_0; v_0; q_1; k_1; v_1; q_2; k_2; v_2]: q_t rows 2t, 2t + 1; k_t 6 + t; v_t 9 + t.
  EXPECT_EQ(source, (std::vector<int64_t>{0, 1, 6, 9, 2, 3, 7, 10, 4, 5, 8, 11}));
}

TEST(ViewSubTensorsByPartTest, RefusesSizesThatDoNotFit) {
  CatalogTensor qkv{"qkv", DType::kF32, {12, 2}, {}};
  qkv.pieces.push_back({0, 0, Box::Full({12, 2}), {2, 1}});
  auto uneven = ViewSubTensorsByPart(qkv, 0, {6, 3, 3}, 2);
  EXPECT_EQ(uneven.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(uneven.status().message(),
            "tensor \"qkv\" of shape [12, 2], sub-tensors of 6, 3, 3 along dimension 0: a split "
            "into 2 parts would cut a sub-tensor of 3 rows unevenly");
  auto short_sum = ViewSubTensorsByPart(qkv, 0, {6, 3, 2}, 1);
  EXPECT_EQ(short_sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_sum.status().message(),
            "tensor \"qkv\" of shape [12, 2], sub-tensors of 6, 3, 2 along dimension 0: they "
            "add up to 11 rows, not 12");
}

}  // namespace
}  // namespace reshard

namespace reshard {
namespace {

TEST(BuildConsolidateLayoutTest, TiedTensorsAreStoredOnceNextToTheirOriginal) {
  Catalog catalog;
  catalog.files.push_back({"in", 1 << 20});
  AddTensor(catalog, "wte", DType::kF32, {10});
  AddTensor(catalog, "big", DType::kF32, {10});
  CatalogTensor tied = catalog.tensors[0];
  tied.name = "lm_head";
  catalog.tensors.push_back(tied);
  catalog.Reindex();
  OutputNaming naming;
  naming.shard_file = [](int i, int n) { return absl::StrCat("s", i, "of", n); };
  // 40 bytes per tensor, 40-byte files: "wte" and "big" each fill one; "lm_head" rides along.
  auto deduped = BuildConsolidateLayout(catalog, DTypePolicy::kKeep, 40, naming);
  ASSERT_TRUE(deduped.ok()) << deduped.status();
  ASSERT_EQ(deduped->files.size(), 2u);
  ASSERT_EQ(deduped->files[0].tensors.size(), 2u);
  EXPECT_EQ(deduped->files[0].tensors[1].name, "lm_head");
  EXPECT_EQ(deduped->files[0].tensors[1].alias_of, 0);
  auto copied = BuildConsolidateLayout(catalog, DTypePolicy::kKeep, 40, naming,
                                       /*dedupe_tied=*/false);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(copied->files.size(), 3u);
  for (const auto& file : copied->files) {
    for (const auto& tensor : file.tensors) EXPECT_EQ(tensor.alias_of, -1);
  }
}

}  // namespace
}  // namespace reshard
