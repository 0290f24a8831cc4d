#include "lib/formats/hf/hf_config.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/testing/status_matchers.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;
using Files = std::vector<std::pair<std::string, std::string>>;

// A tokenizer.json as the tokenizers library writes it: the special tokens in added_tokens and
// in a BPE vocab, a merges list, and other sections that are skipped.
constexpr char kTokenizerJson[] = R"({
  "version": "1.0",
  "truncation": null,
  "added_tokens": [
    {"id": 7, "content": "<|begin|>", "single_word": false, "special": true},
    {"id": 8, "content": "<|end|>", "single_word": false, "special": true}
  ],
  "normalizer": null,
  "post_processor": {"type": "TemplateProcessing", "special_tokens": {"<|begin|>": {"id": "<|begin|>", "ids": [7]}}},
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<|begin|>": 7, "<|end|>": 8, "<unk>": 9},
            "merges": ["a b"]}
})";

// The tokenizer files in a fresh folder, as (name, path).
Files Write(const std::string& tag, const std::vector<std::pair<std::string, std::string>>& named) {
  const std::string dir = MakeTempDir(tag);
  Files files;
  for (const auto& [name, text] : named) {
    WriteAll(dir + "/" + name, text);
    files.emplace_back(name, dir + "/" + name);
  }
  return files;
}

void ExpectIds(const Files& files, std::optional<int64_t> bos, std::optional<int64_t> eos) {
  const absl::StatusOr<HfSpecialTokens> ids = HfSpecialTokenIds(files);
  ASSERT_OK(ids);
  EXPECT_EQ(ids->bos_token_id, bos);
  EXPECT_EQ(ids->eos_token_id, eos);
}

TEST(HfSpecialTokenIdsTest, IdsOfTheTokensTheConfigNames) {
  // bos_token as a string, eos_token as an AddedToken; special_tokens_map.json agrees.
  const Files files = Write(
      "ids", {{"tokenizer.json", kTokenizerJson},
              {"tokenizer_config.json",
               R"({"bos_token": "<|begin|>", "eos_token": {"content": "<|end|>", "lstrip": false},
                   "chat_template": "{{ messages }}"})"},
              {"special_tokens_map.json", R"({"eos_token": "<|end|>"})"}});
  ExpectIds(files, 7, 8);
}

TEST(HfSpecialTokenIdsTest, IdFromTheVocabAloneAndNoneForANullToken) {
  // "<unk>" is only in model.vocab; Qwen2's tokenizer_config.json has "bos_token": null.
  const Files files =
      Write("vocab", {{"tokenizer.json", kTokenizerJson},
                      {"special_tokens_map.json", R"({"bos_token": null, "eos_token": "<unk>"})"}});
  ExpectIds(files, std::nullopt, 9);
}

TEST(HfSpecialTokenIdsTest, AmbiguousTokensAreLeftOut) {
  // The two files name different eos tokens; "<|begin|>" has two ids (added_tokens 7, vocab 3).
  std::string two_ids = kTokenizerJson;
  two_ids.replace(two_ids.find("\"<|begin|>\": 7"), 14, "\"<|begin|>\": 3");
  const Files files =
      Write("ambiguous",
            {{"tokenizer.json", two_ids},
             {"tokenizer_config.json", R"({"bos_token": "<|begin|>", "eos_token": "<|end|>"})"},
             {"special_tokens_map.json", R"({"eos_token": "<unk>"})"}});
  ExpectIds(files, std::nullopt, std::nullopt);
}

TEST(HfSpecialTokenIdsTest, NoTokenizerJsonNoIds) {
  // A sentencepiece tokenizer.model alone does not give ids.
  const Files files = Write(
      "spm", {{"tokenizer.model", "spm"}, {"tokenizer_config.json", R"({"bos_token": "<s>"})"}});
  ExpectIds(files, std::nullopt, std::nullopt);
}

TEST(HfSpecialTokenIdsTest, CorruptJsonIsDataLossWithTheFileAndOffset) {
  const Files files = Write("corrupt", {{"tokenizer.json", R"({"added_tokens": [)"},
                                        {"tokenizer_config.json", R"({"bos_token": "<s>"})"}});
  const absl::StatusOr<HfSpecialTokens> ids = HfSpecialTokenIds(files);
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(ids.status().message()),
              HasSubstr(files[0].second + ": not valid JSON at byte offset 18"));
}

TEST(MakeHfConfigTest, MixtralKeysAndTopKBeyondTheExpertsRefused) {
  // No args: every key from --config, as a checkpoint without args would need.
  HfConfigSources sources;
  sources.family = *FindHfFamily("mixtral");
  sources.overrides = nlohmann::ordered_json::parse(
      R"({"hidden_size": 8, "intermediate_size": 6, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2,
          "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
          "vocab_size": 20, "num_local_experts": 8, "num_experts_per_tok": 2})");
  const absl::StatusOr<HfModelConfig> config = MakeHfConfig(sources);
  ASSERT_OK(config);
  EXPECT_EQ(config->experts, 8);
  EXPECT_EQ(config->json["architectures"], nlohmann::ordered_json::array({"MixtralForCausalLM"}));
  EXPECT_TRUE(config->json["sliding_window"].is_null());
  EXPECT_FALSE(config->json.contains("attention_bias"));
  EXPECT_FALSE(config->json.contains("router_aux_loss_coef"));

  sources.overrides["num_experts_per_tok"] = 9;
  const absl::StatusOr<HfModelConfig> refused = MakeHfConfig(sources);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("config.json's num_experts_per_tok 9 is more than its 8 "
                        "num_local_experts"));
}

}  // namespace
}  // namespace reshard
