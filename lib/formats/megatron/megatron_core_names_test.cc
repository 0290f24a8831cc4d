#include "lib/formats/megatron/megatron_core_names.h"

#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

struct Case {
  std::string name;
  std::string key;
  int64_t layer;
  int tp_axis;
};

TEST(MegatronCoreNameTest, LegacyNamesMapToTransformerEngineKeys) {
  const std::string l = "language_model.encoder.layers.3.";
  const Case cases[] = {
      {"language_model.embedding.word_embeddings.weight", "embedding.word_embeddings.weight", -1,
       0},
      {"language_model.embedding.position_embeddings.weight",
       "embedding.position_embeddings.weight", -1, -1},
      {"language_model.output_layer.weight", "output_layer.weight", -1, 0},
      {"language_model.encoder.final_layernorm.weight", "decoder.final_layernorm.weight", -1, -1},
      {"language_model.transformer.final_layernorm.bias", "decoder.final_layernorm.bias", -1, -1},
      {l + "input_layernorm.weight", "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
       3, -1},
      {l + "input_layernorm.bias", "decoder.layers.self_attention.linear_qkv.layer_norm_bias", 3,
       -1},
      {l + "self_attention.query_key_value.weight", "decoder.layers.self_attention.linear_qkv.weight",
       3, 0},
      {l + "self_attention.query_key_value.bias", "decoder.layers.self_attention.linear_qkv.bias", 3,
       0},
      {l + "self_attention.dense.weight", "decoder.layers.self_attention.linear_proj.weight", 3, 1},
      {l + "self_attention.dense.bias", "decoder.layers.self_attention.linear_proj.bias", 3, -1},
      {l + "self_attention.k_layernorm.weight", "decoder.layers.self_attention.k_layernorm.weight",
       3, -1},
      {l + "post_attention_layernorm.weight", "decoder.layers.mlp.linear_fc1.layer_norm_weight", 3,
       -1},
      {l + "mlp.dense_h_to_4h.weight", "decoder.layers.mlp.linear_fc1.weight", 3, 0},
      {l + "mlp.dense_h_to_4h.bias", "decoder.layers.mlp.linear_fc1.bias", 3, 0},
      {l + "mlp.dense_4h_to_h.weight", "decoder.layers.mlp.linear_fc2.weight", 3, 1},
      {l + "mlp.dense_4h_to_h.bias", "decoder.layers.mlp.linear_fc2.bias", 3, -1},
      {"language_model.transformer.layers.12.mlp.dense_h_to_4h.weight",
       "decoder.layers.mlp.linear_fc1.weight", 12, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<MegatronCoreTensor> core =
        MegatronCoreName(c.name, MegatronCoreSpec::kTransformerEngine);
    ASSERT_TRUE(core.ok()) << core.status();
    EXPECT_EQ(core->key, c.key);
    EXPECT_EQ(core->layer, c.layer);
    EXPECT_EQ(core->tp_axis, c.tp_axis);
    EXPECT_FALSE(core->skipped);
  }
}

TEST(MegatronCoreNameTest, LocalSpecNamesTheNormsOnTheirOwn) {
  const std::string l = "language_model.encoder.layers.0.";
  absl::StatusOr<MegatronCoreTensor> input =
      MegatronCoreName(l + "input_layernorm.weight", MegatronCoreSpec::kLocal);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->key, "decoder.layers.input_layernorm.weight");
  absl::StatusOr<MegatronCoreTensor> pre_mlp =
      MegatronCoreName(l + "post_attention_layernorm.bias", MegatronCoreSpec::kLocal);
  ASSERT_TRUE(pre_mlp.ok()) << pre_mlp.status();
  EXPECT_EQ(pre_mlp->key, "decoder.layers.pre_mlp_layernorm.bias");
}

TEST(MegatronCoreNameTest, MegatronCoreNamesAreStackedAgainAndKept) {
  absl::StatusOr<MegatronCoreTensor> qkv = MegatronCoreName(
      "decoder.layers.5.self_attention.linear_qkv.weight", MegatronCoreSpec::kTransformerEngine);
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  EXPECT_EQ(qkv->key, "decoder.layers.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv->layer, 5);
  EXPECT_EQ(qkv->tp_axis, 0);
  EXPECT_EQ(qkv->UnstackedName(), "decoder.layers.5.self_attention.linear_qkv.weight");
  // A key this table does not know keeps its name, replicated.
  absl::StatusOr<MegatronCoreTensor> other =
      MegatronCoreName("decoder.layers.1.linear.weight", MegatronCoreSpec::kTransformerEngine);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->key, "decoder.layers.linear.weight");
  EXPECT_EQ(other->layer, 1);
  EXPECT_EQ(other->tp_axis, -1);
  absl::StatusOr<MegatronCoreTensor> flat =
      MegatronCoreName("output_layer.steps", MegatronCoreSpec::kTransformerEngine);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(flat->key, "output_layer.steps");
  EXPECT_EQ(flat->layer, -1);
  EXPECT_EQ(flat->UnstackedName(), "output_layer.steps");
}

TEST(MegatronCoreNameTest, ExtraStateIsSkipped) {
  absl::StatusOr<MegatronCoreTensor> extra = MegatronCoreName(
      "decoder.layers.0.mlp.linear_fc1._extra_state", MegatronCoreSpec::kTransformerEngine);
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_TRUE(extra->skipped);
}

// The router and experts of a mixture-of-experts layer: legacy (an imported Mixtral's) and
// Megatron-Core names, each expert stacked over the layers and the experts under
// SequentialMLP's key.
TEST(MegatronCoreNameTest, ExpertsStackUnderSequentialMlpKeys) {
  struct Case {
    const char* name;
    const char* key;
    int64_t layer;
    int64_t expert;
    int tp_axis;
  };
  for (const Case& c : {
           Case{"language_model.encoder.layers.3.mlp.router.weight",
                "decoder.layers.mlp.router.weight", 3, -1, -1},
           Case{"language_model.encoder.layers.1.mlp.experts.local_experts.7.dense_h_to_4h.weight",
                "decoder.layers.mlp.experts.experts.linear_fc1.weight", 1, 7, 0},
           Case{"language_model.encoder.layers.0.mlp.experts.local_experts.2.dense_4h_to_h.weight",
                "decoder.layers.mlp.experts.experts.linear_fc2.weight", 0, 2, 1},
           Case{"language_model.encoder.layers.2.mlp.local_experts.3.dense_h_to_4h.weight",
                "decoder.layers.mlp.experts.experts.linear_fc1.weight", 2, 3, 0},
           Case{"language_model.encoder.layers.2.mlp.experts.local_experts.6.linear_fc1.weight",
                "decoder.layers.mlp.experts.experts.linear_fc1.weight", 2, 6, 0},
           Case{"decoder.layers.4.mlp.experts.local_experts.5.linear_fc2.bias",
                "decoder.layers.mlp.experts.experts.linear_fc2.bias", 4, 5, -1},
           Case{"decoder.layers.2.mlp.router.weight", "decoder.layers.mlp.router.weight", 2, -1,
                -1},
           // The shared experts are a dense MLP: split over TP as one.
           Case{"decoder.layers.1.mlp.shared_experts.linear_fc1.weight",
                "decoder.layers.mlp.shared_experts.linear_fc1.weight", 1, -1, 0},
           Case{"decoder.layers.1.mlp.shared_experts.linear_fc2.weight",
                "decoder.layers.mlp.shared_experts.linear_fc2.weight", 1, -1, 1},
       }) {
    absl::StatusOr<MegatronCoreTensor> core =
        MegatronCoreName(c.name, MegatronCoreSpec::kTransformerEngine);
    ASSERT_TRUE(core.ok()) << c.name << ": " << core.status();
    EXPECT_EQ(core->key, c.key) << c.name;
    EXPECT_EQ(core->layer, c.layer) << c.name;
    EXPECT_EQ(core->expert, c.expert) << c.name;
    EXPECT_EQ(core->tp_axis, c.tp_axis) << c.name;
  }
  EXPECT_EQ(MegatronCoreName("decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight",
                             MegatronCoreSpec::kLocal)
                ->UnstackedName(),
            "decoder.layers.3.mlp.experts.local_experts.12.linear_fc1.weight");
}

TEST(MegatronCoreNameTest, LegacyNameOutsideTheGptIsRefusedByName) {
  absl::StatusOr<MegatronCoreTensor> core = MegatronCoreName(
      "language_model.embedding.tokentype_embeddings.weight", MegatronCoreSpec::kTransformerEngine);
  ASSERT_EQ(core.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core.status().message(),
            "tensor \"language_model.embedding.tokentype_embeddings.weight\" has no Megatron-Core "
            "counterpart: only a GPT's word and position embeddings, layer norms, fused QKV (and "
            "q/k norms), attention output, MLP, final norm and output layer map onto "
            "Megatron-Core names");
}

// The torch_dist reader's names (layers unstacked) back to Megatron-LM's, in both specs: every
// legacy name goes to Megatron-Core and back to itself.
TEST(MegatronCoreNameTest, MegatronCoreNamesMapBackToMegatronLm) {
  const std::string l = "language_model.encoder.layers.3.";
  for (const std::string legacy :
       {std::string("language_model.embedding.word_embeddings.weight"),
        std::string("language_model.embedding.position_embeddings.weight"),
        std::string("language_model.output_layer.weight"),
        std::string("language_model.encoder.final_layernorm.weight"),
        l + "input_layernorm.weight", l + "input_layernorm.bias",
        l + "self_attention.query_key_value.weight", l + "self_attention.query_key_value.bias",
        l + "self_attention.dense.weight", l + "self_attention.q_layernorm.weight",
        l + "post_attention_layernorm.weight", l + "mlp.dense_h_to_4h.weight",
        l + "mlp.dense_4h_to_h.weight", l + "mlp.dense_4h_to_h.bias"}) {
    for (const MegatronCoreSpec spec : {MegatronCoreSpec::kTransformerEngine,
                                        MegatronCoreSpec::kLocal}) {
      auto core = MegatronCoreName(legacy, spec);
      ASSERT_TRUE(core.ok()) << core.status();
      auto back = MegatronLmName(core->UnstackedName());
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->value_or("<none>"), legacy) << core->UnstackedName();
    }
  }
  auto extra = MegatronLmName("decoder.layers.0.self_attention.linear_qkv._extra_state");
  ASSERT_TRUE(extra.ok()) << extra.status();
  EXPECT_FALSE(extra->has_value());
  auto router = MegatronLmName("decoder.layers.0.mlp.router.weight");
  EXPECT_EQ(router.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(router.status().message(),
            "tensor \"decoder.layers.0.mlp.router.weight\" has no Megatron-LM counterpart: only "
            "a GPT's word and position embeddings, layer norms, fused QKV (and q/k norms), "
            "attention output, MLP, final norm and output layer map onto Megatron-LM names");
}

}  // namespace
}  // namespace reshard
