#include "lib/formats/deepspeed/universal_patterns.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace {

using Node = StructureNode;

Node StrList(std::vector<std::string> items) {
  Node node;
  node.kind = Node::Kind::kList;
  for (std::string& item : items) node.items.push_back(Node::String(std::move(item)));
  return node;
}

void Put(Node& dict, const std::string& key, Node value) {
  dict.Add(Node::String(key), std::move(value));
}

// Megatron-DeepSpeed's GPTModelPipe lists (TP > 1, SwiGLU).
Node PipeInfo() {
  Node info = Node::Dict();
  Put(info, "original_vocab_size", Node::Int(50));
  Put(info, "vocabulary_parameter_patterns",
      StrList({"tied_modules.embed.word_embeddings.weight"}));
  Put(info, "pipeline_replicated_parameter_patterns",
      StrList({"tied_modules.embed.word_embeddings.weight",
               "tied_modules.embed.position_embeddings.weight"}));
  Put(info, "tp_replicated_parameter_patterns",
      StrList({R"(tied_modules.embed.position_embeddings.weight)", R"(\d+.input_layernorm.weight)",
               R"(\d+.weight)", R"(\d+.bias)"}));
  Put(info, "parameter_with_row_parallelism_patterns",
      StrList({R"(\d+.mlp.dense_4h_to_h.weight)", R"(\d+.self_attention.dense.weight)"}));
  Put(info, "parameter_with_2_sub_params_cat_dim_0", StrList({R"(\d+.mlp.dense_h_to_4h.weight)"}));
  return info;
}

TEST(UniversalPatternsTest, ClassifiesAsDsToUniversal) {
  const Node info = PipeInfo();
  auto patterns = UniversalPatterns::FromInfo(&info);
  ASSERT_TRUE(patterns.ok()) << patterns.status();
  EXPECT_EQ(patterns->original_vocab_size(), 50);
  EXPECT_EQ(patterns->Classify("3.input_layernorm.weight").merge, UcpMerge::kReplicated);
  EXPECT_EQ(patterns->Classify("8.weight").merge, UcpMerge::kReplicated);
  EXPECT_EQ(patterns->Classify("8.bias").merge, UcpMerge::kReplicated);
  EXPECT_EQ(patterns->Classify("3.mlp.dense_4h_to_h.weight").merge, UcpMerge::kRowParallel);
  EXPECT_EQ(patterns->Classify("3.mlp.dense_h_to_4h.weight").merge, UcpMerge::kTwoSubParams);
  // re.match: anchored at the start only, so moments of a param match like the param.
  EXPECT_EQ(patterns->Classify("3.mlp.dense_h_to_4h.weight.exp_avg").merge,
            UcpMerge::kTwoSubParams);
  EXPECT_EQ(patterns->Classify("x3.mlp.dense_4h_to_h.weight").merge, UcpMerge::kColumnParallel);
  EXPECT_EQ(patterns->Classify("3.self_attention.query_key_value.weight").merge,
            UcpMerge::kColumnParallel);
  const UcpParamRule embed = patterns->Classify("tied_modules.embed.word_embeddings.weight");
  EXPECT_EQ(embed.merge, UcpMerge::kColumnParallel);
  EXPECT_TRUE(embed.vocab);
  EXPECT_FALSE(patterns->Classify("3.input_layernorm.weight").vocab);
  EXPECT_TRUE(patterns->PipelineReplicated("tied_modules.embed.position_embeddings.weight"));
  EXPECT_FALSE(patterns->PipelineReplicated("3.input_layernorm.weight"));
}

TEST(UniversalPatternsTest, MergeRulesFollowThePrecedence) {
  const Node info = PipeInfo();
  auto patterns = UniversalPatterns::FromInfo(&info);
  ASSERT_TRUE(patterns.ok());
  auto rules = PartitionRules::Create(patterns->MergeRules());
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto rule_of = [&](const std::string& name) { return **rules->Match(name); };
  EXPECT_TRUE(rule_of("8.weight.exp_avg_sq").replicate);
  EXPECT_EQ(rule_of("3.mlp.dense_h_to_4h.weight").fused, 2);
  EXPECT_EQ(rule_of("3.self_attention.dense.weight.exp_avg").split_dim, 1);
  const PartitionRule qkv = rule_of("3.self_attention.query_key_value.weight");
  EXPECT_FALSE(qkv.replicate);
  EXPECT_EQ(qkv.split_dim, 0);
  EXPECT_EQ(qkv.fused, 1);
  // "3.self_attention.dense.bias" is not "\d+.bias" (re.match of the whole pattern): dim 0.
  EXPECT_EQ(patterns->Classify("3.self_attention.dense.bias").merge, UcpMerge::kColumnParallel);
}

Node IntTuple(std::vector<int64_t> items) {
  Node node;
  node.kind = Node::Kind::kTuple;
  for (int64_t item : items) node.items.push_back(Node::Int(item));
  return node;
}

// Megatron-DeepSpeed's GQA entry: asdict(SubparamShape(patterns, ((q, kv, kv), hidden), 0)).
Node GqaInfo(int64_t q, int64_t kv, int64_t hidden) {
  Node info = Node::Dict();
  Node shape = Node::Dict();
  Put(shape, "patterns", StrList({R"(\d+.self_attention.query_key_value.weight)"}));
  Node dims;
  dims.kind = Node::Kind::kTuple;
  dims.items = {IntTuple({q, kv, kv}), Node::Int(hidden)};
  Put(shape, "shape", dims);
  Put(shape, "partition_dim", Node::Int(0));
  Node shapes;
  shapes.kind = Node::Kind::kList;
  shapes.items.push_back(shape);
  Put(info, "parameter_with_sub_params", shapes);
  return info;
}

TEST(UniversalPatternsTest, AverageAndSubParamsAndNoInfo) {
  Node info = GqaInfo(8, 4, 3);
  Put(info, "parameter_to_average_patterns", StrList({R"(\d+.norm.weight)"}));
  auto patterns = UniversalPatterns::FromInfo(&info);
  ASSERT_TRUE(patterns.ok()) << patterns.status();
  EXPECT_EQ(patterns->Classify("2.norm.weight").merge, UcpMerge::kAverage);
  EXPECT_EQ(patterns->Classify("2.self_attention.query_key_value.weight").merge,
            UcpMerge::kSubParams);
  const UcpSubParamShape* shape =
      patterns->SubParamShape("2.self_attention.query_key_value.weight.exp_avg");
  ASSERT_NE(shape, nullptr);
  EXPECT_EQ(shape->sizes, (std::vector<int64_t>{8, 4, 4}));
  EXPECT_EQ(shape->shape, (Shape{16, 3}));
  EXPECT_EQ(shape->partition_dim, 0);
  // Saved as the dataclass object ds_to_universal pickles.
  EXPECT_EQ(shape->saved.kind, Node::Kind::kObject);
  EXPECT_EQ(shape->saved.module, "deepspeed.checkpoint.universal_checkpoint");
  EXPECT_EQ(shape->saved.name, "SubparamShape");
  ASSERT_EQ(shape->saved.state.size(), 1u);
  EXPECT_EQ(shape->saved.state[0].keys.size(), 3u);
  EXPECT_EQ(patterns->SubParamShape("2.self_attention.dense.weight"), nullptr);
  auto none = UniversalPatterns::FromInfo(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->Classify("anything").merge, UcpMerge::kColumnParallel);
  EXPECT_FALSE(none->original_vocab_size().has_value());
}

TEST(UniversalPatternsTest, SubParamShapeWithoutShapeIsRefused) {
  Node info = Node::Dict();
  Node shape = Node::Dict();
  Put(shape, "patterns", StrList({"qkv"}));
  Node shapes;
  shapes.kind = Node::Kind::kList;
  shapes.items.push_back(shape);
  Put(info, "parameter_with_sub_params", shapes);
  auto patterns = UniversalPatterns::FromInfo(&info);
  ASSERT_FALSE(patterns.ok());
  EXPECT_NE(patterns.status().message().find("parameter_with_sub_params[0]"), std::string::npos);
}

// A [rows, 1] float32 tensor of rank `rank` whose pieces are its single rows, each at byte
// offset 1000 * rank + 4 * row of file 0 (the rank's file), so a piece names its origin.
CatalogTensor RowTensor(const std::string& name, int rank, int64_t rows) {
  CatalogTensor tensor{name, DType::kF32, {rows, 1}, {}};
  // One piece for all rows but the last, one for the last: a cut must split the first.
  for (auto [from, count] : {std::pair<int64_t, int64_t>{0, rows - 1}, {rows - 1, 1}}) {
    SourcePiece piece;
    piece.file = 0;
    piece.byte_offset = 1000 * rank + 4 * from;
    piece.box = Box{{from, 0}, {count, 1}};
    piece.strides = {1, 1};
    tensor.pieces.push_back(piece);
  }
  return tensor;
}

TEST(UniversalPatternsTest, RegroupSubParamsGivesDsToUniversalOrder) {
  const std::string name = "3.self_attention.query_key_value.weight";
  Node info = GqaInfo(8, 4, 1);
  auto patterns = UniversalPatterns::FromInfo(&info);
  ASSERT_TRUE(patterns.ok()) << patterns.status();
  // TP 2: each rank holds [q_r (4 rows); k_r (2); v_r (2)].
  std::vector<Catalog> parts(2);
  for (int r = 0; r < 2; ++r) {
    parts[r].files.push_back(SourceFile{"rank" + std::to_string(r), 2000, {}});
    parts[r].tensors.push_back(RowTensor(name, r, 8));
    parts[r].Reindex();
  }
  ASSERT_TRUE(RegroupSubParams(parts, name, *patterns->SubParamShape(name)).ok());
  // The merged rows, in order: (rank, local row).
  std::vector<std::pair<std::string, int64_t>> rows;
  for (const Catalog& part : parts) {
    const CatalogTensor& tensor = part.tensors[0];
    EXPECT_EQ(tensor.shape, (Shape{8, 1}));
    std::vector<std::pair<std::string, int64_t>> local(8);
    for (const SourcePiece& piece : tensor.pieces) {
      for (int64_t i = 0; i < piece.box.extent[0]; ++i) {
        const std::string& file = part.files[piece.file].path;
        const int64_t origin = (piece.byte_offset - 1000 * (file == "rank1")) / 4 + i;
        local[piece.box.origin[0] + i] = {file, origin};
      }
    }
    rows.insert(rows.end(), local.begin(), local.end());
  }
  std::vector<std::pair<std::string, int64_t>> want;
  for (auto [from, count] : {std::pair<int64_t, int64_t>{0, 4}, {4, 2}, {6, 2}}) {
    for (const char* rank : {"rank0", "rank1"}) {
      for (int64_t i = 0; i < count; ++i) want.emplace_back(rank, from + i);
    }
  }
  EXPECT_EQ(rows, want);
  // A slice that is not shape / TP is refused, naming the tensor.
  std::vector<Catalog> short_parts(2);
  for (int r = 0; r < 2; ++r) {
    short_parts[r].files.push_back(SourceFile{"rank", 2000, {}});
    short_parts[r].tensors.push_back(RowTensor(name, r, 6));
    short_parts[r].Reindex();
  }
  absl::Status refused = RegroupSubParams(short_parts, name, *patterns->SubParamShape(name));
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find(name), std::string::npos);
}

TEST(UniversalPatternsTest, BadPatternNamesTheList) {
  Node info = Node::Dict();
  Put(info, "vocabulary_parameter_patterns", StrList({"(unclosed"}));
  auto patterns = UniversalPatterns::FromInfo(&info);
  ASSERT_FALSE(patterns.ok());
  EXPECT_NE(patterns.status().message().find("vocabulary_parameter_patterns"), std::string::npos);
}

}  // namespace
}  // namespace reshard
