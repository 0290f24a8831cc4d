#include "lib/formats/megatron/megatron_output.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/plan/layout_builders.h"
#include "lib/plan/partition_rules.h"

namespace reshard {
namespace {

using Kind = StructureNode::Kind;

constexpr int64_t kHidden = 8;
constexpr int64_t kHeads = 2;
const std::string kEncoder = "language_model.encoder.";

StructureNode Int(int64_t value) {
  StructureNode node;
  node.kind = Kind::kInt;
  node.integer = value;
  return node;
}

StructureNode Str(const std::string& text) {
  StructureNode node;
  node.kind = Kind::kString;
  node.text = text;
  return node;
}

// The args' attributes, as the reader carries a Namespace's state.
StructureNode Args(const std::map<std::string, int64_t>& values) {
  StructureNode dict;
  dict.kind = Kind::kDict;
  for (const auto& [key, value] : values) {
    dict.keys.push_back(Str(key));
    dict.values.push_back(Int(value));
  }
  return dict;
}

// A float tensor read whole from the catalog's first file.
void AddWhole(Catalog& catalog, const std::string& name, const Shape& shape) {
  catalog.tensors.push_back({name, DType::kF32, shape, {}});
  catalog.tensors.back().pieces.push_back({0, 0, Box::Full(shape), RowMajorStrides(shape)});
}

// A Megatron-LM GPT of `layers` layers (hidden 8, 2 heads, padded vocabulary `rows`), merged
// as the reader merges it: global layer numbers, metadata only.
InputModel Model(int layers, int64_t rows, bool tied, std::map<std::string, int64_t> args = {}) {
  InputModel model;
  model.format = kMegatronFormatId;
  Catalog catalog;
  catalog.format = kMegatronFormatId;
  catalog.files.push_back({"/in/model_optim_rng.pt", 1 << 30});
  auto add = [&](const std::string& name, Shape shape) { AddWhole(catalog, name, shape); };
  add("language_model.embedding.word_embeddings.weight", {rows, kHidden});
  add("language_model.embedding.position_embeddings.weight", {12, kHidden});
  for (int i = 0; i < layers; ++i) {
    const std::string l = absl::StrCat(kEncoder, "layers.", i, ".");
    add(l + "input_layernorm.weight", {kHidden});
    add(l + "self_attention.query_key_value.weight", {3 * kHidden, kHidden});
    add(l + "self_attention.dense.weight", {kHidden, kHidden});
    add(l + "mlp.dense_h_to_4h.weight", {4 * kHidden, kHidden});
    add(l + "mlp.dense_4h_to_h.weight", {kHidden, 4 * kHidden});
  }
  add(kEncoder + "final_layernorm.weight", {kHidden});
  if (!tied) add("language_model.output_layer.weight", {rows, kHidden});
  catalog.Reindex();
  model.parts.push_back(std::move(catalog));
  model.default_rules = MegatronPartitionRules(false, 3 * kHidden / kHeads);
  std::map<std::string, int64_t> all = {{"num_layers", layers},
                                        {"num_attention_heads", kHeads},
                                        {"tensor_model_parallel_size", 1},
                                        {"pipeline_model_parallel_size", 1},
                                        {"make_vocab_size_divisible_by", 8},
                                        {"padded_vocab_size", rows},
                                        {"world_size", 2},
                                        {"data_parallel_size", 2},
                                        {"rank", 0}};
  for (const auto& [key, value] : args) all[key] = value;
  model.training_state.values["megatron.args"] = Args(all);
  model.training_state.values["megatron.iteration"] = Int(100);
  StructureNode version;
  version.kind = Kind::kFloat;
  version.real = 3.0;
  model.training_state.values["megatron.checkpoint_version"] = version;
  return model;
}

// What the engine does for `reshard --parts tp --pipeline-parts pp --expert-parts ep --format
// megatron` (0: the flag left out).
absl::StatusOr<ArrangedOutput> Arrange(const InputModel& model, int tp, int pp, int ep = 0) {
  const MegatronOutput output;
  auto rules = PartitionRules::Create(model.default_rules);
  EXPECT_TRUE(rules.ok()) << rules.status();
  auto viewed = ViewFusedTensors(model.parts[0], *rules);
  EXPECT_TRUE(viewed.ok()) << viewed.status();
  auto layout = BuildSplitLayout(*viewed, *rules, tp, DTypePolicy::kKeep, output.naming());
  if (!layout.ok()) return layout.status();
  ArrangeRequest request{model, *viewed};
  request.consolidate = false;
  request.parts = tp;
  request.pipeline_parts = pp;
  request.expert_parts = ep;
  return output.Arrange(*std::move(layout), request);
}

// A Megatron-Core mixture-of-experts GPT (names as the reader merges a legacy-folder save:
// every expert once under its global id) of 2 layers, `experts` experts per layer, SwiGLU
// experts (fc1 [2f, h]) and a router; or, `experts` 0, the same model with a dense MLP.
InputModel MoEModel(int experts, bool grouped) {
  InputModel model;
  model.format = kMegatronFormatId;
  Catalog catalog;
  catalog.format = kMegatronFormatId;
  catalog.files.push_back({"/in/model_optim_rng.pt", 1 << 30});
  auto add = [&](const std::string& name, Shape shape) { AddWhole(catalog, name, shape); };
  add("embedding.word_embeddings.weight", {32, kHidden});
  for (int i = 0; i < 2; ++i) {
    const std::string l = absl::StrCat("decoder.layers.", i, ".");
    add(l + "self_attention.linear_qkv.weight", {3 * kHidden, kHidden});
    add(l + "self_attention.linear_proj.weight", {kHidden, kHidden});
    add(l + "pre_mlp_layernorm.weight", {kHidden});
    if (experts == 0) {
      add(l + "mlp.linear_fc1.weight", {8, kHidden});
      add(l + "mlp.linear_fc2.weight", {kHidden, 4});
      continue;
    }
    add(l + "mlp.router.weight", {experts, kHidden});
    for (int g = 0; g < experts; ++g) {
      const std::string e = absl::StrCat(l, "mlp.experts.local_experts.", g, ".");
      add(e + "linear_fc1.weight", {8, kHidden});
      add(e + "linear_fc2.weight", {kHidden, 4});
    }
  }
  add("decoder.final_layernorm.weight", {kHidden});
  add("output_layer.weight", {32, kHidden});
  catalog.Reindex();
  model.parts.push_back(std::move(catalog));
  model.default_rules = MegatronPartitionRules(/*swiglu=*/true, 3 * kHidden / kHeads);
  std::map<std::string, int64_t> args = {{"num_layers", 2},
                                         {"num_attention_heads", kHeads},
                                         {"tensor_model_parallel_size", 2},
                                         {"pipeline_model_parallel_size", 1},
                                         {"expert_model_parallel_size", 2},
                                         {"expert_tensor_parallel_size", 2},
                                         {"make_vocab_size_divisible_by", 4},
                                         {"padded_vocab_size", 32},
                                         {"world_size", 4},
                                         {"rank", 0}};
  if (experts > 0) args["num_experts"] = experts;
  model.training_state.values["megatron.args"] = Args(args);
  model.training_state.values["megatron.iteration"] = Int(100);
  if (experts > 0) {
    StructureNode form;
    form.kind = Kind::kBool;
    form.boolean = grouped;
    model.training_state.values[kMegatronGroupedExpertsKey] = form;
  }
  return model;
}

const OutputTensor* FindTensor(const OutputFileLayout& file, const std::string& name) {
  for (const OutputTensor& tensor : file.tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

const StructureNode* Child(const StructureNode& dict, const std::string& key) {
  for (size_t i = 0; i < dict.keys.size(); ++i) {
    if (dict.keys[i].text == key) return &dict.values[i];
  }
  return nullptr;
}

std::vector<std::string> Keys(const StructureNode& dict) {
  std::vector<std::string> keys;
  for (const StructureNode& key : dict.keys) keys.push_back(key.text);
  return keys;
}

TEST(MegatronOutputTest, TwoByTwoFilesStagesAndNesting) {
  const InputModel model = Model(4, 64, /*tied=*/true);
  auto arranged = Arrange(model, 2, 2);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const std::vector<OutputFileLayout>& files = arranged->layout.files;
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[0].name, "iter_0000100/mp_rank_00_000/model_optim_rng.pt");
  EXPECT_EQ(files[1].name, "iter_0000100/mp_rank_00_001/model_optim_rng.pt");
  EXPECT_EQ(files[3].name, "iter_0000100/mp_rank_01_001/model_optim_rng.pt");

  // First stage of TP rank 1: its rows of the embeddings, global layers 0 and 1.
  const OutputFileLayout& first = files[2];
  const OutputTensor* embed = FindTensor(first, "language_model.embedding.word_embeddings.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->region.origin, (std::vector<int64_t>{32, 0}));
  EXPECT_EQ(embed->region.extent, (std::vector<int64_t>{32, kHidden}));
  EXPECT_FALSE(embed->zero_fill);
  EXPECT_NE(FindTensor(first, kEncoder + "layers.1.mlp.dense_4h_to_h.weight"), nullptr);
  EXPECT_EQ(FindTensor(first, kEncoder + "layers.2.mlp.dense_4h_to_h.weight"), nullptr);
  EXPECT_EQ(FindTensor(first, kEncoder + "final_layernorm.weight"), nullptr);
  EXPECT_EQ(FindTensor(first, kMegatronHeadCopyName), nullptr);

  // Last stage: global layers 2, 3 as local 0, 1; the final norm; the head's embedding copy.
  const OutputFileLayout& last = files[3];
  EXPECT_EQ(FindTensor(last, "language_model.embedding.word_embeddings.weight"), nullptr);
  const OutputTensor* local0 = FindTensor(last, kEncoder + "layers.0.self_attention.dense.weight");
  ASSERT_NE(local0, nullptr);
  EXPECT_EQ(model.parts[0].tensors[local0->source].name,
            kEncoder + "layers.2.self_attention.dense.weight");
  EXPECT_EQ(local0->region.origin, (std::vector<int64_t>{0, 4}));  // row-parallel, rank 1
  EXPECT_EQ(FindTensor(last, kEncoder + "layers.2.self_attention.dense.weight"), nullptr);
  EXPECT_NE(FindTensor(last, kEncoder + "final_layernorm.weight"), nullptr);
  const OutputTensor* head = FindTensor(last, kMegatronHeadCopyName);
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->region, embed->region);
  EXPECT_EQ(head->alias_of, -1);

  // The nesting Megatron's GPTModel saves, and the args of that rank.
  ASSERT_NE(last.structure, nullptr);
  EXPECT_EQ(Keys(*last.structure),
            (std::vector<std::string>{"args", "checkpoint_version", "iteration", "model"}));
  const StructureNode& model_node = *Child(*last.structure, "model");
  EXPECT_EQ(Keys(model_node),
            (std::vector<std::string>{"language_model", "word_embeddings_for_head"}));
  EXPECT_EQ(Keys(*Child(model_node, "language_model")), (std::vector<std::string>{"encoder"}));
  const StructureNode& encoder = *Child(*Child(model_node, "language_model"), "encoder");
  EXPECT_TRUE(encoder.ordered);
  EXPECT_EQ(encoder.keys.front().text, "layers.0.input_layernorm.weight");
  EXPECT_EQ(encoder.values.front().kind, Kind::kTensor);
  EXPECT_EQ(encoder.values.front().text, kEncoder + "layers.0.input_layernorm.weight");
  EXPECT_EQ(encoder.keys.back().text, "final_layernorm.weight");
  const StructureNode& args = *Child(*last.structure, "args");
  EXPECT_EQ(Child(args, "tensor_model_parallel_size")->integer, 2);
  EXPECT_EQ(Child(args, "pipeline_model_parallel_size")->integer, 2);
  EXPECT_EQ(Child(args, "padded_vocab_size")->integer, 64);
  EXPECT_EQ(Child(args, "world_size")->integer, 8);  // TP 2 x PP 2 x DP 2
  EXPECT_EQ(Child(args, "rank")->integer, 1 + 2 * 2 * 1);
  EXPECT_EQ(Child(args, "num_layers")->integer, 4);
  EXPECT_EQ(Child(*last.structure, "iteration")->integer, 100);
  EXPECT_EQ(Child(*last.structure, "checkpoint_version")->real, 3.0);
  const StructureNode& first_model = *Child(*first.structure, "model");
  EXPECT_EQ(Keys(first_model), (std::vector<std::string>{"language_model"}));
  EXPECT_EQ(Keys(*Child(first_model, "language_model")),
            (std::vector<std::string>{"embedding", "encoder"}));
  EXPECT_EQ(Keys(*Child(*Child(first_model, "language_model"), "embedding")),
            (std::vector<std::string>{"word_embeddings", "position_embeddings"}));

  const MegatronOutput output;
  auto companions = output.CompanionFiles(arranged->layout);
  ASSERT_TRUE(companions.ok());
  ASSERT_EQ(companions->size(), 1u);
  EXPECT_EQ((*companions)[0].first, "latest_checkpointed_iteration.txt");
  EXPECT_EQ((*companions)[0].second, "100");
  // Frames as a torch.save file.
  EXPECT_TRUE(output.Frame(last).ok());
}

TEST(MegatronOutputTest, PipelineOneHasNoStageSuffixNorHeadCopy) {
  auto arranged = Arrange(Model(4, 64, true), 2, 1);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  ASSERT_EQ(arranged->layout.files.size(), 2u);
  EXPECT_EQ(arranged->layout.files[1].name, "iter_0000100/mp_rank_01/model_optim_rng.pt");
  EXPECT_EQ(FindTensor(arranged->layout.files[1], kMegatronHeadCopyName), nullptr);
  EXPECT_NE(FindTensor(arranged->layout.files[1], kEncoder + "layers.3.mlp.dense_h_to_4h.weight"),
            nullptr);
}

TEST(MegatronOutputTest, UntiedOutputLayerOnTheLastStageAndRelease) {
  InputModel model = Model(4, 64, /*tied=*/false);
  StructureNode yes;
  yes.kind = Kind::kBool;
  yes.boolean = true;
  model.training_state.values["megatron.release"] = yes;
  auto arranged = Arrange(model, 1, 2);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  ASSERT_EQ(arranged->layout.files.size(), 2u);
  EXPECT_EQ(arranged->layout.files[0].name, "release/mp_rank_00_000/model_optim_rng.pt");
  EXPECT_EQ(FindTensor(arranged->layout.files[0], "language_model.output_layer.weight"), nullptr);
  EXPECT_NE(FindTensor(arranged->layout.files[1], "language_model.output_layer.weight"), nullptr);
  EXPECT_EQ(FindTensor(arranged->layout.files[1], kMegatronHeadCopyName), nullptr);
  auto companions = MegatronOutput().CompanionFiles(arranged->layout);
  ASSERT_TRUE(companions.ok());
  EXPECT_EQ((*companions)[0].second, "release");
}

// Vocabulary 50, make_vocab_size_divisible_by 8: 56 rows at TP 1, 64 at TP 2 (8 zero rows at
// the end of the last rank's slice), 56 again at TP 1 from 64.
TEST(MegatronOutputTest, VocabularyPaddedAgain) {
  auto arranged = Arrange(Model(4, 56, false, {{"vocab_size", 50}}), 2, 1);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  for (int t = 0; t < 2; ++t) {
    const OutputFileLayout& file = arranged->layout.files[t];
    for (const char* name : {"language_model.embedding.word_embeddings.weight",
                             "language_model.output_layer.weight"}) {
      const OutputTensor* tensor = FindTensor(file, name);
      ASSERT_NE(tensor, nullptr) << name;
      EXPECT_EQ(tensor->region.origin[0], 32 * t) << name;
      EXPECT_EQ(tensor->region.extent[0], 32) << name;
      EXPECT_EQ(tensor->shape()[0], 32) << name;
      EXPECT_EQ(tensor->zero_fill, t == 1) << name << " rank " << t;
    }
    EXPECT_EQ(Child(*Child(*file.structure, "args"), "padded_vocab_size")->integer, 64);
  }
  arranged = Arrange(Model(4, 64, true, {{"vocab_size", 50}}), 1, 1);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const OutputTensor* embed =
      FindTensor(arranged->layout.files[0], "language_model.embedding.word_embeddings.weight");
  EXPECT_EQ(embed->region.extent[0], 56);
  EXPECT_FALSE(embed->zero_fill);
  // Unknown vocabulary: 64 rows stay for TP 2 (a multiple of 8 x 2)...
  arranged = Arrange(Model(4, 64, true), 2, 1);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  EXPECT_EQ(FindTensor(arranged->layout.files[1], "language_model.embedding.word_embeddings.weight")
                ->region.extent[0],
            32);
  // ...but 56 rows are no multiple of 8 x 2.
  arranged = Arrange(Model(4, 56, true), 2, 1);
  EXPECT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(arranged.status().message().find("args.vocab_size"), std::string::npos)
      << arranged.status();
}

TEST(MegatronOutputTest, Refusals) {
  // 4 layers over 3 stages.
  auto arranged = Arrange(Model(4, 64, true), 1, 3);
  EXPECT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(arranged.status().message().find("does not divide the 4 layers"), std::string::npos)
      << arranged.status();
  // 3 heads (args) over TP 2 is refused by name, even where the rows would split.
  arranged = Arrange(Model(4, 64, true, {{"num_attention_heads", 3}}), 2, 1);
  EXPECT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(arranged.status().message().find("args.num_attention_heads is 3"), std::string::npos)
      << arranged.status();
  arranged =
      Arrange(Model(4, 64, true, {{"group_query_attention", 1}, {"num_query_groups", 1}}), 2, 1);
  EXPECT_NE(arranged.status().message().find("args.num_query_groups is 1"), std::string::npos)
      << arranged.status();
  // Not Megatron input.
  InputModel other = Model(4, 64, true);
  other.format = "safetensors";
  arranged = Arrange(other, 1, 1);
  EXPECT_NE(arranged.status().message().find("from safetensors input"), std::string::npos)
      << arranged.status();
  // A name outside a GPT.
  InputModel odd = Model(4, 64, true);
  odd.parts[0].tensors[1].name = "language_model.pooler.dense.weight";
  odd.parts[0].Reindex();
  PartitionRule pooler;
  pooler.pattern = "pooler";
  pooler.replicate = true;
  odd.default_rules.insert(odd.default_rules.begin(), pooler);
  arranged = Arrange(odd, 1, 1);
  EXPECT_NE(arranged.status().message().find("language_model.pooler.dense.weight"),
            std::string::npos)
      << arranged.status();
}

// Megatron-DeepSpeed pipeline names (GPTModelPipe: embedding 1, layers 3.., final norm, tied
// embedding copy left out by the reader) come out under Megatron-LM's names.
TEST(MegatronOutputTest, PipelineNamesMappedToMegatronLM) {
  InputModel model = Model(2, 64, /*tied=*/false);
  std::map<std::string, std::string> to_pipe = {
      {"language_model.embedding.word_embeddings.weight", "1.word_embeddings.weight"},
      {"language_model.embedding.position_embeddings.weight", "1.position_embeddings.weight"},
      {kEncoder + "final_layernorm.weight", "6.weight"},
      {"language_model.output_layer.weight", "7.lm_head.weight"}};
  for (CatalogTensor& tensor : model.parts[0].tensors) {
    if (auto it = to_pipe.find(tensor.name); it != to_pipe.end()) {
      tensor.name = it->second;
    } else {
      const std::string rest = tensor.name.substr(kEncoder.size() + 7);  // after "layers."
      tensor.name = absl::StrCat(3 + (rest[0] - '0'), rest.substr(1));
    }
  }
  model.parts[0].Reindex();
  model.default_rules = MegatronPresetRules();
  auto arranged = Arrange(model, 2, 2);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const OutputFileLayout& first = arranged->layout.files[0];
  const OutputFileLayout& last = arranged->layout.files[1];
  EXPECT_NE(FindTensor(first, "language_model.embedding.word_embeddings.weight"), nullptr);
  const OutputTensor* layer = FindTensor(last, kEncoder + "layers.0.mlp.dense_h_to_4h.weight");
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(model.parts[0].tensors[layer->source].name, "4.mlp.dense_h_to_4h.weight");
  EXPECT_NE(FindTensor(last, kEncoder + "final_layernorm.weight"), nullptr);
  EXPECT_NE(FindTensor(last, "language_model.output_layer.weight"), nullptr);
  EXPECT_EQ(FindTensor(last, kMegatronHeadCopyName), nullptr);  // untied
}

TEST(MegatronOutputTest, ExpertsDistributedOverExpertParallelRanks) {
  // 8 experts, TP 2 x EP 4: EP rank e holds experts 2e and 2e + 1 as local experts 0 and 1.
  const InputModel model = MoEModel(8, /*grouped=*/false);
  auto arranged = Arrange(model, 2, 1, 4);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const std::vector<OutputFileLayout>& files = arranged->layout.files;
  ASSERT_EQ(files.size(), 8u);
  EXPECT_EQ(files[0].name, "iter_0000100/mp_rank_00_000/model_optim_rng.pt");
  EXPECT_EQ(files[3].name, "iter_0000100/mp_rank_00_003/model_optim_rng.pt");
  EXPECT_EQ(files[6].name, "iter_0000100/mp_rank_01_002/model_optim_rng.pt");
  const OutputFileLayout& file = files[6];  // TP rank 1, EP rank 2
  for (int local = 0; local < 2; ++local) {
    for (int layer = 0; layer < 2; ++layer) {
      const std::string name = absl::StrCat("decoder.layers.", layer,
                                            ".mlp.experts.local_experts.", local, ".linear_fc2.weight");
      const OutputTensor* tensor = FindTensor(file, name);
      ASSERT_NE(tensor, nullptr) << name;
      EXPECT_EQ(model.parts[0].tensors[tensor->source].name,
                absl::StrCat("decoder.layers.", layer, ".mlp.experts.local_experts.", 4 + local,
                             ".linear_fc2.weight"));
      EXPECT_EQ(tensor->region.origin, (std::vector<int64_t>{0, 2}));  // TP rank 1's columns
    }
  }
  EXPECT_EQ(FindTensor(file, "decoder.layers.0.mlp.experts.local_experts.2.linear_fc2.weight"),
            nullptr);
  // Tensors outside the experts are in every EP rank's file.
  for (const OutputFileLayout& each : files) {
    EXPECT_NE(FindTensor(each, "decoder.layers.1.mlp.router.weight"), nullptr) << each.name;
    EXPECT_NE(FindTensor(each, "embedding.word_embeddings.weight"), nullptr) << each.name;
    EXPECT_EQ(each.tensors.size(), 1u + 2 * (3 + 1 + 2 * 2) + 2) << each.name;
  }
  // Megatron-Core's flat state dict, and the args of that rank.
  const StructureNode& model_node = *Child(*file.structure, "model");
  EXPECT_TRUE(model_node.ordered);
  EXPECT_EQ(model_node.keys.front().text, "embedding.word_embeddings.weight");
  EXPECT_EQ(model_node.values.front().text, "embedding.word_embeddings.weight");
  const StructureNode& args = *Child(*file.structure, "args");
  EXPECT_EQ(Child(args, "expert_model_parallel_size")->integer, 4);
  EXPECT_EQ(Child(args, "expert_tensor_parallel_size")->integer, 2);
  EXPECT_EQ(Child(args, "num_experts")->integer, 8);
  EXPECT_EQ(Child(args, "world_size")->integer, 8);  // TP 2 x DP 4 (input DP 2, up to EP)
  EXPECT_EQ(Child(args, "rank")->integer, 1 + 2 * 2);
}

TEST(MegatronOutputTest, GroupedExpertsKeepTheirNamesAndStages) {
  // TP 1 x PP 2 x EP 2, TEGroupedMLP names: linear_fc1.weight<l>, layers numbered per stage.
  const InputModel model = MoEModel(8, /*grouped=*/true);
  auto arranged = Arrange(model, 1, 2, 2);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const std::vector<OutputFileLayout>& files = arranged->layout.files;
  ASSERT_EQ(files.size(), 4u);
  EXPECT_EQ(files[3].name, "iter_0000100/mp_rank_00_001_001/model_optim_rng.pt");
  const OutputTensor* fc1 = FindTensor(files[3], "decoder.layers.0.mlp.experts.linear_fc1.weight3");
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(model.parts[0].tensors[fc1->source].name,
            "decoder.layers.1.mlp.experts.local_experts.7.linear_fc1.weight");
  EXPECT_EQ(FindTensor(files[3], "decoder.layers.0.mlp.experts.linear_fc1.weight4"), nullptr);
  EXPECT_NE(FindTensor(files[3], "output_layer.weight"), nullptr);
  EXPECT_EQ(FindTensor(files[1], "output_layer.weight"), nullptr);
  EXPECT_NE(FindTensor(files[1], "embedding.word_embeddings.weight"), nullptr);  // EP rank 1
}

TEST(MegatronOutputTest, ExpertPartsNotDividingTheExpertsRefused) {
  auto arranged = Arrange(MoEModel(8, false), 2, 1, 3);
  ASSERT_FALSE(arranged.ok());
  EXPECT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arranged.status().message(),
            "--expert-parts 3 does not divide the 8 experts (args.num_experts): every "
            "expert-parallel rank holds the same number of experts");
}

TEST(MegatronOutputTest, ExpertPartsWithoutExpertsRefused) {
  auto arranged = Arrange(MoEModel(0, false), 2, 1, 2);
  ASSERT_FALSE(arranged.ok());
  EXPECT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(arranged.status().message(),
                               "--expert-parts 2: the model has no mixture-of-experts layers"))
      << arranged.status();
  // Without --expert-parts the dense Megatron-Core model is written flat, one EP rank.
  auto dense = Arrange(MoEModel(0, false), 2, 1, 0);
  ASSERT_TRUE(dense.ok()) << dense.status();
  ASSERT_EQ(dense->layout.files.size(), 2u);
  EXPECT_EQ(dense->layout.files[1].name, "iter_0000100/mp_rank_01/model_optim_rng.pt");
}

}  // namespace
}  // namespace reshard
