#include "lib/formats/megatron/megatron_layout.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/plan/layout_builders.h"
#include "lib/plan/partition_rules.h"

namespace reshard {
namespace {

TEST(MegatronNamesTest, RankFolders) {
  auto plain = ParseMegatronRankDir("mp_rank_01");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->tp, 1);
  EXPECT_EQ(plain->pp, 0);
  EXPECT_FALSE(plain->has_pp);
  EXPECT_EQ(plain->ep, -1);
  auto staged = ParseMegatronRankDir("mp_rank_03_012");
  ASSERT_TRUE(staged.has_value());
  EXPECT_EQ(staged->tp, 3);
  EXPECT_EQ(staged->pp, 12);
  EXPECT_TRUE(staged->has_pp);
  auto expert = ParseMegatronRankDir("mp_rank_00_001_002");
  ASSERT_TRUE(expert.has_value());
  EXPECT_EQ(expert->ep, 2);
  for (const char* bad : {"mp_rank_", "mp_rank_x1", "mp_rank_01_", "mp_rank_-1", "rank_01",
                          "mp_rank_00_model_states.pt", "mp_rank_1_2_3_4"}) {
    EXPECT_FALSE(ParseMegatronRankDir(bad).has_value()) << bad;
  }
  EXPECT_EQ(MegatronRankDirName(1, 0, false), "mp_rank_01");
  EXPECT_EQ(MegatronRankDirName(1, 2, true), "mp_rank_01_002");
  EXPECT_EQ(MegatronRankDirName(12, 123, true), "mp_rank_12_123");
}

TEST(MegatronNamesTest, IndicesAndModelStatesFiles) {
  EXPECT_EQ(ParseMegatronIndex("0"), 0);
  EXPECT_EQ(ParseMegatronIndex("007"), 7);
  EXPECT_EQ(ParseMegatronIndex(absl::StrCat(kMaxMegatronIndex - 1)), kMaxMegatronIndex - 1);
  for (const char* bad : {"", "-1", "+1", "1a", "1048576", "9999999999"}) {
    EXPECT_FALSE(ParseMegatronIndex(bad).has_value()) << bad;
  }
  EXPECT_EQ(ParseModelStatesFile("mp_rank_03_model_states.pt"), 3);
  EXPECT_FALSE(ParseModelStatesFile("mp_rank_03_optim_states.pt").has_value());
  EXPECT_FALSE(ParseModelStatesFile("zero_pp_rank_0_mp_rank_00_model_states.pt").has_value());
}

TEST(MegatronNamesTest, PipeLayerFiles) {
  auto file = ParsePipeLayerFile("layer_03-model_01-model_states.pt");
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(file->layer, 3);
  EXPECT_EQ(file->tp, 1);
  auto big = ParsePipeLayerFile("layer_123-model_10-model_states.pt");
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(big->layer, 123);
  EXPECT_EQ(PipeLayerFileName(3, 1), "layer_03-model_01-model_states.pt");
  auto back = ParsePipeLayerFile(PipeLayerFileName(123, 10));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->layer, 123);
  EXPECT_EQ(back->tp, 10);
  for (const char* bad :
       {"layer_03-model_01-model_states.pth", "layer_03-model_states.pt",
        "layer_xx-model_01-model_states.pt", "layer_03-model_-model_states.pt",
        "mp_rank_00_model_states.pt", "layer_3_expert_0_mp_rank_00_model_states.pt"}) {
    EXPECT_FALSE(ParsePipeLayerFile(bad).has_value()) << bad;
  }
}

TEST(MegatronNamesTest, TrackerFile) {
  EXPECT_EQ(IterationFolderFromTracker("100"), "iter_0000100");
  EXPECT_EQ(IterationFolderFromTracker("  1200\n"), "iter_0001200");
  EXPECT_EQ(IterationFolderFromTracker("123456789"), "iter_123456789");
  EXPECT_EQ(IterationFolderFromTracker("release\n"), "release");
  for (const char* bad : {"", "-1", "iter_0000100", "1e3", "global_step10", "12 13"}) {
    EXPECT_FALSE(IterationFolderFromTracker(bad).has_value()) << bad;
  }
}

// A Catalog of one file holding `names`, each a [rows, 4] F32 tensor.
Catalog StageCatalog(const std::string& path, const std::vector<std::string>& names,
                     int64_t rows = 2) {
  Catalog catalog;
  catalog.format = "megatron";
  catalog.files.push_back({path, 1 << 20});
  uint64_t offset = 0;
  for (const std::string& name : names) {
    CatalogTensor tensor{name, DType::kF32, {rows, 4}, {}};
    SourcePiece piece;
    piece.file = 0;
    piece.byte_offset = offset;
    piece.box = Box::Full(tensor.shape);
    piece.strides = {4, 1};
    offset += rows * 16;
    tensor.pieces.push_back(piece);
    catalog.tensors.push_back(tensor);
  }
  catalog.Reindex();
  return catalog;
}

std::vector<std::string> Names(const Catalog& catalog) {
  std::vector<std::string> names;
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  return names;
}

constexpr char kL[] = "language_model.encoder.layers.";

TEST(MergePipelineStagesTest, RenumbersLayersAndDropsTheHeadCopy) {
  std::vector<PipelineStage> stages;
  stages.push_back(
      {"mp_rank_00_000", StageCatalog("/c/mp_rank_00_000/model_optim_rng.pt",
                                      {"language_model.embedding.word_embeddings.weight",
                                       std::string(kL) + "0.mlp.dense_h_to_4h.weight",
                                       std::string(kL) + "1.mlp.dense_h_to_4h.weight"})});
  stages.push_back({"mp_rank_00_001", StageCatalog("/c/mp_rank_00_001/model_optim_rng.pt",
                                                   {std::string(kL) + "0.mlp.dense_h_to_4h.weight",
                                                    std::string(kL) + "1.mlp.dense_h_to_4h.weight",
                                                    "language_model.encoder.final_layernorm.weight",
                                                    "word_embeddings_for_head.weight"})});
  StageMergeOptions options;
  options.layers_per_stage = 2;
  options.total_layers = 4;
  auto merged = MergePipelineStages(std::move(stages), options);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(Names(*merged),
            (std::vector<std::string>{"language_model.embedding.word_embeddings.weight",
                                      std::string(kL) + "0.mlp.dense_h_to_4h.weight",
                                      std::string(kL) + "1.mlp.dense_h_to_4h.weight",
                                      std::string(kL) + "2.mlp.dense_h_to_4h.weight",
                                      std::string(kL) + "3.mlp.dense_h_to_4h.weight",
                                      "language_model.encoder.final_layernorm.weight"}));
  ASSERT_EQ(merged->files.size(), 2u);
  // Global layer 2 is stage 1's local layer 0: its first tensor, in file 1.
  const CatalogTensor& layer2 =
      merged->tensors[merged->Find(std::string(kL) + "2.mlp.dense_h_to_4h.weight")];
  EXPECT_EQ(layer2.pieces[0].file, 1);
  EXPECT_EQ(layer2.pieces[0].byte_offset, 0u);
  const CatalogTensor& norm =
      merged->tensors[merged->Find("language_model.encoder.final_layernorm.weight")];
  EXPECT_EQ(norm.pieces[0].file, 1);
  EXPECT_EQ(norm.pieces[0].byte_offset, 64u);
  ASSERT_EQ(merged->other_entries.size(), 1u);
  EXPECT_NE(merged->other_entries[0].find("word_embeddings_for_head.weight (mp_rank_00_001)"),
            std::string::npos)
      << merged->other_entries[0];
}

TEST(MergePipelineStagesTest, VirtualStagesShareAFile) {
  // Two chunks of one file, as model0 and model1 of a virtual pipeline.
  std::vector<PipelineStage> stages;
  stages.push_back({"mp_rank_00 model0", StageCatalog("/c/f.pt", {std::string(kL) + "0.w"})});
  stages.push_back({"mp_rank_00 model1", StageCatalog("/c/f.pt", {std::string(kL) + "0.w"})});
  auto merged = MergePipelineStages(std::move(stages), {});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(Names(*merged),
            (std::vector<std::string>{std::string(kL) + "0.w", std::string(kL) + "1.w"}));
  EXPECT_EQ(merged->files.size(), 1u);
}

TEST(MergePipelineStagesTest, Refusals) {
  auto two_stages = [](std::vector<std::string> a, std::vector<std::string> b) {
    std::vector<PipelineStage> stages;
    stages.push_back({"mp_rank_00_000", StageCatalog("/a.pt", a)});
    stages.push_back({"mp_rank_00_001", StageCatalog("/b.pt", b)});
    return stages;
  };
  const std::string l0 = std::string(kL) + "0.w";
  const std::string l1 = std::string(kL) + "1.w";
  const std::string l2 = std::string(kL) + "2.w";
  {  // A gap in the local numbering.
    auto merged = MergePipelineStages(two_stages({l0, l1}, {l0, l2}), {});
    ASSERT_FALSE(merged.ok());
    EXPECT_NE(merged.status().message().find("mp_rank_00_001 holds"), std::string::npos)
        << merged.status();
  }
  {  // A stage with more layers than the args give.
    StageMergeOptions options;
    options.layers_per_stage = 1;
    auto merged = MergePipelineStages(two_stages({l0}, {l0, l1}), options);
    ASSERT_FALSE(merged.ok());
    EXPECT_NE(merged.status().message().find("mp_rank_00_001 holds 2 layers"), std::string::npos)
        << merged.status();
  }
  {  // The stages together hold fewer layers than num_layers.
    StageMergeOptions options;
    options.total_layers = 6;
    auto merged = MergePipelineStages(two_stages({l0, l1}, {l0, l1}), options);
    ASSERT_FALSE(merged.ok());
    EXPECT_NE(merged.status().message().find("args.num_layers is 6"), std::string::npos)
        << merged.status();
  }
  {  // A non-layer tensor in two stages.
    auto merged =
        MergePipelineStages(two_stages({"language_model.embedding.word_embeddings.weight", l0},
                                       {"language_model.embedding.word_embeddings.weight", l0}),
                            {});
    ASSERT_FALSE(merged.ok());
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(merged.status().message().find("in both mp_rank_00_000 and mp_rank_00_001"),
              std::string::npos)
        << merged.status();
  }
}

// Each (name, dim) of `cases` matches a rule splitting dimension `dim`, or a replicating one
// when `dim` < 0; split rules have `fused` blocks when given.
void ExpectRules(const PartitionRules& rules,
                 const std::vector<std::pair<std::string, int>>& cases, std::optional<int> fused) {
  for (const auto& [name, dim] : cases) {
    auto match = rules.Match(name);
    ASSERT_TRUE(match.ok()) << name << ": " << match.status();
    if (dim < 0) {
      EXPECT_TRUE((*match)->replicate) << name;
    } else {
      EXPECT_FALSE((*match)->replicate) << name;
      EXPECT_EQ((*match)->split_dim, dim) << name;
      if (fused.has_value()) {
        EXPECT_EQ((*match)->fused, *fused) << name;
      }
    }
  }
}

TEST(MegatronRulesTest, SwiGLUFromShapes) {
  Catalog gelu = StageCatalog("/a.pt", {});
  gelu.tensors.push_back({"1.mlp.dense_h_to_4h.weight", DType::kF32, {64, 16}, {}});
  gelu.tensors.push_back({"1.mlp.dense_4h_to_h.weight", DType::kF32, {16, 64}, {}});
  gelu.Reindex();
  EXPECT_EQ(SwiGLUFromShapes(gelu), false);
  Catalog swiglu = StageCatalog("/a.pt", {});
  swiglu.tensors.push_back({"x.layers.0.mlp.dense_h_to_4h.weight", DType::kF32, {64, 16}, {}});
  swiglu.tensors.push_back({"x.layers.0.mlp.dense_4h_to_h.weight", DType::kF32, {16, 32}, {}});
  swiglu.Reindex();
  EXPECT_EQ(SwiGLUFromShapes(swiglu), true);
  EXPECT_EQ(SwiGLUFromShapes(StageCatalog("/a.pt", {"w"})), std::nullopt);
  // A mixture-of-experts model without a dense MLP: its experts say it.
  Catalog experts = StageCatalog("/a.pt", {});
  experts.tensors.push_back({"decoder.layers.0.mlp.router.weight", DType::kF32, {8, 16}, {}});
  experts.tensors.push_back(
      {"decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight", DType::kF32, {12, 16}, {}});
  experts.tensors.push_back(
      {"decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight", DType::kF32, {16, 6}, {}});
  experts.Reindex();
  EXPECT_EQ(SwiGLUFromShapes(experts), true);
}

TEST(MegatronRulesTest, RulesParseAndSwiGLUIsFused) {
  for (bool swiglu : {false, true}) {
    auto rules = PartitionRules::Create(MegatronPartitionRules(swiglu));
    ASSERT_TRUE(rules.ok()) << rules.status();
    for (const char* name :
         {"language_model.encoder.layers.3.mlp.dense_h_to_4h.weight", "3.mlp.dense_h_to_4h.bias"}) {
      auto match = rules->Match(name);
      ASSERT_TRUE(match.ok()) << match.status();
      EXPECT_EQ((*match)->split_dim, 0);
      EXPECT_EQ((*match)->fused, swiglu ? 2 : 1) << name;
    }
    EXPECT_FALSE(rules->Match("language_model.encoder.layers.0.unknown.weight").ok());
  }
}

// With SwiGLU every rank holds [gate_i; up_i]: merged, the gate rows of every rank come first.
TEST(MegatronRulesTest, SwiGLUMergePutsGatesFirst) {
  auto rules = PartitionRules::Create(MegatronPartitionRules(true));
  ASSERT_TRUE(rules.ok());
  std::vector<Catalog> parts;
  parts.push_back(StageCatalog("/tp0.pt", {"3.mlp.dense_h_to_4h.weight"}, 4));
  parts.push_back(StageCatalog("/tp1.pt", {"3.mlp.dense_h_to_4h.weight"}, 4));
  auto merged = MergeParts(std::move(parts), *rules, {"tp 0", "tp 1"});
  ASSERT_TRUE(merged.ok()) << merged.status();
  const CatalogTensor& w = merged->tensors[0];
  EXPECT_EQ(w.shape, (Shape{8, 4}));
  // Pieces: (file, first row) = gate_0 -> 0, up_0 -> 4, gate_1 -> 2, up_1 -> 6.
  ASSERT_EQ(w.pieces.size(), 4u);
  std::vector<std::pair<int, int64_t>> rows;
  for (const SourcePiece& piece : w.pieces) rows.push_back({piece.file, piece.box.origin[0]});
  EXPECT_EQ(rows, (std::vector<std::pair<int, int64_t>>{{0, 0}, {0, 4}, {1, 2}, {1, 6}}));
}

// The megatron preset on both Megatron-LM and DeepSpeed pipeline names: (name, split dim or
// -1 for replicated). No catch-all: anything else fails.
TEST(MegatronRulesTest, PresetCoversBothNamingSchemes) {
  auto rules = PartitionRules::Create(MegatronPresetRules());
  ASSERT_TRUE(rules.ok()) << rules.status();
  const std::vector<std::pair<std::string, int>> cases = {
      // Megatron-LM (the names the preset always covered).
      {"language_model.embedding.word_embeddings.weight", 0},
      {"language_model.embedding.position_embeddings.weight", -1},
      {"language_model.encoder.layers.0.input_layernorm.weight", -1},
      {"language_model.encoder.layers.0.input_layernorm.bias", -1},
      {"language_model.encoder.layers.0.self_attention.query_key_value.weight", 0},
      {"language_model.encoder.layers.0.self_attention.query_key_value.bias", 0},
      {"language_model.encoder.layers.0.self_attention.dense.weight", 1},
      {"language_model.encoder.layers.0.self_attention.dense.bias", -1},
      {"language_model.encoder.layers.0.post_attention_layernorm.weight", -1},
      {"language_model.encoder.layers.0.mlp.dense_h_to_4h.weight", 0},
      {"language_model.encoder.layers.0.mlp.dense_h_to_4h.bias", 0},
      {"language_model.encoder.layers.0.mlp.dense_4h_to_h.weight", 1},
      {"language_model.encoder.layers.0.mlp.dense_4h_to_h.bias", -1},
      {"language_model.encoder.final_layernorm.weight", -1},
      // Added: untied output layer, older `attention.` / `transformer.` names, *_norm names.
      {"language_model.output_layer.weight", 0},
      {"language_model.transformer.layers.1.attention.dense.weight", 1},
      {"language_model.transformer.layers.1.attention.dense.bias", -1},
      {"language_model.encoder.final_norm.weight", -1},
      {"language_model.encoder.layers.0.input_norm.bias", -1},
      // DeepSpeed pipeline names (layer-spec index first).
      {"1.word_embeddings.weight", 0},
      {"1.position_embeddings.weight", -1},
      {"3.self_attention.query_key_value.weight", 0},
      {"3.self_attention.dense.weight", 1},
      {"3.mlp.dense_4h_to_h.weight", 1},
      {"3.mlp.dense_4h_to_h.bias", -1},
      {"8.weight", -1},
      {"8.bias", -1},
      {"9.lm_head.weight", 0},
  };
  ExpectRules(*rules, cases, /*fused=*/1);
  for (const char* name : {"language_model.encoder.layers.0.adapter.weight", "3.router.weight",
                           "word_embeddings_for_head.weight", "x.12.weight"}) {
    EXPECT_FALSE(rules->Match(name).ok()) << name;
  }
}

}  // namespace
}  // namespace reshard

namespace reshard {
namespace {

// The ranks a folder name stands for with PP > 1 or not, EP > 1 or not: "tp/pp/ep", or
// "none" when the name does not fit.
std::string Interpret(const char* name, bool pipeline, bool expert) {
  const std::optional<MegatronRankDir> parsed = ParseMegatronRankDir(name);
  if (!parsed.has_value()) return "unparsed";
  const std::optional<MegatronRankDir> rank = InterpretMegatronRankDir(*parsed, pipeline, expert);
  if (!rank.has_value()) return "none";
  return absl::StrCat(rank->tp, "/", rank->pp, "/", rank->ep);
}

TEST(MegatronExpertsTest, FolderNamesDependOnPipelineAndExpertSizes) {
  // PP = 1, EP = 2: mp_rank_TT_EEE, the second number is the EP rank.
  EXPECT_EQ(Interpret("mp_rank_01_001", /*pipeline=*/false, /*expert=*/true), "1/0/1");
  // PP = 2, EP = 1: the same name is PP rank 1.
  EXPECT_EQ(Interpret("mp_rank_01_001", /*pipeline=*/true, /*expert=*/false), "1/1/0");
  // PP = 2, EP = 4: mp_rank_TT_PPP_EEE.
  EXPECT_EQ(Interpret("mp_rank_00_001_003", /*pipeline=*/true, /*expert=*/true), "0/1/3");
  // PP = 1, EP = 1: mp_rank_TT, and mp_rank_TT_000 as other writers spell it.
  EXPECT_EQ(Interpret("mp_rank_02", /*pipeline=*/false, /*expert=*/false), "2/0/0");
  EXPECT_EQ(Interpret("mp_rank_02_000", /*pipeline=*/false, /*expert=*/false), "2/0/0");
  // Names with too many or too few numbers for the sizes.
  EXPECT_EQ(Interpret("mp_rank_00_001", false, false), "none");
  EXPECT_EQ(Interpret("mp_rank_00_001_001", false, false), "none");
  EXPECT_EQ(Interpret("mp_rank_00_001_001", true, false), "none");
  EXPECT_EQ(Interpret("mp_rank_00", false, true), "none");
  EXPECT_EQ(Interpret("mp_rank_00_001", true, true), "none");
  EXPECT_EQ(Interpret("mp_rank_00", true, false), "none");

  EXPECT_EQ(MegatronRankDirName(1, 0, false, 3), "mp_rank_01_003");
  EXPECT_EQ(MegatronRankDirName(1, 2, true, 3), "mp_rank_01_002_003");
  EXPECT_EQ(MegatronRankDirName(1, 2, true), "mp_rank_01_002");
}

TEST(MegatronExpertsTest, ExpertNamesAndGlobalIds) {
  auto sequential =
      ParseExpertTensorName("decoder.layers.3.mlp.experts.local_experts.2.linear_fc1.weight");
  ASSERT_TRUE(sequential.has_value());
  EXPECT_EQ(sequential->experts, "decoder.layers.3.mlp.experts");
  EXPECT_EQ(sequential->local, 2);
  EXPECT_EQ(sequential->rest, "linear_fc1.weight");
  auto grouped = ParseExpertTensorName("decoder.layers.0.mlp.experts.linear_fc2.weight11");
  ASSERT_TRUE(grouped.has_value());
  EXPECT_EQ(grouped->experts, "decoder.layers.0.mlp.experts");
  EXPECT_EQ(grouped->local, 11);
  EXPECT_EQ(grouped->rest, "linear_fc2.weight");
  auto bias = ParseExpertTensorName("decoder.layers.0.mlp.experts.linear_fc1.bias0");
  ASSERT_TRUE(bias.has_value());
  EXPECT_EQ(bias->rest, "linear_fc1.bias");

  for (const char* name : {"decoder.layers.0.mlp.shared_experts.linear_fc1.weight",
                           "decoder.layers.0.mlp.router.weight",
                           "decoder.layers.0.mlp.experts.linear_fc1.weight",
                           "decoder.layers.0.mlp.experts.local_experts.x.linear_fc1.weight",
                           "decoder.layers.0.mlp.linear_fc1.weight"}) {
    EXPECT_FALSE(ParseExpertTensorName(name).has_value()) << name;
  }

  // 8 experts over EP 4: rank 3's local expert 1 is expert 7.
  EXPECT_EQ(GlobalExpertId(3, 2, 1), 7);
  EXPECT_EQ(GlobalExpertId(0, 4, 3), 3);
  EXPECT_EQ(GlobalExpertId(1, 4, 0), 4);
  EXPECT_EQ(ExpertTensorNameFor(*grouped, GlobalExpertId(1, 4, 3)),
            "decoder.layers.0.mlp.experts.local_experts.7.linear_fc2.weight");
}

TEST(MegatronExpertsTest, RulesOfMegatronCoreNames) {
  auto rules = PartitionRules::Create(MegatronPartitionRules(/*swiglu=*/true, 24));
  ASSERT_TRUE(rules.ok()) << rules.status();
  const std::vector<std::pair<std::string, int>> cases = {
      {"embedding.word_embeddings.weight", 0},
      {"decoder.layers.0.self_attention.linear_qkv.weight", 0},
      {"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", -1},
      {"decoder.layers.0.self_attention.linear_proj.weight", 1},
      {"decoder.layers.0.pre_mlp_layernorm.weight", -1},
      {"decoder.layers.0.mlp.router.weight", -1},
      {"decoder.layers.0.mlp.experts.local_experts.5.linear_fc1.weight", 0},
      {"decoder.layers.0.mlp.experts.local_experts.5.linear_fc2.weight", 1},
      {"decoder.layers.0.mlp.shared_experts.linear_fc1.weight", 0},
      {"decoder.layers.0.mlp.shared_experts.linear_fc2.weight", 1},
      {"decoder.final_layernorm.weight", -1},
      {"output_layer.weight", 0},
  };
  ExpectRules(*rules, cases, /*fused=*/std::nullopt);
  EXPECT_EQ((*rules->Match("decoder.layers.0.mlp.experts.local_experts.5.linear_fc1.weight"))
                ->fused,
            2);
  EXPECT_EQ((*rules->Match("decoder.layers.0.self_attention.linear_qkv.weight"))->unit, 24);
}

}  // namespace
}  // namespace reshard
