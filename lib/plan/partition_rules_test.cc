#include "lib/plan/partition_rules.h"

#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace {

constexpr char kGood[] = R"({"rules": [
  {"pattern": "attn\\.(q|k|v)_proj\\.weight$", "split_dim": 0},
  {"pattern": "o_proj\\.weight$", "split_dim": -1},
  {"pattern": ".*", "replicate": true}
]})";

TEST(PartitionRulesTest, GoodJson) {
  auto rules = PartitionRules::FromJson(kGood, "rules.json");
  ASSERT_TRUE(rules.ok()) << rules.status();
  ASSERT_EQ(rules->rules().size(), 3u);
  EXPECT_FALSE(rules->empty());
  EXPECT_EQ(rules->rules()[0].split_dim, 0);
  EXPECT_FALSE(rules->rules()[0].replicate);
  EXPECT_EQ(rules->rules()[1].split_dim, -1);
  EXPECT_TRUE(rules->rules()[2].replicate);

  auto q = rules->Match("model.layers.0.attn.q_proj.weight");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(*q, &rules->rules()[0]);
  auto o = rules->Match("model.layers.0.attn.o_proj.weight");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(*o, &rules->rules()[1]);
  // Search, not full match; "$" anchors: ".weight.bias" is not matched by rule 0.
  auto bias = rules->Match("attn.q_proj.weight_scale");
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ(*bias, &rules->rules()[2]);
}

TEST(PartitionRulesTest, FromFile) {
  std::string dir = testing::TempDir() + "/rules_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/rules.json";
  std::ofstream(path) << kGood;
  auto rules = PartitionRules::FromFile(path);
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_EQ(rules->rules().size(), 3u);
  auto missing = PartitionRules::FromFile(dir + "/missing.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("missing.json"), absl::string_view::npos);
}

void ExpectInvalid(const std::string& json, const std::string& substring) {
  auto rules = PartitionRules::FromJson(json, "my_rules.json");
  ASSERT_FALSE(rules.ok()) << json;
  EXPECT_EQ(rules.status().code(), absl::StatusCode::kInvalidArgument) << rules.status();
  EXPECT_NE(rules.status().message().find("my_rules.json"), absl::string_view::npos)
      << rules.status();
  EXPECT_NE(rules.status().message().find(substring), absl::string_view::npos)
      << "expected \"" << substring << "\" in: " << rules.status();
}

TEST(PartitionRulesTest, BadRegex) {
  ExpectInvalid(R"({"rules": [{"pattern": "a(b", "split_dim": 0}]})", "bad pattern");
  ExpectInvalid(
      R"({"rules": [{"pattern": ".*", "replicate": true}, {"pattern": "[z-a]", "split_dim": 0}]})",
      "rule #1");
}

TEST(PartitionRulesTest, BothOrNeitherOfSplitDimAndReplicate) {
  ExpectInvalid(R"({"rules": [{"pattern": "x", "split_dim": 0, "replicate": true}]})",
                "exactly one");
  ExpectInvalid(R"({"rules": [{"pattern": "x"}]})", "exactly one");
  ExpectInvalid(R"({"rules": [{"pattern": "x", "replicate": false}]})", "exactly one");
}

TEST(PartitionRulesTest, Unit) {
  auto rules = PartitionRules::FromJson(
      R"({"rules": [{"pattern": "qkv", "split_dim": 0, "unit": 36}]})", "test");
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_EQ(rules->rules()[0].unit, 36);
  EXPECT_EQ(PartitionRules::FromJson(R"({"rules": [{"pattern": "x", "split_dim": 0}]})", "t")
                ->rules()[0]
                .unit,
            1);
  ExpectInvalid(R"({"rules": [{"pattern": "x", "split_dim": 0, "unit": 0}]})", "\"unit\"");
  ExpectInvalid(R"({"rules": [{"pattern": "x", "split_dim": 0, "unit": "3"}]})", "\"unit\"");
  ExpectInvalid(R"({"rules": [{"pattern": "x", "replicate": true, "unit": 3}]})", "\"unit\"");
}

TEST(PartitionRulesTest, UnknownField) {
  ExpectInvalid(R"({"rules": [{"pattern": "x", "split_dim": 0, "splitdim": 1}]})",
                "unknown field \"splitdim\"");
}

TEST(PartitionRulesTest, MalformedDocuments) {
  ExpectInvalid("{not json", "invalid JSON");
  ExpectInvalid(R"([1, 2])", "rules");
  ExpectInvalid(R"({"rules": {}})", "rules");
  ExpectInvalid(R"({"rules": [{"split_dim": 0}]})", "pattern");
  ExpectInvalid(R"({"rules": [{"pattern": 3, "split_dim": 0}]})", "pattern");
  ExpectInvalid(R"({"rules": [{"pattern": "x", "split_dim": "0"}]})", "split_dim");
  ExpectInvalid(R"({"rules": [{"pattern": "x", "split_dim": 1.5}]})", "split_dim");
  ExpectInvalid(R"({"rules": [{"pattern": "x", "split_dim": 1000}]})", "split_dim");
}

TEST(PartitionRulesTest, NegativeSplitDimResolution) {
  PartitionRule rule{"w", false, -1};
  EXPECT_EQ(*ResolveSplitDim(rule, 2, "w"), 1);
  EXPECT_EQ(*ResolveSplitDim(rule, 4, "w"), 3);
  rule.split_dim = -2;
  EXPECT_EQ(*ResolveSplitDim(rule, 2, "w"), 0);
  auto bad = ResolveSplitDim(rule, 1, "layer.w");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("layer.w"), absl::string_view::npos) << bad.status();
  rule.split_dim = 2;
  EXPECT_FALSE(ResolveSplitDim(rule, 2, "w").ok());
  EXPECT_EQ(*ResolveSplitDim(rule, 3, "w"), 2);
  // Scalars cannot be split at all.
  rule.split_dim = 0;
  EXPECT_FALSE(ResolveSplitDim(rule, 0, "w").ok());
}

TEST(PartitionRulesTest, FirstMatchWins) {
  auto rules = PartitionRules::FromJson(
      R"({"rules": [{"pattern": "weight", "split_dim": 1},
                    {"pattern": "q_proj\\.weight", "split_dim": 0},
                    {"pattern": ".*", "replicate": true}]})",
      "r");
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto match = rules->Match("q_proj.weight");
  ASSERT_TRUE(match.ok());
  EXPECT_EQ((*match)->pattern, "weight");
  EXPECT_EQ((*match)->split_dim, 1);
  auto other = rules->Match("q_proj.bias");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->replicate);
}

TEST(PartitionRulesTest, NoMatchIsNotFound) {
  auto rules = PartitionRules::Create({{"^a$", false, 0}});
  ASSERT_TRUE(rules.ok());
  auto match = rules->Match("ab");
  ASSERT_FALSE(match.ok());
  EXPECT_EQ(match.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(match.status().message().find("\"ab\""), absl::string_view::npos);
  EXPECT_TRUE(rules->Match("a").ok());
}

TEST(PartitionRulesTest, EmptyRuleList) {
  auto rules = PartitionRules::FromJson(R"({"rules": []})", "r");
  ASSERT_TRUE(rules.ok());
  EXPECT_TRUE(rules->empty());
  EXPECT_FALSE(rules->Match("x").ok());
}

// Formats register presets; FromFile takes a registered name that is no file as the preset.
TEST(PartitionRulesTest, RegisteredPresetByName) {
  EXPECT_FALSE(FindPartitionRulePreset("partition-rules-test-preset").has_value());
  EXPECT_EQ(PartitionRulePreset("partition-rules-test-preset"), "");
  RegisterPartitionRulePreset("partition-rules-test-preset",
                              {{"qkv", false, 0, 3}, {"fc1", false, -1, 1, 64}, {".*", true}});
  auto names = PartitionRulePresetNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "partition-rules-test-preset"), names.end());
  auto rules = PartitionRules::FromFile("partition-rules-test-preset");
  ASSERT_TRUE(rules.ok()) << rules.status();
  ASSERT_EQ(rules->rules().size(), 3u);
  EXPECT_EQ(rules->rules()[0].fused, 3);
  EXPECT_EQ(rules->rules()[1].split_dim, -1);
  EXPECT_EQ(rules->rules()[1].unit, 64);
  EXPECT_TRUE(rules->rules()[2].replicate);
}

// The JSON form reads back as the same rules.
TEST(PartitionRulesTest, ToJsonRoundTrips) {
  const std::vector<PartitionRule> rules = {
      {"q\\.weight$", false, 0, 1, 1}, {"qkv", false, 1, 3, 1}, {"u", false, 0, 1, 192},
      {".*", true, 0, 1, 1}};
  const std::string json = PartitionRulesToJson(rules);
  auto back = PartitionRules::FromJson(json, "round trip");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
  ASSERT_EQ(back->rules().size(), rules.size());
  for (size_t i = 0; i < rules.size(); ++i) {
    EXPECT_EQ(back->rules()[i].pattern, rules[i].pattern);
    EXPECT_EQ(back->rules()[i].replicate, rules[i].replicate);
    EXPECT_EQ(back->rules()[i].split_dim, rules[i].split_dim);
    EXPECT_EQ(back->rules()[i].fused, rules[i].fused);
    EXPECT_EQ(back->rules()[i].unit, rules[i].unit);
  }
}

}  // namespace
}  // namespace reshard
