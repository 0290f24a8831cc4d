#include "lib/formats/hf/hf_import.h"

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/exec/tensor_compare.h"
#include "lib/plan/layout_builders.h"
#include "lib/testing/test_files.h"
#include "lib/plan/partition_rules.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Json = nlohmann::ordered_json;

// An HF model's tensors, each one dense row-major piece of file 0 at its own byte offset, so
// that the byte an element of a Megatron tensor is read from says which HF element it is.
class HfCatalog {
 public:
  void Add(const std::string& name, Shape shape, DType dtype = DType::kF32) {
    CatalogTensor tensor{name, dtype, shape, {}};
    tensor.pieces.push_back({0, next_, Box::Full(shape), RowMajorStrides(shape)});
    offsets_[name] = next_;
    next_ += NumElementsUnchecked(shape) * DTypeSize(dtype);
    catalog_.tensors.push_back(std::move(tensor));
  }
  // Byte of element `index` of HF tensor `name`, computed from its row-major layout.
  uint64_t ByteOf(const std::string& name, std::vector<int64_t> index) const {
    const int i = catalog_.Find(name);
    const std::vector<int64_t> strides = RowMajorStrides(catalog_.tensors[i].shape);
    uint64_t element = 0;
    for (size_t d = 0; d < index.size(); ++d) element += index[d] * strides[d];
    return offsets_.at(name) + element * DTypeSize(catalog_.tensors[i].dtype);
  }
  const Catalog& catalog() {
    catalog_.files = {{"/in/model.safetensors", next_}};
    catalog_.Reindex();
    return catalog_;
  }

 private:
  Catalog catalog_;
  std::map<std::string, uint64_t> offsets_;
  uint64_t next_ = 64;
};

// The byte element `index` of `tensor` is read from, through its pieces; -1 when no piece holds
// it, -2 when two do.
int64_t SourceByte(const CatalogTensor& tensor, const std::vector<int64_t>& index) {
  int64_t found = -1;
  for (const SourcePiece& piece : tensor.pieces) {
    bool inside = true;
    uint64_t element = 0;
    for (size_t d = 0; d < index.size(); ++d) {
      const int64_t local = index[d] - piece.box.origin[d];
      if (local < 0 || local >= piece.box.extent[d]) inside = false;
      element += local * piece.strides[d];
    }
    if (!inside) continue;
    if (found != -1) return -2;
    found = static_cast<int64_t>(piece.byte_offset + element * DTypeSize(tensor.dtype));
  }
  return found;
}

struct Llama {
  int64_t hidden = 8, heads = 4, groups = 2, head_dim = 2, ffn = 6, vocab = 10, layers = 1;
  bool tied = false;
  bool bias = false;  // qwen2
};

Json LlamaConfig(const Llama& m, const std::string& model_type) {
  Json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", model_type},
                 {"hidden_size", m.hidden},
                 {"intermediate_size", m.ffn},
                 {"num_hidden_layers", m.layers},
                 {"num_attention_heads", m.heads},
                 {"num_key_value_heads", m.groups},
                 {"head_dim", m.head_dim},
                 {"max_position_embeddings", 64},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", 500000.0},
                 {"vocab_size", m.vocab},
                 {"tie_word_embeddings", m.tied},
                 {"torch_dtype", "float32"}};
  return config;
}

// The tensors of a Llama-style model; `mlp(hf, layer prefix)` adds each layer's MLP (nullptr:
// Llama's gate, up and down projections).
HfCatalog LlamaTensors(const Llama& m,
                       const std::function<void(HfCatalog&, const std::string&)>& mlp = nullptr) {
  HfCatalog hf;
  const int64_t h = m.hidden, d = m.head_dim;
  hf.Add("model.embed_tokens.weight", {m.vocab, h});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    hf.Add(p + "input_layernorm.weight", {h});
    hf.Add(p + "self_attn.q_proj.weight", {m.heads * d, h});
    hf.Add(p + "self_attn.k_proj.weight", {m.groups * d, h});
    hf.Add(p + "self_attn.v_proj.weight", {m.groups * d, h});
    if (m.bias) {
      hf.Add(p + "self_attn.q_proj.bias", {m.heads * d});
      hf.Add(p + "self_attn.k_proj.bias", {m.groups * d});
      hf.Add(p + "self_attn.v_proj.bias", {m.groups * d});
    }
    hf.Add(p + "self_attn.o_proj.weight", {h, m.heads * d});
    hf.Add(p + "post_attention_layernorm.weight", {h});
    if (mlp) {
      mlp(hf, p);
      continue;
    }
    hf.Add(p + "mlp.gate_proj.weight", {m.ffn, h});
    hf.Add(p + "mlp.up_proj.weight", {m.ffn, h});
    hf.Add(p + "mlp.down_proj.weight", {h, m.ffn});
  }
  hf.Add("model.norm.weight", {h});
  if (!m.tied) hf.Add("lm_head.weight", {m.vocab, h});
  return hf;
}

const CatalogTensor& Tensor(const Catalog& catalog, const std::string& name) {
  const int index = catalog.Find(name);
  EXPECT_GE(index, 0) << name;
  static const CatalogTensor kNone;
  return index < 0 ? kNone : catalog.tensors[index];
}

const std::string kLayer0 = "language_model.encoder.layers.0.";

// Fused QKV row (g, s, e) for s < r is q head g * r + s, s == r k head g, s == r + 1 v head g:
// Megatron's [ng, r + 2, d] row order, computed here from the definition.
void ExpectQkvOrder(const Llama& m) {
  SCOPED_TRACE(absl::StrCat("heads ", m.heads, ", groups ", m.groups));
  HfCatalog hf = LlamaTensors(m);
  const Json config = LlamaConfig(m, m.bias ? "qwen2" : "llama");
  auto imported = ImportHfAsMegatron(hf.catalog(), config, "/in/config.json", 1, 1);
  ASSERT_TRUE(imported.ok()) << imported.status();
  const int64_t r = m.heads / m.groups, d = m.head_dim;
  for (const char* suffix : {"weight", "bias"}) {
    const bool weight = std::string(suffix) == "weight";
    if (!weight && !m.bias) continue;
    const CatalogTensor& qkv =
        Tensor(imported->catalog, absl::StrCat(kLayer0, "self_attention.query_key_value.", suffix));
    const int64_t rows = m.groups * (r + 2) * d;
    ASSERT_EQ(qkv.shape, weight ? Shape({rows, m.hidden}) : Shape({rows}));
    const int64_t cols = weight ? m.hidden : 1;
    for (int64_t g = 0; g < m.groups; ++g) {
      for (int64_t s = 0; s < r + 2; ++s) {
        for (int64_t e = 0; e < d; ++e) {
          const int64_t row = (g * (r + 2) + s) * d + e;
          std::string from = "self_attn.q_proj.";
          int64_t from_row = (g * r + s) * d + e;
          if (s == r) from = "self_attn.k_proj.", from_row = g * d + e;
          if (s == r + 1) from = "self_attn.v_proj.", from_row = g * d + e;
          for (int64_t c = 0; c < cols; ++c) {
            std::vector<int64_t> at =
                weight ? std::vector<int64_t>{row, c} : std::vector<int64_t>{row};
            std::vector<int64_t> hf_at =
                weight ? std::vector<int64_t>{from_row, c} : std::vector<int64_t>{from_row};
            ASSERT_EQ(SourceByte(qkv, at),
                      static_cast<int64_t>(
                          hf.ByteOf(absl::StrCat("model.layers.0.", from, suffix), hf_at)))
                << qkv.name << " row " << row << " col " << c;
          }
        }
      }
    }
  }
}

TEST(HfImportTest, FusedQkvOneGroup) { ExpectQkvOrder({8, 4, 1, 2, 6, 10, 1}); }

TEST(HfImportTest, FusedQkvGroupsEqualHeads) { ExpectQkvOrder({8, 4, 4, 2, 6, 10, 1}); }

TEST(HfImportTest, FusedQkvAndBiasTwoGroupsOfTwoHeads) {
  Llama m;
  m.bias = true;
  ExpectQkvOrder(m);
}

TEST(HfImportTest, GateUpAreStackedAndOtherTensorsRenamed) {
  Llama m;
  HfCatalog hf = LlamaTensors(m);
  auto imported = ImportHfAsMegatron(hf.catalog(), LlamaConfig(m, "llama"), "config.json", 1, 1);
  ASSERT_TRUE(imported.ok()) << imported.status();
  const CatalogTensor& fc1 = Tensor(imported->catalog, kLayer0 + "mlp.dense_h_to_4h.weight");
  ASSERT_EQ(fc1.shape, Shape({2 * m.ffn, m.hidden}));
  for (int64_t row = 0; row < 2 * m.ffn; ++row) {
    for (int64_t c = 0; c < m.hidden; ++c) {
      const std::string from = row < m.ffn ? "mlp.gate_proj.weight" : "mlp.up_proj.weight";
      EXPECT_EQ(SourceByte(fc1, {row, c}),
                static_cast<int64_t>(hf.ByteOf("model.layers.0." + from, {row % m.ffn, c})));
    }
  }
  const std::map<std::string, std::string> renamed = {
      {"language_model.embedding.word_embeddings.weight", "model.embed_tokens.weight"},
      {kLayer0 + "input_layernorm.weight", "model.layers.0.input_layernorm.weight"},
      {kLayer0 + "self_attention.dense.weight", "model.layers.0.self_attn.o_proj.weight"},
      {kLayer0 + "post_attention_layernorm.weight",
       "model.layers.0.post_attention_layernorm.weight"},
      {kLayer0 + "mlp.dense_4h_to_h.weight", "model.layers.0.mlp.down_proj.weight"},
      {"language_model.encoder.final_layernorm.weight", "model.norm.weight"},
      {"language_model.output_layer.weight", "lm_head.weight"}};
  for (const auto& [megatron, hf_name] : renamed) {
    const CatalogTensor& tensor = Tensor(imported->catalog, megatron);
    EXPECT_EQ(
        SourceByte(tensor, std::vector<int64_t>(tensor.shape.size(), 0)),
        static_cast<int64_t>(hf.ByteOf(hf_name, std::vector<int64_t>(tensor.shape.size(), 0))))
        << megatron;
  }
  EXPECT_EQ(imported->catalog.tensors.size(), 9u);
}

// The args' attribute `key`.
const StructureNode* Arg(const MegatronImport& imported, const std::string& key) {
  const StructureNode* args = imported.training_state.Value("megatron.args");
  EXPECT_NE(args, nullptr);
  return args == nullptr ? nullptr : FindKey(args->Attributes(), key);
}

// The args hold these ints and bools.
void ExpectArgs(const MegatronImport& imported, const std::map<std::string, int64_t>& ints,
                const std::map<std::string, bool>& bools) {
  for (const auto& [key, value] : ints) {
    const StructureNode* arg = Arg(imported, key);
    ASSERT_NE(arg, nullptr) << key;
    EXPECT_EQ(arg->kind, StructureNode::Kind::kInt) << key;
    EXPECT_EQ(arg->integer, value) << key;
  }
  for (const auto& [key, value] : bools) {
    const StructureNode* arg = Arg(imported, key);
    ASSERT_NE(arg, nullptr) << key;
    EXPECT_EQ(arg->kind, StructureNode::Kind::kBool) << key;
    EXPECT_EQ(arg->boolean, value) << key;
  }
}

TEST(HfImportTest, ArgsFromConfig) {
  Llama m;
  m.vocab = 1000;
  m.tied = true;
  HfCatalog hf = LlamaTensors(m);
  auto imported = ImportHfAsMegatron(hf.catalog(), LlamaConfig(m, "llama"), "config.json", 2, 2);
  ASSERT_TRUE(imported.ok()) << imported.status();
  const std::map<std::string, int64_t> ints = {{"num_layers", 1},
                                               {"hidden_size", 8},
                                               {"ffn_hidden_size", 6},
                                               {"num_attention_heads", 4},
                                               {"num_query_groups", 2},
                                               {"kv_channels", 2},
                                               {"max_position_embeddings", 64},
                                               {"vocab_size", 1000},
                                               {"make_vocab_size_divisible_by", 128},
                                               // ceil(1000 / (128 * 2)) * 128 * 2
                                               {"padded_vocab_size", 1024},
                                               {"rotary_base", 500000},
                                               {"tensor_model_parallel_size", 2},
                                               {"pipeline_model_parallel_size", 2},
                                               {"world_size", 4}};
  const std::map<std::string, bool> bools = {{"group_query_attention", true},
                                             {"swiglu", true},
                                             {"add_qkv_bias", false},
                                             {"qk_layernorm", false},
                                             {"add_bias_linear", false},
                                             {"bf16", false},
                                             {"fp16", false},
                                             {"untie_embeddings_and_output_weights", false},
                                             {"use_rope_scaling", false}};
  ExpectArgs(*imported, ints, bools);
  EXPECT_EQ(Arg(*imported, "norm_epsilon")->real, 1e-5);
  EXPECT_EQ(Arg(*imported, "normalization")->text, "RMSNorm");
  EXPECT_EQ(Arg(*imported, "position_embedding_type")->text, "rope");
  EXPECT_EQ(Arg(*imported, "params_dtype")->module, "torch");
  EXPECT_EQ(Arg(*imported, "params_dtype")->name, "float32");
  const StructureNode* release = imported->training_state.Value("megatron.release");
  ASSERT_NE(release, nullptr);
  EXPECT_TRUE(release->boolean);
  // Tied: no output layer.
  EXPECT_LT(imported->catalog.Find("language_model.output_layer.weight"), 0);
}

// The vocabulary keeps its rows and is replicated in the engine's split, so that 1000 rows,
// which TP 3 does not divide, still split (the megatron output cuts them, padded).
TEST(HfImportTest, VocabularyIsWholeInEverySplitPart) {
  Llama m;
  m.vocab = 1000;
  m.heads = 6;
  m.groups = 3;
  m.ffn = 6;
  HfCatalog hf = LlamaTensors(m);
  auto imported = ImportHfAsMegatron(hf.catalog(), LlamaConfig(m, "llama"), "config.json", 3, 1);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(Tensor(imported->catalog, "language_model.embedding.word_embeddings.weight").shape,
            Shape({1000, 8}));
  EXPECT_EQ(Arg(*imported, "padded_vocab_size")->integer, 1152);  // ceil(1000 / 384) * 384
  auto rules = PartitionRules::Create(imported->rules);
  ASSERT_TRUE(rules.ok()) << rules.status();
  auto viewed = ViewFusedTensors(imported->catalog, *rules);
  ASSERT_TRUE(viewed.ok()) << viewed.status();
  OutputNaming naming;
  naming.part_file = [](int rank, int) { return absl::StrCat("part", rank); };
  auto layout = BuildSplitLayout(*viewed, *rules, 3, DTypePolicy::kKeep, naming);
  ASSERT_TRUE(layout.ok()) << layout.status();
  for (const OutputFileLayout& file : layout->files) {
    for (const OutputTensor& tensor : file.tensors) {
      if (tensor.name == "language_model.embedding.word_embeddings.weight" ||
          tensor.name == "language_model.output_layer.weight") {
        EXPECT_EQ(tensor.region, Box::Full({1000, 8})) << file.name << " " << tensor.name;
      }
    }
  }
}

// A Mixtral model: Llama's attention and norms, and per layer a router over `experts` SwiGLU
// experts (w1 gate, w3 up, w2 down).
struct Mixtral {
  Llama base;
  int64_t experts = 4, top_k = 2;
};

Json MixtralConfig(const Mixtral& m) {
  Json config = LlamaConfig(m.base, "mixtral");
  config["architectures"] = {"MixtralForCausalLM"};
  config["num_local_experts"] = m.experts;
  config["num_experts_per_tok"] = m.top_k;
  config["router_aux_loss_coef"] = 0.02;
  return config;
}

HfCatalog MixtralTensors(const Mixtral& m) {
  const int64_t h = m.base.hidden, ffn = m.base.ffn;
  return LlamaTensors(m.base, [&](HfCatalog& hf, const std::string& p) {
    hf.Add(p + "block_sparse_moe.gate.weight", {m.experts, h});
    for (int64_t e = 0; e < m.experts; ++e) {
      const std::string x = absl::StrCat(p, "block_sparse_moe.experts.", e, ".");
      hf.Add(x + "w1.weight", {ffn, h});
      hf.Add(x + "w2.weight", {h, ffn});
      hf.Add(x + "w3.weight", {ffn, h});
    }
  });
}

std::vector<std::string> Names(const Catalog& catalog) {
  std::vector<std::string> names;
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  return names;
}

// Megatron-LM builds MoE GPTs only as Megatron-Core models, so a Mixtral import holds the
// state dict of Megatron-Core's GPTModel with the local layer spec and SequentialMLP experts
// (get_gpt_layer_local_spec(num_experts, moe_grouped_gemm=False)): GPTModel.embedding,
// decoder (TransformerBlock: layers.<i> = TransformerLayer: input_layernorm, self_attention
// (linear_qkv, linear_proj), pre_mlp_layernorm, mlp = MoELayer: router (TopKRouter, weight
// [E, h], no bias), experts.local_experts.<e> (MLP: linear_fc1, linear_fc2)), final_layernorm,
// output_layer. The names are written out here from that module tree.
TEST(HfImportTest, MixtralTakesMegatronCoreNames) {
  Mixtral m;
  HfCatalog hf = MixtralTensors(m);
  auto imported = ImportHfAsMegatron(hf.catalog(), MixtralConfig(m), "config.json", 2, 1);
  ASSERT_TRUE(imported.ok()) << imported.status();
  const std::vector<std::string> want = {
      "embedding.word_embeddings.weight",
      "decoder.layers.0.input_layernorm.weight",
      "decoder.layers.0.self_attention.linear_qkv.weight",
      "decoder.layers.0.self_attention.linear_proj.weight",
      "decoder.layers.0.pre_mlp_layernorm.weight",
      "decoder.layers.0.mlp.router.weight",
      "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
      "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
      "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight",
      "decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight",
      "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight",
      "decoder.layers.0.mlp.experts.local_experts.2.linear_fc2.weight",
      "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight",
      "decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight",
      "decoder.final_layernorm.weight",
      "output_layer.weight"};
  EXPECT_EQ(Names(imported->catalog), want);

  // Where each tensor's first element comes from, and expert 2's fc1 row by row: w1 (gate)
  // rows, then w3 (up) rows.
  const std::string l = "decoder.layers.0.", x2 = l + "mlp.experts.local_experts.2.";
  const std::map<std::string, std::string> from = {
      {l + "pre_mlp_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"},
      {l + "mlp.router.weight", "model.layers.0.block_sparse_moe.gate.weight"},
      {x2 + "linear_fc2.weight", "model.layers.0.block_sparse_moe.experts.2.w2.weight"},
      {l + "self_attention.linear_proj.weight", "model.layers.0.self_attn.o_proj.weight"}};
  for (const auto& [megatron, hf_name] : from) {
    const CatalogTensor& tensor = Tensor(imported->catalog, megatron);
    const std::vector<int64_t> first(tensor.shape.size(), 0);
    EXPECT_EQ(SourceByte(tensor, first), static_cast<int64_t>(hf.ByteOf(hf_name, first)))
        << megatron;
  }
  const CatalogTensor& fc1 = Tensor(imported->catalog, x2 + "linear_fc1.weight");
  ASSERT_EQ(fc1.shape, Shape({2 * m.base.ffn, m.base.hidden}));
  for (int64_t row = 0; row < 2 * m.base.ffn; ++row) {
    const std::string w = row < m.base.ffn ? "w1.weight" : "w3.weight";
    EXPECT_EQ(SourceByte(fc1, {row, 1}),
              static_cast<int64_t>(hf.ByteOf("model.layers.0.block_sparse_moe.experts.2." + w,
                                             {row % m.base.ffn, 1})))
        << row;
  }

  // The args of a Megatron-Core MoE run.
  const std::map<std::string, int64_t> ints = {{"num_experts", 4},
                                               {"moe_router_topk", 2},
                                               {"moe_ffn_hidden_size", 6},
                                               {"expert_model_parallel_size", 1},
                                               {"expert_tensor_parallel_size", 2}};
  const std::map<std::string, bool> bools = {
      {"moe_grouped_gemm", false}, {"moe_router_pre_softmax", false}, {"use_legacy_models", false}};
  ExpectArgs(*imported, ints, bools);
  const std::map<std::string, std::string> strings = {
      {"moe_router_load_balancing_type", "aux_loss"},
      {"transformer_impl", "local"},
      {"ckpt_format", "torch"}};
  for (const auto& [key, value] : strings) {
    const StructureNode* arg = Arg(*imported, key);
    ASSERT_NE(arg, nullptr) << key;
    EXPECT_EQ(arg->text, value) << key;
  }
  ASSERT_NE(Arg(*imported, "moe_aux_loss_coeff"), nullptr);
  EXPECT_EQ(Arg(*imported, "moe_aux_loss_coeff")->real, 0.02);

  // The vocabulary tensors stay whole in the engine's split under these names too.
  auto rules = PartitionRules::Create(imported->rules);
  ASSERT_TRUE(rules.ok()) << rules.status();
  for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    auto rule = rules->Match(name);
    ASSERT_TRUE(rule.ok()) << rule.status();
    EXPECT_TRUE((*rule)->replicate) << name;
  }
}

// The TransformerEngine spec fuses the input norm into linear_qkv; a MoE layer keeps its own
// pre_mlp_layernorm (TENorm), as get_gpt_layer_with_transformer_engine_spec builds it.
TEST(HfImportTest, MixtralUnderTransformerEngineNames) {
  Mixtral m;
  m.experts = 1;
  HfCatalog hf = MixtralTensors(m);
  auto imported = ImportHfAsMegatron(hf.catalog(), MixtralConfig(m), "config.json", 1, 1,
                                     nullptr, kImportAsTorchDist,
                                     MegatronNames::kMegatronCoreTransformerEngine);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(Names(imported->catalog),
            std::vector<std::string>(
                {"embedding.word_embeddings.weight",
                 "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                 "decoder.layers.0.self_attention.linear_qkv.weight",
                 "decoder.layers.0.self_attention.linear_proj.weight",
                 "decoder.layers.0.pre_mlp_layernorm.weight", "decoder.layers.0.mlp.router.weight",
                 "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight",
                 "decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight",
                 "decoder.final_layernorm.weight", "output_layer.weight"}));
  EXPECT_EQ(Arg(*imported, "transformer_impl")->text, "transformer_engine");

  auto legacy = ImportHfAsMegatron(hf.catalog(), MixtralConfig(m), "/in/config.json", 1, 1,
                                   nullptr, kImportAsMegatronLm, MegatronNames::kMegatronLm);
  EXPECT_EQ(legacy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(legacy.status().message().find(
                "a Mixtral model (/in/config.json) has no Megatron-LM legacy names"),
            std::string::npos)
      << legacy.status();
}

TEST(HfImportTest, Gpt2ConvWeightsTransposedAndQkvPerHead) {
  const int64_t h = 6, nh = 3, d = 2, vocab = 11, positions = 5;
  HfCatalog hf;
  hf.Add("transformer.wte.weight", {vocab, h});
  hf.Add("transformer.wpe.weight", {positions, h});
  const std::string p = "transformer.h.0.";
  hf.Add(p + "ln_1.weight", {h});
  hf.Add(p + "ln_1.bias", {h});
  hf.Add(p + "attn.c_attn.weight", {h, 3 * h});
  hf.Add(p + "attn.c_attn.bias", {3 * h});
  hf.Add(p + "attn.c_proj.weight", {h, h});
  hf.Add(p + "attn.c_proj.bias", {h});
  hf.Add(p + "attn.bias", {1, 1, positions, positions}, DType::kBool);
  hf.Add(p + "ln_2.weight", {h});
  hf.Add(p + "ln_2.bias", {h});
  hf.Add(p + "mlp.c_fc.weight", {h, 4 * h});
  hf.Add(p + "mlp.c_fc.bias", {4 * h});
  hf.Add(p + "mlp.c_proj.weight", {4 * h, h});
  hf.Add(p + "mlp.c_proj.bias", {h});
  hf.Add("transformer.ln_f.weight", {h});
  hf.Add("transformer.ln_f.bias", {h});
  const Json config = {{"architectures", {"GPT2LMHeadModel"}},
                       {"model_type", "gpt2"},
                       {"n_embd", h},
                       {"n_layer", 1},
                       {"n_head", nh},
                       {"n_positions", positions},
                       {"vocab_size", vocab},
                       {"activation_function", "gelu_new"}};
  auto imported = ImportHfAsMegatron(hf.catalog(), config, "config.json", 1, 1);
  ASSERT_TRUE(imported.ok()) << imported.status();
  const CatalogTensor& qkv =
      Tensor(imported->catalog, kLayer0 + "self_attention.query_key_value.weight");
  ASSERT_EQ(qkv.shape, Shape({3 * h, h}));
  // Row (n, j, e) of [nh, 3, d] is column j * h + n * d + e of c_attn.
  for (int64_t n = 0; n < nh; ++n) {
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t e = 0; e < d; ++e) {
        for (int64_t c = 0; c < h; ++c) {
          EXPECT_EQ(
              SourceByte(qkv, {(n * 3 + j) * d + e, c}),
              static_cast<int64_t>(hf.ByteOf(p + "attn.c_attn.weight", {c, j * h + n * d + e})));
        }
      }
    }
  }
  const CatalogTensor& fc1 = Tensor(imported->catalog, kLayer0 + "mlp.dense_h_to_4h.weight");
  ASSERT_EQ(fc1.shape, Shape({4 * h, h}));
  EXPECT_EQ(SourceByte(fc1, {5, 1}),
            static_cast<int64_t>(hf.ByteOf(p + "mlp.c_fc.weight", {1, 5})));
  const CatalogTensor& fc2 = Tensor(imported->catalog, kLayer0 + "mlp.dense_4h_to_h.weight");
  ASSERT_EQ(fc2.shape, Shape({h, 4 * h}));
  EXPECT_EQ(SourceByte(fc2, {1, 5}),
            static_cast<int64_t>(hf.ByteOf(p + "mlp.c_proj.weight", {5, 1})));
  EXPECT_EQ(Arg(*imported, "normalization")->text, "LayerNorm");
  EXPECT_EQ(Arg(*imported, "position_embedding_type")->text, "learned_absolute");
  EXPECT_TRUE(Arg(*imported, "openai_gelu")->boolean);
  EXPECT_FALSE(Arg(*imported, "swiglu")->boolean);
  EXPECT_FALSE(Arg(*imported, "untie_embeddings_and_output_weights")->boolean);
  EXPECT_LT(imported->catalog.Find("transformer.h.0.attn.bias"), 0);
}

TEST(HfImportTest, Refusals) {
  Llama m;
  HfCatalog hf = LlamaTensors(m);
  const Catalog& catalog = hf.catalog();
  Json config = LlamaConfig(m, "llama");

  Json unknown = config;
  unknown["model_type"] = "falcon";
  auto status = ImportHfAsMegatron(catalog, unknown, "/in/config.json", 1, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("\"falcon\""), std::string::npos) << status;
  EXPECT_NE(status.message().find("llama, mistral, qwen2, qwen3, gpt2"), std::string::npos)
      << status;

  Json uneven = config;
  uneven["num_key_value_heads"] = 3;
  status = ImportHfAsMegatron(catalog, uneven, "/in/config.json", 1, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      status.message().find("num_attention_heads 4 is not divisible by num_key_value_heads 3"),
      std::string::npos)
      << status;

  status = ImportHfAsMegatron(catalog, config, "/in/config.json", 4, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("4 attention heads in 2 query groups do not divide into TP 4"),
            std::string::npos)
      << status;

  // Only Llama 3.1's rope scaling has args; a key of another JSON type is no match.
  Json linear = config;
  linear["rope_scaling"] = {{"rope_type", "llama3"},
                            {"factor", 8.0},
                            {"low_freq_factor", "1"},
                            {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}};
  status = ImportHfAsMegatron(catalog, linear, "/in/config.json", 1, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("is not Llama 3.1's"), std::string::npos) << status;

  HfCatalog extra = LlamaTensors(m);
  extra.Add("model.layers.0.mlp.router.weight", {4, m.hidden});
  status = ImportHfAsMegatron(extra.catalog(), config, "/in/config.json", 1, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tensor \"model.layers.0.mlp.router.weight\" has no Megatron-LM"),
            std::string::npos)
      << status;

  Json wider = config;
  wider["intermediate_size"] = 7;
  status = ImportHfAsMegatron(catalog, wider, "/in/config.json", 1, 1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [6, "
                                  "8], but /in/config.json makes it [7, 8]"),
            std::string::npos)
      << status;
}

// The outputs' hook: a safetensors model whose folder holds config.json becomes the imported
// Megatron-LM model, with the args of the TP x PP asked for; other input is left alone.
TEST(HfImportTest, PresentHfModelAsMegatron) {
  Llama m;
  m.vocab = 300;
  HfCatalog hf = LlamaTensors(m);
  const std::string folder = MakeTempDir("hf_present");
  WriteAll(folder + "/config.json", LlamaConfig(m, "llama").dump());

  InputModel model;
  model.format = "safetensors";
  model.parts = {hf.catalog()};
  model.description = "safetensors, one model";
  Catalog catalog = hf.catalog();
  auto presented = PresentHfModelAsMegatron(folder + "/model.safetensors", 2, 1, "Megatron-Core",
                                            HfExportOptions{}, model, catalog);
  ASSERT_TRUE(presented.ok()) << presented.status();
  EXPECT_TRUE(*presented);
  EXPECT_EQ(model.description,
            "safetensors, one model; Hugging Face llama model imported as Megatron-Core");
  EXPECT_EQ(catalog.tensors.size(), 9u);
  EXPECT_EQ(Tensor(catalog, "language_model.embedding.word_embeddings.weight").shape,
            (Shape{300, 8}));
  EXPECT_EQ(Tensor(catalog, kLayer0 + "self_attention.query_key_value.weight").shape,
            (Shape{16, 8}));
  EXPECT_LT(catalog.Find("model.embed_tokens.weight"), 0);
  const StructureNode* family = model.training_state.Value(kHfImportFamilyKey);
  ASSERT_NE(family, nullptr);
  EXPECT_EQ(family->text, "llama");
  const StructureNode* args = model.training_state.Value("megatron.args");
  ASSERT_NE(args, nullptr);
  EXPECT_EQ(FindKey(args->Attributes(), "tensor_model_parallel_size")->integer, 2);
  EXPECT_EQ(FindKey(args->Attributes(), "pipeline_model_parallel_size")->integer, 1);
  EXPECT_EQ(FindKey(args->Attributes(), "padded_vocab_size")->integer, 512);
  ASSERT_FALSE(model.default_rules.empty());
  EXPECT_EQ(model.default_rules[0].pattern,
            "^language_model\\.embedding\\.word_embeddings\\.weight$");

  // Not a Hugging Face model: nothing changes.
  InputModel torch_model;
  torch_model.format = "torch";
  torch_model.parts = {hf.catalog()};
  Catalog unchanged = hf.catalog();
  presented = PresentHfModelAsMegatron(folder, 1, 1, "Megatron-LM", HfExportOptions{},
                                       torch_model, unchanged);
  ASSERT_TRUE(presented.ok()) << presented.status();
  EXPECT_FALSE(*presented);
  EXPECT_GE(unchanged.Find("model.embed_tokens.weight"), 0);
  EXPECT_EQ(torch_model.training_state.Value(kHfImportFamilyKey), nullptr);

  // A safetensors model without config.json beside it: InvalidArgument naming the file.
  const std::string bare = MakeTempDir("hf_present_bare");
  Catalog bare_catalog = hf.catalog();
  presented = PresentHfModelAsMegatron(bare, 1, 1, "Megatron-LM", HfExportOptions{}, model,
                                       bare_catalog);
  EXPECT_EQ(presented.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(presented.status().message().find(bare + "/config.json not found"), std::string::npos)
      << presented.status();
}

// A tied model whose weights also hold lm_head.weight: the head is compared with the word
// embeddings element by element, read from the file window by window. Equal, it is left out;
// one element different, the import is refused naming both tensors, the file and the element.
TEST(HfImportTest, SavedHeadOfATiedModelMustEqualTheEmbedding) {
  Llama m;
  m.tied = true;
  m.vocab = 300;
  HfCatalog hf = LlamaTensors(m);
  hf.Add("lm_head.weight", {m.vocab, m.hidden});
  const std::string folder = MakeTempDir("hf_tied_head");
  WriteAll(folder + "/config.json", LlamaConfig(m, "llama").dump());
  Catalog weights = hf.catalog();
  weights.files[0].path = folder + "/model.safetensors";
  std::string bytes(weights.files[0].size, '\0');
  const uint64_t embedding = hf.ByteOf("model.embed_tokens.weight", {0, 0});
  const uint64_t head = hf.ByteOf("lm_head.weight", {0, 0});
  for (int64_t i = 0; i < m.vocab * m.hidden; ++i) {
    const float value = 0.25f * static_cast<float>(i);
    std::memcpy(&bytes[embedding + 4 * i], &value, 4);
    std::memcpy(&bytes[head + 4 * i], &value, 4);
  }
  auto present = [&](const std::string& contents) -> absl::StatusOr<Catalog> {
    WriteAll(weights.files[0].path, contents);
    InputModel model;
    model.format = "safetensors";
    model.parts = {weights};
    Catalog catalog = weights;
    absl::StatusOr<bool> done =
        PresentHfModelAsMegatron(folder, 1, 1, kImportAsMegatronLm, HfExportOptions{}, model,
                                 catalog);
    if (!done.ok()) return done.status();
    return catalog;
  };

  absl::StatusOr<Catalog> equal = present(bytes);
  ASSERT_TRUE(equal.ok()) << equal.status();
  EXPECT_LT(equal->Find("language_model.output_layer.weight"), 0);
  EXPECT_LT(equal->Find("lm_head.weight"), 0);

  // Element 1234 (row 154, column 2) of the head differs in its last mantissa bit.
  bytes[head + 4 * 1234] ^= 1;
  absl::StatusOr<Catalog> differs = present(bytes);
  ASSERT_EQ(differs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(differs.status().message(),
            absl::StrCat(folder, "/model.safetensors: tensor \"lm_head.weight\" differs from "
                         "tensor \"model.embed_tokens.weight\" first at element 1234 (row 154, "
                         "column 2), but ", folder, "/config.json says tie_word_embeddings: "
                         "true, under which transformers loads the embedding as the head and "
                         "ignores the saved one; set tie_word_embeddings to false in "
                         "config.json to import the saved head as the Megatron-LM output "
                         "layer, or remove it from the weights"));
  // The same element found through windows of 64 elements (the head's row 154 is in the 20th).
  auto first = FirstDifferingElement(weights, weights.Find("lm_head.weight"),
                                     weights.Find("model.embed_tokens.weight"), 256);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, std::optional<int64_t>(1234));
}

// An InputModel of `catalog` in `format` whose one part's files are `paths`.
InputModel ModelOfFiles(const std::string& format, const Catalog& catalog,
                        const std::vector<std::string>& paths) {
  InputModel model;
  model.format = format;
  model.parts = {catalog};
  model.parts[0].files.clear();
  for (const std::string& path : paths) model.parts[0].files.push_back({path, 64});
  return model;
}

// --config FILE stands in for a folder without config.json; --family reads the weights as that
// family whatever config.json's model_type and architectures say.
TEST(HfImportTest, ConfigFileAndFamilyOverride) {
  Llama m;
  HfCatalog hf = LlamaTensors(m);
  const std::string bare = MakeTempDir("hf_present_override");
  const std::string config_file = MakeTempDir("hf_present_override_config") + "/llama.json";
  Json config = LlamaConfig(m, "falcon");
  config["architectures"] = {"FalconForCausalLM"};
  WriteAll(config_file, config.dump());

  InputModel model = ModelOfFiles("safetensors", hf.catalog(), {bare + "/model.safetensors"});
  Catalog catalog = hf.catalog();
  HfExportOptions options;
  options.config_file = config_file;
  options.family = "mistral";
  auto presented =
      PresentHfModelAsMegatron(bare, 1, 1, "Megatron-LM", options, model, catalog);
  ASSERT_TRUE(presented.ok()) << presented.status();
  EXPECT_TRUE(*presented);
  EXPECT_EQ(model.training_state.Value(kHfImportFamilyKey)->text, "mistral");
  EXPECT_EQ(Tensor(catalog, kLayer0 + "self_attention.query_key_value.weight").shape,
            (Shape{16, 8}));

  // Without --family, the config's model_type decides, and "falcon" is none of the families.
  options.family = "auto";
  Catalog again = hf.catalog();
  presented = PresentHfModelAsMegatron(bare, 1, 1, "Megatron-LM", options, model, again);
  EXPECT_EQ(presented.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(presented.status().message(),
            absl::StrCat(config_file,
                         " describes a model of model_type \"falcon\" (architectures "
                         "\"FalconForCausalLM\"), which is none of the families reshard imports "
                         "into Megatron-LM: llama, mistral, qwen2, qwen3, gpt2, mixtral "
                         "(--family F reads the weights as one of them)"));
}

TEST(HfImportTest, UnknownFamilyListsTheFamilies) {
  Llama m;
  HfCatalog hf = LlamaTensors(m);
  const std::string folder = MakeTempDir("hf_present_unknown");
  WriteAll(folder + "/config.json", LlamaConfig(m, "llama").dump());
  InputModel model = ModelOfFiles("safetensors", hf.catalog(), {folder + "/model.safetensors"});
  Catalog catalog = hf.catalog();
  HfExportOptions options;
  options.family = "falcon";
  auto presented =
      PresentHfModelAsMegatron(folder, 1, 1, "Megatron-LM", options, model, catalog);
  EXPECT_EQ(presented.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(presented.status().message(),
            "--family falcon: unknown model family; the families reshard imports into "
            "Megatron-LM are llama, mistral, qwen2, qwen3, gpt2, mixtral (--family auto, the "
            "default, takes config.json's model_type, else its architectures)");
}

// A --config whose sizes the tensors do not have: refused naming the tensor, both shapes and
// the file.
TEST(HfImportTest, ConfigFileDisagreeingWithShapes) {
  Llama m;
  HfCatalog hf = LlamaTensors(m);
  const std::string folder = MakeTempDir("hf_present_disagree");
  WriteAll(folder + "/config.json", LlamaConfig(m, "llama").dump());
  Llama wider = m;
  wider.ffn = 7;
  const std::string config_file = folder + "/other.json";
  WriteAll(config_file, LlamaConfig(wider, "llama").dump());
  InputModel model = ModelOfFiles("safetensors", hf.catalog(), {folder + "/model.safetensors"});
  Catalog catalog = hf.catalog();
  HfExportOptions options;
  options.config_file = config_file;
  auto presented =
      PresentHfModelAsMegatron(folder, 1, 1, "Megatron-LM", options, model, catalog);
  EXPECT_EQ(presented.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(presented.status().message(),
            absl::StrCat("tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [6, 8], but ",
                         config_file, " makes it [7, 8]"));
}

// save_pretrained(safe_serialization=False)'s torch.save files are a Hugging Face model; other
// torch.save files are not.
TEST(HfImportTest, PytorchModelBinIsAHuggingFaceModel) {
  Llama m;
  HfCatalog hf = LlamaTensors(m);
  EXPECT_TRUE(IsHfImportInput(ModelOfFiles("torch", hf.catalog(), {"/in/pytorch_model.bin"})));
  EXPECT_TRUE(IsHfImportInput(ModelOfFiles(
      "torch", hf.catalog(),
      {"/in/pytorch_model-00001-of-00002.bin", "/in/pytorch_model-00002-of-00002.bin"})));
  EXPECT_FALSE(IsHfImportInput(ModelOfFiles("torch", hf.catalog(), {"/in/model.pt"})));
  EXPECT_FALSE(IsHfImportInput(
      ModelOfFiles("torch", hf.catalog(), {"/in/pytorch_model.bin", "/in/extra.bin"})));
  EXPECT_TRUE(IsHfImportInput(ModelOfFiles("safetensors", hf.catalog(), {"/in/x.safetensors"})));
}

}  // namespace
}  // namespace reshard
