#include "lib/formats/megatron/torch_dist_output.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/hf/hf_import.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/plan/layout_builders.h"
#include "lib/plan/partition_rules.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using Kind = StructureNode::Kind;

// A Llama-style GPT: hidden 8, 4 heads in 2 query groups of head dim 2 (QKV rows
// 2 x (2 + 2) x 2 = 16), SwiGLU ffn 12 (fc1 [gate; up] 24 rows), untied, vocabulary 16 rows.
constexpr int64_t kHidden = 8;
constexpr int64_t kQkvRows = 16;
constexpr int64_t kFfn = 12;
constexpr int64_t kVocab = 16;
const std::string kEncoder = "language_model.encoder.";

InputModel Model(int layers) {
  InputModel model;
  model.format = kMegatronFormatId;
  Catalog catalog;
  catalog.format = kMegatronFormatId;
  catalog.files.push_back({"/in/model_optim_rng.pt", 1 << 30});
  uint64_t offset = 0;
  auto add = [&](const std::string& name, Shape shape) {
    catalog.tensors.push_back({name, DType::kF32, shape, {}});
    catalog.tensors.back().pieces.push_back(
        {0, offset, Box::Full(shape), RowMajorStrides(shape)});
    offset += NumElementsUnchecked(shape) * 4;
  };
  add("language_model.embedding.word_embeddings.weight", {kVocab, kHidden});
  for (int i = 0; i < layers; ++i) {
    const std::string l = absl::StrCat(kEncoder, "layers.", i, ".");
    add(l + "input_layernorm.weight", {kHidden});
    add(l + "self_attention.query_key_value.weight", {kQkvRows, kHidden});
    add(l + "self_attention.dense.weight", {kHidden, kHidden});
    add(l + "post_attention_layernorm.weight", {kHidden});
    add(l + "mlp.dense_h_to_4h.weight", {2 * kFfn, kHidden});
    add(l + "mlp.dense_4h_to_h.weight", {kHidden, kFfn});
  }
  add(kEncoder + "final_layernorm.weight", {kHidden});
  add("language_model.output_layer.weight", {kVocab, kHidden});
  catalog.Reindex();
  model.parts.push_back(std::move(catalog));
  model.default_rules = MegatronPartitionRules(/*swiglu=*/true, kQkvRows / 2);
  StructureNode args = StructureNode::Dict();
  for (const auto& [key, value] :
       std::map<std::string, int64_t>{{"num_layers", layers},
                                      {"num_attention_heads", 4},
                                      {"group_query_attention", 1},
                                      {"num_query_groups", 2},
                                      {"tensor_model_parallel_size", 2},
                                      {"pipeline_model_parallel_size", 2}}) {
    args.Add(StructureNode::String(key), StructureNode::Int(value));
  }
  model.training_state.values["megatron.args"] = args;
  model.training_state.values["megatron.iteration"] = StructureNode::Int(100);
  return model;
}

// What the engine does for `consolidate` (parts 0) or `reshard --parts N [--pipeline-parts P]`.
absl::StatusOr<ArrangedOutput> Arrange(const InputModel& model, int parts,
                                       int pipeline_parts = 0) {
  const TorchDistOutput output;
  if (parts == 0) {
    ArrangeRequest request{model, model.parts[0]};
    return output.Arrange(TargetLayout{}, request);
  }
  auto rules = PartitionRules::Create(model.default_rules);
  EXPECT_TRUE(rules.ok()) << rules.status();
  static Catalog viewed;
  auto view = ViewFusedTensors(model.parts[0], *rules);
  EXPECT_TRUE(view.ok()) << view.status();
  viewed = *std::move(view);
  ArrangeRequest request{model, viewed};
  request.consolidate = false;
  request.parts = parts;
  request.pipeline_parts = pipeline_parts;
  return output.Arrange(TargetLayout{}, request);
}

// name -> (global shape, chunk boxes) of a file.
std::map<std::string, std::pair<Shape, std::vector<std::string>>> Chunks(
    const OutputFileLayout& file) {
  std::map<std::string, std::pair<Shape, std::vector<std::string>>> chunks;
  for (const OutputTensor& tensor : file.tensors) {
    chunks[tensor.name].first = tensor.global_shape;
    chunks[tensor.name].second.push_back(BoxToString(tensor.region));
  }
  return chunks;
}

TEST(TorchDistOutputTest, ConsolidatedKeysAndLayerStackedGlobalShapes) {
  const InputModel model = Model(2);
  absl::StatusOr<ArrangedOutput> arranged = Arrange(model, 0);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const std::vector<OutputFileLayout>& files = arranged->layout.files;
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].name, "iter_0000100/__0_0.distcp");
  EXPECT_EQ(files[1].name, "iter_0000100/common.pt");
  std::vector<std::pair<std::string, Shape>> keys;
  for (const OutputTensor& tensor : files[0].tensors) {
    EXPECT_EQ(tensor.region, Box::Full(tensor.global_shape)) << tensor.name;
    keys.emplace_back(tensor.name, tensor.global_shape);
  }
  const std::vector<std::pair<std::string, Shape>> expected = {
      {"embedding.word_embeddings.weight", {kVocab, kHidden}},
      {"decoder.layers.self_attention.linear_qkv.layer_norm_weight", {2, kHidden}},
      {"decoder.layers.self_attention.linear_qkv.weight", {2, kQkvRows, kHidden}},
      {"decoder.layers.self_attention.linear_proj.weight", {2, kHidden, kHidden}},
      {"decoder.layers.mlp.linear_fc1.layer_norm_weight", {2, kHidden}},
      {"decoder.layers.mlp.linear_fc1.weight", {2, 2 * kFfn, kHidden}},
      {"decoder.layers.mlp.linear_fc2.weight", {2, kHidden, kFfn}},
      {"decoder.final_layernorm.weight", {kHidden}},
      {"output_layer.weight", {kVocab, kHidden}},
  };
  EXPECT_EQ(keys, expected);
  // A stacked key reads layer l's tensor at [l, ...]: layer 1's QKV from its own bytes.
  const OutputTensor& qkv = files[0].tensors[2];
  const int base = static_cast<int>(model.parts[0].tensors.size());
  ASSERT_GE(qkv.source, base);
  const CatalogTensor& stacked = arranged->extra_tensors[qkv.source - base];
  ASSERT_EQ(stacked.pieces.size(), 2u);
  const CatalogTensor& layer1 = model.parts[0].tensors[model.parts[0].Find(
      kEncoder + "layers.1.self_attention.query_key_value.weight")];
  EXPECT_EQ(BoxToString(stacked.pieces[1].box), BoxToString(Box{{1, 0, 0}, {1, 16, 8}}));
  EXPECT_EQ(stacked.pieces[1].byte_offset, layer1.pieces[0].byte_offset);
  // Tensors outside the layers are read from the catalog as they are.
  EXPECT_EQ(files[0].tensors[0].source, 0);
  // The common state.
  ASSERT_NE(files[1].structure, nullptr);
  const StructureNode& common = *files[1].structure;
  ASSERT_EQ(common.keys.size(), 3u);
  EXPECT_EQ(common.keys[0].text, "args");
  EXPECT_EQ(common.keys[1].text, "checkpoint_version");
  EXPECT_EQ(common.values[1].real, 3.0);
  EXPECT_EQ(common.keys[2].text, "iteration");
  EXPECT_EQ(common.values[2].integer, 100);
  EXPECT_EQ(IntAttribute(&common.values[0], "tensor_model_parallel_size"), 1);
  EXPECT_EQ(IntAttribute(&common.values[0], "pipeline_model_parallel_size"), 1);
}

TEST(TorchDistOutputTest, TwoRanksChunkAsMegatronCoreShardsWithGatedHalves) {
  const InputModel model = Model(2);
  absl::StatusOr<ArrangedOutput> arranged = Arrange(model, 2);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  const std::vector<OutputFileLayout>& files = arranged->layout.files;
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].name, "iter_0000100/__0_0.distcp");
  EXPECT_EQ(files[1].name, "iter_0000100/__1_0.distcp");
  EXPECT_EQ(files[2].name, "iter_0000100/common.pt");
  auto rank0 = Chunks(files[0]);
  auto rank1 = Chunks(files[1]);
  using Chunk = std::pair<Shape, std::vector<std::string>>;
  // fc1: each rank's gate rows and its up rows of the global [gate; up], over both layers.
  EXPECT_EQ(rank0["decoder.layers.mlp.linear_fc1.weight"],
            (Chunk{{2, 24, 8}, {"[0:2, 0:6, 0:8]", "[0:2, 12:18, 0:8]"}}));
  EXPECT_EQ(rank1["decoder.layers.mlp.linear_fc1.weight"],
            (Chunk{{2, 24, 8}, {"[0:2, 6:12, 0:8]", "[0:2, 18:24, 0:8]"}}));
  EXPECT_EQ(rank1["decoder.layers.self_attention.linear_qkv.weight"],
            (Chunk{{2, 16, 8}, {"[0:2, 8:16, 0:8]"}}));
  EXPECT_EQ(rank1["decoder.layers.self_attention.linear_proj.weight"],
            (Chunk{{2, 8, 8}, {"[0:2, 0:8, 4:8]"}}));
  EXPECT_EQ(rank1["decoder.layers.mlp.linear_fc2.weight"],
            (Chunk{{2, 8, 12}, {"[0:2, 0:8, 6:12]"}}));
  EXPECT_EQ(rank1["embedding.word_embeddings.weight"], (Chunk{{16, 8}, {"[8:16, 0:8]"}}));
  EXPECT_EQ(rank1["output_layer.weight"], (Chunk{{16, 8}, {"[8:16, 0:8]"}}));
  // Replicated tensors once, by rank 0.
  EXPECT_EQ(rank1.count("decoder.final_layernorm.weight"), 0u);
  EXPECT_EQ(rank0["decoder.final_layernorm.weight"], (Chunk{{8}, {"[0:8]"}}));
  EXPECT_EQ(rank0["decoder.layers.mlp.linear_fc1.layer_norm_weight"],
            (Chunk{{2, 8}, {"[0:2, 0:8]"}}));
  EXPECT_EQ(IntAttribute(&files[2].structure->values[0], "tensor_model_parallel_size"), 2);
}

TEST(TorchDistOutputTest, CompanionFilesNameTheIterationAndTheBackends) {
  const TorchDistOutput output;
  absl::StatusOr<ArrangedOutput> arranged = Arrange(Model(1), 0);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  auto files = output.CompanionFiles(arranged->layout);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 3u);
  EXPECT_EQ((*files)[0].first, "iter_0000100/.metadata");
  EXPECT_EQ((*files)[1].first, "iter_0000100/metadata.json");
  EXPECT_EQ((*files)[1].second,
            "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1, "
            "\"common_backend\": \"torch\", \"common_backend_version\": 1}");
  EXPECT_EQ((*files)[2], std::make_pair(std::string("latest_checkpointed_iteration.txt"),
                                        std::string("100")));
}

TEST(TorchDistOutputTest, RefusesOtherInputNamingItsFormat) {
  InputModel model = Model(1);
  model.format = "safetensors";
  absl::StatusOr<ArrangedOutput> arranged = Arrange(model, 0);
  ASSERT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arranged.status().message(),
            "the megatron-torch-dist output writes Megatron-Core checkpoints from Megatron input "
            "(Megatron-LM, Megatron-DeepSpeed or Megatron-Core torch_dist: its args, iteration "
            "and layers) or from a Hugging Face model (one safetensors model and its "
            "config.json), not from safetensors input");
}

// An imported Hugging Face model: its vocab_size rows (10) padded with zero rows to
// args.padded_vocab_size (16), cut into TP row blocks; Megatron input keeps its 16 rows.
TEST(TorchDistOutputTest, ImportedVocabularyIsPaddedToPaddedVocabSize) {
  InputModel model = Model(1);
  model.format = "safetensors";
  model.training_state.values[kHfImportFamilyKey] = StructureNode::String("llama");
  model.training_state.values["megatron.release"] = StructureNode::Bool(true);
  model.training_state.values["megatron.args"].Add(StructureNode::String("padded_vocab_size"),
                                                   StructureNode::Int(kVocab));
  for (CatalogTensor& tensor : model.parts[0].tensors) {
    if (tensor.shape[0] == kVocab) {
      tensor.shape[0] = 10;
      tensor.pieces[0].box.extent[0] = 10;
    }
  }
  absl::StatusOr<ArrangedOutput> arranged = Arrange(model, 2);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  ASSERT_EQ(arranged->layout.files.size(), 3u);
  for (int r = 0; r < 2; ++r) {
    const OutputFileLayout& file = arranged->layout.files[r];
    EXPECT_EQ(file.name, absl::StrCat("release/__", r, "_0.distcp"));
    int vocabulary = 0;
    for (const OutputTensor& tensor : file.tensors) {
      if (tensor.name != "embedding.word_embeddings.weight" &&
          tensor.name != "output_layer.weight") {
        EXPECT_FALSE(tensor.zero_fill) << tensor.name;
        continue;
      }
      ++vocabulary;
      EXPECT_EQ(tensor.global_shape, (Shape{kVocab, kHidden})) << tensor.name;
      EXPECT_EQ(tensor.region, (Box{{8 * r, 0}, {8, kHidden}})) << tensor.name;
      EXPECT_TRUE(tensor.zero_fill) << tensor.name;
    }
    EXPECT_EQ(vocabulary, 2);
  }

  // Megatron input whose rows the args' padded_vocab_size already describes: unchanged.
  InputModel megatron = Model(1);
  megatron.training_state.values["megatron.args"].Add(StructureNode::String("padded_vocab_size"),
                                                      StructureNode::Int(kVocab));
  arranged = Arrange(megatron, 2);
  ASSERT_TRUE(arranged.ok()) << arranged.status();
  for (const OutputTensor& tensor : arranged->layout.files[1].tensors) {
    EXPECT_FALSE(tensor.zero_fill) << tensor.name;
    if (tensor.name == "embedding.word_embeddings.weight") {
      EXPECT_EQ(tensor.region, (Box{{8, 0}, {8, kHidden}}));
    }
  }
}

TEST(TorchDistOutputTest, RefusesRanksThatSplitAQueryGroup) {
  absl::StatusOr<ArrangedOutput> arranged = Arrange(Model(1), 4);
  ASSERT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arranged.status().message(),
            "args.num_query_groups is 2, which --parts 4 does not divide: every tensor-parallel "
            "rank of Megatron-Core holds whole query groups");
}

// --parts and --pipeline-parts are the TP x PP the common state's args record, as Megatron
// saves them (a run started with --use-checkpoint-args --use-mp-args-from-checkpoint-args
// runs at them); the input's virtual and uneven stages are reset.
TEST(TorchDistOutputTest, ArgsRecordTheTensorAndPipelineSizesAskedFor) {
  InputModel model = Model(4);
  StructureNode& args = model.training_state.values["megatron.args"];
  args.Add(StructureNode::String("virtual_pipeline_model_parallel_size"), StructureNode::Int(2));
  args.Add(StructureNode::String("decoder_first_pipeline_num_layers"), StructureNode::Int(1));
  for (const auto& [tp, pp] : std::vector<std::pair<int, int>>{{2, 2}, {1, 4}, {2, 0}}) {
    SCOPED_TRACE(absl::StrCat("TP ", tp, " PP ", pp));
    absl::StatusOr<ArrangedOutput> arranged = Arrange(model, tp, pp);
    ASSERT_TRUE(arranged.ok()) << arranged.status();
    const OutputFileLayout& common = arranged->layout.files.back();
    ASSERT_EQ(common.name, "iter_0000100/common.pt");
    const StructureNode* saved = &common.structure->values[0];
    EXPECT_EQ(IntAttribute(saved, "tensor_model_parallel_size"), tp);
    EXPECT_EQ(IntAttribute(saved, "pipeline_model_parallel_size"), pp == 0 ? 1 : pp);
    EXPECT_EQ(FindKey(saved->Attributes(), "virtual_pipeline_model_parallel_size")->kind,
              Kind::kNone);
    EXPECT_EQ(FindKey(saved->Attributes(), "decoder_first_pipeline_num_layers")->kind,
              Kind::kNone);
    // One data file per tensor-parallel rank whatever PP: each chunk spans all layers.
    EXPECT_EQ(arranged->layout.files.size(), static_cast<size_t>(tp) + 1);
  }
  absl::StatusOr<ArrangedOutput> uneven = Arrange(model, 1, 3);
  ASSERT_EQ(uneven.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(uneven.status().message(),
            "--pipeline-parts 3 does not divide the 4 layers evenly; the args record "
            "pipeline_model_parallel_size 3 for a run with the layers balanced evenly over its "
            "stages");
}

// A Hugging Face model is imported as a Megatron-Core torch_dist checkpoint, and its messages
// say so (not Megatron-LM, the legacy output's).
TEST(TorchDistOutputTest, HfImportMessagesNameMegatronCoreTorchDist) {
  const std::string folder = MakeTempDir("torch_dist_hf_import");
  Catalog catalog;
  catalog.format = "safetensors";
  catalog.files.push_back({folder + "/model.safetensors", 1 << 20});
  catalog.tensors.push_back({"model.embed_tokens.weight", DType::kF32, {4, 2}, {}});
  catalog.tensors.back().pieces.push_back({0, 64, Box::Full({4, 2}), RowMajorStrides({4, 2})});
  catalog.Reindex();
  InputModel model;
  model.format = "safetensors";
  model.parts = {catalog};
  const TorchDistOutput output;

  Catalog presented = catalog;
  absl::StatusOr<bool> done =
      output.PresentInput(folder, 1, 1, HfExportOptions{}, model, presented);
  ASSERT_EQ(done.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(done.status().message(),
            absl::StrCat(folder, "/config.json not found: a Hugging Face model is imported into "
                         "Megatron-Core torch_dist with the config.json save_pretrained writes "
                         "beside the weights (sizes, heads, vocabulary), or the one --config "
                         "FILE names; other input must be a Megatron checkpoint"));

  WriteAll(folder + "/config.json",
           R"({"model_type": "falcon", "architectures": ["FalconForCausalLM"]})");
  done = output.PresentInput(folder, 1, 1, HfExportOptions{}, model, presented);
  ASSERT_EQ(done.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(done.status().message().find(
                "which is none of the families reshard imports into Megatron-Core torch_dist: "),
            std::string::npos)
      << done.status();
}

TEST(TorchDistOutputTest, RefusesALayerMissingFromAStackedKey) {
  InputModel model = Model(2);
  Catalog& catalog = model.parts[0];
  const std::string gone = kEncoder + "layers.1.self_attention.dense.weight";
  catalog.tensors.erase(catalog.tensors.begin() + catalog.Find(gone));
  catalog.Reindex();
  absl::StatusOr<ArrangedOutput> arranged = Arrange(model, 0);
  ASSERT_EQ(arranged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arranged.status().message(),
            "\"decoder.layers.self_attention.linear_proj.weight\" has no tensor for layer 1 of 2 "
            "(from \"language_model.encoder.layers.0.self_attention.dense.weight\" and its "
            "siblings); Megatron-Core stacks every layer's tensors under one key, so every layer "
            "must hold them");
}

}  // namespace
}  // namespace reshard
