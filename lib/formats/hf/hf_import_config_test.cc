#include "lib/formats/hf/hf_import_config.h"

#include <string>

#include "gtest/gtest.h"
#include "lib/testing/test_files.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Json = nlohmann::ordered_json;

// The message of `status`, which must be InvalidArgument.
std::string Invalid(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(HfImportConfigTest, ConfigBesideTheWeightsOrGivenByConfigFile) {
  const std::string folder = MakeTempDir("hf_import_config");
  WriteAll(folder + "/config.json", R"({"model_type": "llama"})");
  WriteAll(folder + "/other.json", R"({"model_type": "qwen2"})");
  for (const std::string& input :
       {folder, folder + "/", folder + "/model.safetensors", folder + "/pytorch_model.bin",
        folder + "/model.safetensors.index.json"}) {
    std::string path;
    auto config = ReadHfInputConfig(input, "", &path);
    ASSERT_TRUE(config.ok()) << input << ": " << config.status();
    EXPECT_EQ(path, folder + "/config.json") << input;
    EXPECT_EQ((*config)["model_type"], "llama") << input;
  }
  std::string path;
  auto given = ReadHfInputConfig(folder, folder + "/other.json", &path);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ(path, folder + "/other.json");
  EXPECT_EQ((*given)["model_type"], "qwen2");

  const std::string bare = MakeTempDir("hf_import_config_bare");
  EXPECT_EQ(Invalid(ReadHfInputConfig(bare, "", &path, kImportAsTorchDist).status())
                .find(bare + "/config.json not found: a Hugging Face model is imported into "
                             "Megatron-Core torch_dist"),
            0u);
  WriteAll(bare + "/config.json", "[1, 2]");
  EXPECT_EQ(Invalid(ReadHfInputConfig(bare, "", &path).status()),
            bare + "/config.json: not a JSON object");
}

TEST(HfImportConfigTest, FamilyFromModelTypeElseArchitectures) {
  auto family = HfImportFamilyOfConfig(
      Json{{"model_type", "mixtral"}, {"architectures", {"LlamaForCausalLM"}}}, "c.json",
      kImportAsMegatronLm);
  ASSERT_TRUE(family.ok()) << family.status();
  EXPECT_EQ((*family)->id, "mixtral");
  family = HfImportFamilyOfConfig(Json{{"architectures", {"Qwen3ForCausalLM"}}}, "c.json",
                                  kImportAsMegatronLm);
  ASSERT_TRUE(family.ok()) << family.status();
  EXPECT_EQ((*family)->id, "qwen3");
  EXPECT_EQ(
      Invalid(HfImportFamilyOfConfig(Json{{"model_type", "falcon"}}, "c.json", kImportAsMegatronLm)
                  .status()),
      "c.json describes a model of model_type \"falcon\" (architectures \"\"), which is "
      "none of the families reshard imports into Megatron-LM: llama, mistral, qwen2, "
      "qwen3, gpt2, mixtral (--family F reads the weights as one of them)");
}

TEST(HfImportConfigTest, SizesWithTheirDefaults) {
  const Json llama = {
      {"hidden_size", 8},       {"num_hidden_layers", 2},        {"num_attention_heads", 4},
      {"intermediate_size", 6}, {"max_position_embeddings", 32}, {"vocab_size", 10}};
  auto sizes = ReadHfImportSizes(llama, "c.json", **FindHfFamily("llama"), kImportAsMegatronLm);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->groups, 4);    // num_key_value_heads: the heads
  EXPECT_EQ(sizes->head_dim, 2);  // hidden / heads
  EXPECT_EQ(sizes->norm_epsilon, 1e-6);
  EXPECT_EQ(sizes->rope_theta, 10000.0);
  EXPECT_FALSE(sizes->tied);
  EXPECT_EQ(sizes->experts, 0);

  Json mixtral = llama;
  mixtral["num_local_experts"] = 8;
  mixtral["num_experts_per_tok"] = 2;
  sizes = ReadHfImportSizes(mixtral, "c.json", **FindHfFamily("mixtral"), kImportAsMegatronLm);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->experts, 8);
  EXPECT_EQ(sizes->top_k, 2);
  EXPECT_FALSE(sizes->aux_loss_coef.has_value());
  mixtral.erase("num_experts_per_tok");
  EXPECT_EQ(
      Invalid(ReadHfImportSizes(mixtral, "c.json", **FindHfFamily("mixtral"), kImportAsTorchDist)
                  .status()),
      "c.json has no num_experts_per_tok, which the Megatron-Core torch_dist args need");

  const Json gpt2 = {
      {"n_embd", 6}, {"n_layer", 1}, {"n_head", 3}, {"n_positions", 5}, {"vocab_size", 11}};
  sizes = ReadHfImportSizes(gpt2, "c.json", **FindHfFamily("gpt2"), kImportAsMegatronLm);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(sizes->ffn, 24);  // n_inner: 4 x n_embd
  EXPECT_EQ(sizes->groups, 3);
  EXPECT_TRUE(sizes->tied);
}

TEST(HfImportConfigTest, SavedTiedHeadMustBeShapedAsTheEmbedding) {
  Catalog catalog;
  catalog.tensors.push_back({"model.embed_tokens.weight", DType::kF32, {10, 8}, {}});
  catalog.Reindex();
  auto none = FindSavedTiedHead(catalog, **FindHfFamily("llama"), "c.json");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->head, -1);

  catalog.tensors.push_back({"lm_head.weight", DType::kF32, {10, 8}, {}});
  catalog.Reindex();
  auto saved = FindSavedTiedHead(catalog, **FindHfFamily("llama"), "c.json");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->head, 1);
  EXPECT_EQ(saved->embedding, 0);

  catalog.tensors[1].shape = {12, 8};
  EXPECT_EQ(Invalid(FindSavedTiedHead(catalog, **FindHfFamily("llama"), "c.json").status()),
            "tensor \"lm_head.weight\" is F32 [12, 8] but \"model.embed_tokens.weight\" is F32 "
            "[10, 8], while c.json says tie_word_embeddings: true (the head is the embedding)");
}

}  // namespace
}  // namespace reshard
