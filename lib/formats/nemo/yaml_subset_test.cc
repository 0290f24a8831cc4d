#include "lib/formats/nemo/yaml_subset.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

TEST(YamlSubsetTest, ReadsWhatOmegaConfWrites) {
  const std::string text = R"(mcore_gpt: true
tensor_model_parallel_size: 2   # a comment
pipeline_model_parallel_size: 1
num_query_groups: null
activation: fast-swiglu
tokenizer:
  library: sentencepiece
  model: nemo:0123456789abcdef0123456789abcdef_tokenizer.model
  name: 'it''s'
  quoted: "a \"b\" #c"
optim:
  betas:
  - 0.9
  - 0.98
  sched: [1, 2]
  empty: []
data:
  - name: a
    weight: 1
  - name: b
)";
  absl::StatusOr<YamlNode> root = ParseYamlSubset(text, "model_config.yaml");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(YamlInt(root->Get("tensor_model_parallel_size")), 2);
  EXPECT_EQ(YamlBool(root->Get("mcore_gpt")), true);
  EXPECT_EQ(root->Get("num_query_groups")->kind, YamlNode::Kind::kNull);
  EXPECT_EQ(YamlString(root->Get("activation")), "fast-swiglu");
  const YamlNode* tokenizer = root->Get("tokenizer");
  ASSERT_NE(tokenizer, nullptr);
  EXPECT_EQ(YamlString(tokenizer->Get("name")), "it's");
  EXPECT_EQ(YamlString(tokenizer->Get("quoted")), "a \"b\" #c");
  const YamlNode* betas = root->Get("optim")->Get("betas");
  ASSERT_EQ(betas->list.size(), 2u);
  EXPECT_EQ(betas->list[1].scalar, "0.98");
  EXPECT_EQ(root->Get("optim")->Get("sched")->list.size(), 2u);
  EXPECT_EQ(root->Get("optim")->Get("empty")->kind, YamlNode::Kind::kList);
  const YamlNode* data = root->Get("data");
  ASSERT_EQ(data->list.size(), 2u);
  EXPECT_EQ(YamlInt(data->list[0].Get("weight")), 1);
  EXPECT_EQ(YamlString(data->list[1].Get("name")), "b");
}

TEST(YamlSubsetTest, RefusesWhatItDoesNotRead) {
  for (const char* text : {"a: &x 1\nb: *x\n", "a: |\n  text\n", "a:\n\tb: 1\n", "a: 1\na: 2\n",
                           "a: 1\n  b: 2\n", "a: {b: 1}\n", "a: !!int 1\n", "just text\n"}) {
    absl::StatusOr<YamlNode> root = ParseYamlSubset(text, "c.yaml");
    EXPECT_EQ(root.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(root.status().message(), HasSubstr("c.yaml: line ")) << text;
  }
}

TEST(YamlSubsetTest, DeepNestingIsRefused) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += std::string(i, ' ') + "k:\n";
  EXPECT_EQ(ParseYamlSubset(text, "c.yaml").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard
