#include "lib/formats/hf/hf_output.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Kind = StructureNode::Kind;

// A merged Megatron-LM Llama-style model: hidden 8, 4 heads of 2, `groups` query groups, ffn 12,
// 2 layers, 24 padded vocabulary rows; metadata only.
struct Fixture {
  InputModel model;
  Catalog catalog;
};

Fixture Llama(int64_t groups, std::map<std::string, int64_t> int_args = {}) {
  Fixture f;
  f.model.format = "megatron";
  f.catalog.format = "megatron";
  f.catalog.files.push_back({"/in/model_optim_rng.pt", 1 << 30});
  auto add = [&](const std::string& name, Shape shape) {
    CatalogTensor tensor{name, DType::kF32, shape, {}};
    tensor.pieces.push_back({0, 0, Box::Full(shape), RowMajorStrides(shape)});
    f.catalog.tensors.push_back(std::move(tensor));
  };
  const std::string l = "language_model.encoder.layers.";
  add("language_model.embedding.word_embeddings.weight", {24, 8});
  for (int i = 0; i < 2; ++i) {
    const std::string p = absl::StrCat(l, i, ".");
    add(p + "input_layernorm.weight", {8});
    add(p + "self_attention.query_key_value.weight", {(4 + 2 * groups) * 2, 8});
    add(p + "self_attention.dense.weight", {8, 8});
    add(p + "post_attention_layernorm.weight", {8});
    add(p + "mlp.dense_h_to_4h.weight", {24, 8});
    add(p + "mlp.dense_4h_to_h.weight", {8, 12});
  }
  add("language_model.encoder.final_layernorm.weight", {8});
  f.catalog.Reindex();
  std::map<std::string, int64_t> values = {
      {"hidden_size", 8},  {"ffn_hidden_size", 12},       {"num_layers", 2},
      {"num_attention_heads", 4}, {"group_query_attention", 1}, {"num_query_groups", groups},
      {"kv_channels", 2},  {"max_position_embeddings", 64}, {"rotary_base", 10000},
      {"vocab_size", 20},  {"padded_vocab_size", 24}};
  for (const auto& [key, value] : int_args) values[key] = value;
  StructureNode args = StructureNode::Dict();
  for (const auto& [key, value] : values) {
    if (value >= 0) args.Add(StructureNode::String(key), StructureNode::Int(value));
  }
  StructureNode eps;
  eps.kind = Kind::kFloat;
  eps.real = 1e-5;
  args.Add(StructureNode::String("norm_epsilon"), eps);
  f.model.training_state.values["megatron.args"] = std::move(args);
  return f;
}

absl::StatusOr<ArrangedOutput> Arrange(const Fixture& f, HfExportOptions hf = {}) {
  ArrangeRequest request{f.model, f.catalog};
  request.hf = std::move(hf);
  return HfOutput().Arrange({}, request);
}

const OutputTensor* Find(const ArrangedOutput& arranged, const std::string& name) {
  for (const OutputFileLayout& file : arranged.layout.files) {
    for (const OutputTensor& tensor : file.tensors) {
      if (tensor.name == name) return &tensor;
    }
  }
  return nullptr;
}

TEST(HfOutputTest, SplitsQkvPerGroupAndFc1AsRegionsOfViews) {
  auto arranged = Arrange(Llama(2));
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const int base = 14;  // catalog tensors
  const OutputTensor* k = Find(*arranged, "model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  ASSERT_GE(k->source, base);
  EXPECT_EQ(arranged->extra_tensors[k->source - base].shape, (Shape{2, 4, 2, 8}));
  EXPECT_EQ(k->region.origin, (std::vector<int64_t>{0, 2, 0, 0}));
  EXPECT_EQ(k->region.extent, (std::vector<int64_t>{2, 1, 2, 8}));
  EXPECT_EQ(k->shape(), (Shape{4, 8}));
  const OutputTensor* up = Find(*arranged, "model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->region.origin, (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(up->shape(), (Shape{12, 8}));
  const OutputTensor* embed = Find(*arranged, "model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->region.extent, (std::vector<int64_t>{20, 8}));
  EXPECT_EQ(Find(*arranged, "lm_head.weight"), nullptr);
  ASSERT_EQ(arranged->layout.format_files.size(), 2u);
  const auto config = nlohmann::json::parse(arranged->layout.format_files[0].second);
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["vocab_size"], 20);
}

TEST(HfOutputTest, HeadsNotDivisibleByGroupsAreRefused) {
  auto arranged = Arrange(Llama(3));
  EXPECT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arranged.status().message(),
            "num_attention_heads 4 is not divisible by num_key_value_heads 3 (query groups): "
            "every group must hold the same number of query heads");
}

TEST(HfOutputTest, ArgsDisagreeingWithAShapeNameTheTensorAndBothShapes) {
  auto arranged = Arrange(Llama(2, {{"ffn_hidden_size", 16}}));
  EXPECT_EQ(arranged.status().message(),
            "tensor \"language_model.encoder.layers.0.mlp.dense_h_to_4h.weight\" has shape "
            "[24, 8], but config.json (hidden_size 8, num_attention_heads 4, num_key_value_heads "
            "2, head_dim 2, intermediate_size 16) makes it [32, 8]: the checkpoint's args (or "
            "--config) disagree with its weights");
}

TEST(HfOutputTest, MissingArgsWithoutConfigNameTheKeys) {
  auto arranged = Arrange(Llama(2, {{"rotary_base", -1}, {"vocab_size", -1}}));
  EXPECT_EQ(arranged.status().message(),
            "config.json needs rope_theta (from args.rotary_base), vocab_size (from --vocab-size "
            "or args.vocab_size), which the checkpoint's args do not record; give them in "
            "--config FILE (a JSON object of config.json keys) or give the true vocabulary with "
            "--vocab-size N");
  HfExportOptions hf;
  hf.vocab_size = 22;
  arranged = Arrange(Llama(2, {{"rotary_base", -1}}), hf);
  EXPECT_EQ(arranged.status().message(),
            "config.json needs rope_theta (from args.rotary_base), which the checkpoint's args do "
            "not record; give it in --config FILE (a JSON object of config.json keys)");
}

TEST(HfOutputTest, ExtraStateIsSkippedAndAQkvBiasOutsideQwen2IsRefused) {
  Fixture f = Llama(2);
  for (int i = 0; i < 2; ++i) {
    const std::string p = absl::StrCat("language_model.encoder.layers.", i, ".");
    f.catalog.tensors.push_back({p + "self_attention.core_attention._extra_state", DType::kU8,
                                 {4}, {{0, 0, Box::Full({4}), {1}}}});
    f.catalog.tensors.push_back({p + "self_attention.query_key_value.bias", DType::kF32,
                                 {16}, {{0, 0, Box::Full({16}), {1}}}});
  }
  f.catalog.Reindex();
  auto qwen2 = Arrange(f);  // auto: the bias makes it qwen2
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_NE(Find(*qwen2, "model.layers.1.self_attn.v_proj.bias"), nullptr);
  for (const OutputFileLayout& file : qwen2->layout.files) {
    for (const OutputTensor& tensor : file.tensors) {
      EXPECT_EQ(tensor.name.find("extra_state"), std::string::npos) << tensor.name;
    }
  }
  HfExportOptions hf;
  hf.family = "llama";
  EXPECT_EQ(Arrange(f, hf).status().message(),
            "tensor \"language_model.encoder.layers.0.self_attention.query_key_value.bias\" is a "
            "QKV bias, which family llama has no place for (qwen2 has: --family qwen2)");
}

// Llama(groups) under Megatron-DeepSpeed's pipeline names (GPTModelPipe's layer spec indices:
// 1 the embedding, 3 and 4 the layers, 6 the final norm).
Fixture PipeLlama(int64_t groups) {
  Fixture f = Llama(groups);
  for (CatalogTensor& tensor : f.catalog.tensors) {
    absl::string_view name = tensor.name;
    if (absl::ConsumePrefix(&name, "language_model.embedding.")) {
      tensor.name = absl::StrCat("1.", name);
    } else if (absl::ConsumePrefix(&name, "language_model.encoder.final_layernorm.")) {
      tensor.name = absl::StrCat("6.", name);
    } else if (absl::ConsumePrefix(&name, "language_model.encoder.layers.")) {
      tensor.name = absl::StrCat(3 + (name[0] - '0'), name.substr(1));
    }
  }
  f.catalog.Reindex();
  return f;
}

TEST(HfOutputTest, MegatronDeepSpeedPipelineNamesAreReadAsMegatronLMs) {
  const Fixture f = PipeLlama(2);
  auto arranged = Arrange(f);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const OutputTensor* down = Find(*arranged, "model.layers.1.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(f.catalog.tensors[down->source].name, "4.mlp.dense_4h_to_h.weight");
  const OutputTensor* norm = Find(*arranged, "model.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(f.catalog.tensors[norm->source].name, "6.weight");
  const OutputTensor* embed = Find(*arranged, "model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(f.catalog.tensors[embed->source].name, "1.word_embeddings.weight");
  EXPECT_EQ(embed->region.extent, (std::vector<int64_t>{20, 8}));
}

TEST(HfOutputTest, APipelineTensorNoFamilyHasIsRefusedUnderBothNames) {
  Fixture f = PipeLlama(2);
  f.catalog.tensors.push_back(
      {"3.mlp.shared_experts.linear_fc1.weight", DType::kF32, {4}, {{0, 0, Box::Full({4}), {1}}}});
  f.catalog.Reindex();
  EXPECT_EQ(Arrange(f).status().message(),
            "the Megatron-DeepSpeed pipeline tensor \"3.mlp.shared_experts.linear_fc1.weight\" "
            "(Megatron-LM's \"language_model.encoder.layers.0.mlp.shared_experts.linear_fc1."
            "weight\"): tensor \"language_model.encoder.layers.0.mlp.shared_experts.linear_fc1."
            "weight\" is part of the shared experts, which Mixtral (the mixture-of-experts family "
            "reshard writes) has no place for: models with shared experts or router biases "
            "(Qwen-MoE, DeepSeek-MoE) are not written by --format hf");
}

TEST(HfOutputTest, UnknownFamilyIsRefused) {
  HfExportOptions hf;
  hf.family = "gpt-j";
  auto arranged = Arrange(Llama(2), hf);
  EXPECT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(arranged.status().message().find("llama, mistral, qwen2, qwen3, gpt2"),
            std::string::npos);
}

}  // namespace
}  // namespace reshard
