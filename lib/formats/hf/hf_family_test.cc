#include "lib/formats/hf/hf_family.h"

#include "gtest/gtest.h"

namespace reshard {
namespace {

using Kind = MegatronRole::Kind;

TEST(MegatronTensorRoleTest, LegacyCoreAndNeMoNamesMapToTheSameRoles) {
  struct Case {
    const char* name;
    Kind kind;
    int64_t layer;
  };
  for (const Case& c : {
           Case{"language_model.embedding.word_embeddings.weight", Kind::kEmbedding, -1},
           Case{"embedding.word_embeddings.weight", Kind::kEmbedding, -1},
           Case{"language_model.encoder.layers.12.self_attention.query_key_value.weight",
                Kind::kQkvWeight, 12},
           Case{"language_model.transformer.layers.0.mlp.dense_h_to_4h.weight", Kind::kFc1Weight,
                0},
           Case{"decoder.layers.3.self_attention.linear_qkv.bias", Kind::kQkvBias, 3},
           Case{"decoder.layers.3.self_attention.linear_qkv.layer_norm_weight", Kind::kInputNorm,
                3},
           Case{"decoder.layers.1.mlp.linear_fc1.layer_norm_weight", Kind::kPostAttentionNorm, 1},
           Case{"decoder.layers.1.self_attention.k_layernorm.weight", Kind::kKNorm, 1},
           Case{"module.decoder.final_layernorm.weight", Kind::kFinalNorm, -1},
           Case{"model.language_model.output_layer.weight", Kind::kOutputLayer, -1},
           Case{"decoder.layers.0.mlp.linear_fc1._extra_state", Kind::kSkipped, -1},
           // GPT-2's biases and learned positions.
           Case{"language_model.embedding.position_embeddings.weight", Kind::kPositionEmbedding,
                -1},
           Case{"language_model.encoder.final_layernorm.bias", Kind::kFinalNormBias, -1},
           Case{"language_model.encoder.layers.2.input_layernorm.bias", Kind::kInputNormBias, 2},
           Case{"decoder.layers.2.mlp.linear_fc1.layer_norm_bias", Kind::kPostAttentionNormBias, 2},
           Case{"language_model.encoder.layers.0.self_attention.dense.bias",
                Kind::kAttentionOutputBias, 0},
           Case{"language_model.encoder.layers.0.mlp.dense_h_to_4h.bias", Kind::kFc1Bias, 0},
           Case{"decoder.layers.0.mlp.linear_fc2.bias", Kind::kFc2Bias, 0},
       }) {
    auto role = MegatronTensorRole(c.name);
    ASSERT_TRUE(role.ok()) << c.name << ": " << role.status();
    EXPECT_EQ(role->kind, c.kind) << c.name;
    EXPECT_EQ(role->layer, c.layer) << c.name;
  }
}

TEST(MegatronTensorRoleTest, RouterAndExpertsMapWithTheirGlobalExpertId) {
  struct Case {
    const char* name;
    Kind kind;
    int64_t layer;
    int64_t expert;
  };
  for (const Case& c : {
           Case{"decoder.layers.3.mlp.router.weight", Kind::kRouter, 3, -1},
           Case{"decoder.layers.3.mlp.experts.local_experts.7.linear_fc1.weight", Kind::kExpertFc1,
                3, 7},
           Case{"decoder.layers.0.mlp.experts.local_experts.12.linear_fc2.weight", Kind::kExpertFc2,
                0, 12},
           Case{"language_model.encoder.layers.1.mlp.experts.local_experts.0.dense_h_to_4h.weight",
                Kind::kExpertFc1, 1, 0},
           Case{"language_model.encoder.layers.1.mlp.experts.local_experts.5.dense_4h_to_h.weight",
                Kind::kExpertFc2, 1, 5},
       }) {
    auto role = MegatronTensorRole(c.name);
    ASSERT_TRUE(role.ok()) << c.name << ": " << role.status();
    EXPECT_EQ(role->kind, c.kind) << c.name;
    EXPECT_EQ(role->layer, c.layer) << c.name;
    EXPECT_EQ(role->expert, c.expert) << c.name;
  }
}

TEST(MegatronTensorRoleTest, SharedExpertsAndRouterBiasesAreRefusedAsOutOfScope) {
  auto shared = MegatronTensorRole("decoder.layers.0.mlp.shared_experts.linear_fc1.weight");
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shared.status().message(),
            "tensor \"decoder.layers.0.mlp.shared_experts.linear_fc1.weight\" is part of the "
            "shared experts, which Mixtral (the mixture-of-experts family reshard writes) has no "
            "place for: models with shared experts or router biases (Qwen-MoE, DeepSeek-MoE) are "
            "not written by --format hf");
  auto bias = MegatronTensorRole("decoder.layers.0.mlp.router.expert_bias");
  EXPECT_EQ(bias.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bias.status().message().find("is a router bias"), std::string::npos);
}

TEST(MegatronTensorRoleTest, TensorsWithoutCounterpartAreRefusedByName) {
  auto role = MegatronTensorRole("language_model.embedding.tokentype_embeddings.weight");
  EXPECT_EQ(role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(role.status().message().find("tokentype_embeddings"), std::string::npos);
}

TEST(ChooseHfFamilyTest, AutoDecidesFromTheEvidence) {
  EXPECT_EQ((*ChooseHfFamily("auto", {}))->id, "llama");
  EXPECT_EQ((*ChooseHfFamily("", {false, false, true}))->id, "mistral");
  EXPECT_EQ((*ChooseHfFamily("auto", {false, true, true}))->id, "qwen2");
  EXPECT_EQ((*ChooseHfFamily("auto", {true, true, false}))->id, "qwen3");
  EXPECT_EQ((*ChooseHfFamily("mistral", {}))->id, "mistral");
  // LayerNorm biases / learned positions decide before everything else.
  EXPECT_EQ((*ChooseHfFamily("auto", {false, true, false, true}))->id, "gpt2");
  EXPECT_EQ((*ChooseHfFamily("gpt2", {}))->id, "gpt2");
  // Experts make a Mixtral model whatever else the attention has.
  EXPECT_EQ((*ChooseHfFamily("auto", {false, false, true, false, true}))->id, "mixtral");
  EXPECT_EQ((*ChooseHfFamily("mixtral", {}))->id, "mixtral");
}

TEST(ChooseHfFamilyTest, UnknownFamilyListsFamiliesAndFlags) {
  auto family = ChooseHfFamily("falcon", {});
  EXPECT_EQ(family.status().message(),
            "unknown model family \"falcon\" for --format hf; the families are llama, mistral, "
            "qwen2, qwen3, gpt2, mixtral (--family F picks one, --family auto decides from the "
            "checkpoint; --config FILE overrides what the args say)");
}

}  // namespace
}  // namespace reshard
