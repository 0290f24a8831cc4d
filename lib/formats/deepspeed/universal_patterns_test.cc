#include "lib/formats/deepspeed/universal_patterns.h"

#include <string>
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

TEST(UniversalPatternsTest, AverageAndSubParamsAndNoInfo) {
  Node info = Node::Dict();
  Put(info, "parameter_to_average_patterns", StrList({R"(\d+.norm.weight)"}));
  Node shape = Node::Dict();
  Put(shape, "patterns", StrList({R"(\d+.self_attention.query_key_value.weight)"}));
  Node shapes;
  shapes.kind = Node::Kind::kList;
  shapes.items.push_back(shape);
  Put(info, "parameter_with_sub_params", shapes);
  auto patterns = UniversalPatterns::FromInfo(&info);
  ASSERT_TRUE(patterns.ok());
  EXPECT_EQ(patterns->Classify("2.norm.weight").merge, UcpMerge::kAverage);
  EXPECT_EQ(patterns->Classify("2.self_attention.query_key_value.weight").merge,
            UcpMerge::kSubParams);
  auto none = UniversalPatterns::FromInfo(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->Classify("anything").merge, UcpMerge::kColumnParallel);
  EXPECT_FALSE(none->original_vocab_size().has_value());
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
