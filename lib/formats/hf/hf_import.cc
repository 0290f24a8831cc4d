#include "lib/formats/hf/hf_import.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/hf/hf_import_config.h"
#include "lib/formats/megatron/megatron_core_names.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/plan/layout_builders.h"

namespace reshard {
namespace {

using Json = nlohmann::ordered_json;
using Kind = StructureNode::Kind;

using Sizes = HfImportSizes;
// Megatron-LM's default --make-vocab-size-divisible-by.
constexpr int64_t kVocabDivisibleBy = 128;
constexpr char kEncoder[] = "language_model.encoder.";
constexpr char kCoreLayers[] = "decoder.layers.";

// ---------------------------------------------------------------------------- args

StructureNode Float(double value) {
  StructureNode node;
  node.kind = Kind::kFloat;
  node.real = value;
  return node;
}

StructureNode TorchDType(DType dtype) {
  StructureNode node;
  node.kind = Kind::kGlobal;
  node.module = "torch";
  node.name = dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
  return node;
}

// A number as Megatron's int arguments hold it when it is integral (rotary_base is an int
// there), else as a float.
StructureNode IntOrFloat(double value) {
  if (std::floor(value) == value && std::fabs(value) < 1e15) {
    return StructureNode::Int(static_cast<int64_t>(value));
  }
  return Float(value);
}

// The argparse.Namespace of a Megatron-LM run of the model (the file comment lists the args).
StructureNode MakeArgs(const HfFamily& family, const Sizes& sizes, const Json& config, DType dtype,
                       int tp, int pp, MegatronNames names) {
  StructureNode attributes = StructureNode::Dict();
  auto set = [&](const char* key, StructureNode value) {
    attributes.Add(StructureNode::String(key), std::move(value));
  };
  const bool gqa = sizes.groups != sizes.heads;
  set("num_layers", StructureNode::Int(sizes.layers));
  set("hidden_size", StructureNode::Int(sizes.hidden));
  set("ffn_hidden_size", StructureNode::Int(sizes.ffn));
  set("num_attention_heads", StructureNode::Int(sizes.heads));
  set("group_query_attention", StructureNode::Bool(gqa));
  set("num_query_groups", StructureNode::Int(sizes.groups));
  set("kv_channels", StructureNode::Int(sizes.head_dim));
  set("max_position_embeddings", StructureNode::Int(sizes.positions));
  set("seq_length", StructureNode::Int(sizes.positions));
  set("norm_epsilon", Float(sizes.norm_epsilon));
  if (family.gpt2) {
    set("normalization", StructureNode::String("LayerNorm"));
    set("position_embedding_type", StructureNode::String("learned_absolute"));
    set("swiglu", StructureNode::Bool(false));
    set("add_bias_linear", StructureNode::Bool(true));
    set("add_qkv_bias", StructureNode::Bool(true));
    const auto found = config.find("activation_function");
    const std::string activation = found != config.end() && found->is_string()
                                       ? found->get<std::string>()
                                       : std::string("gelu_new");
    set("openai_gelu", StructureNode::Bool(activation == "gelu_new"));
    set("bias_gelu_fusion", StructureNode::Bool(activation == "gelu_fast"));
  } else {
    set("normalization", StructureNode::String("RMSNorm"));
    set("position_embedding_type", StructureNode::String("rope"));
    set("rotary_base", IntOrFloat(sizes.rope_theta.value_or(10000.0)));
    set("use_rope_scaling", StructureNode::Bool(sizes.rope_scaling_factor.has_value()));
    if (sizes.rope_scaling_factor.has_value()) {
      set("rope_scaling_factor", Float(*sizes.rope_scaling_factor));
    }
    set("swiglu", StructureNode::Bool(true));
    set("add_bias_linear", StructureNode::Bool(false));
    set("add_qkv_bias", StructureNode::Bool(family.qkv_bias));
    if (family.sliding_window) {
      const auto window = config.find("sliding_window");
      set("sliding_window", window != config.end() && window->is_number_integer()
                                ? StructureNode::Int(window->get<int64_t>())
                                : StructureNode());
    }
  }
  if (family.moe) {
    // Megatron-Core's MoE arguments: Mixtral's top-k softmax router with its load-balancing
    // loss, SequentialMLP experts, every expert on every expert-parallel rank (EP 1; the
    // megatron output sets the EP it writes) split over TP as a dense MLP.
    set("num_experts", StructureNode::Int(sizes.experts));
    set("moe_router_topk", StructureNode::Int(sizes.top_k));
    set("moe_ffn_hidden_size", StructureNode::Int(sizes.ffn));
    set("moe_router_load_balancing_type", StructureNode::String("aux_loss"));
    if (sizes.aux_loss_coef.has_value()) {
      set("moe_aux_loss_coeff", Float(*sizes.aux_loss_coef));
    }
    set("moe_router_pre_softmax", StructureNode::Bool(false));
    set("moe_grouped_gemm", StructureNode::Bool(false));
    set("expert_model_parallel_size", StructureNode::Int(1));
    set("expert_tensor_parallel_size", StructureNode::Int(tp));
  }
  if (names != MegatronNames::kMegatronLm) {
    // A Megatron-Core GPTModel of the layer spec the names are, saved per rank by torch.save.
    set("use_legacy_models", StructureNode::Bool(false));
    set("transformer_impl", StructureNode::String(names == MegatronNames::kMegatronCoreLocal
                                                      ? "local"
                                                      : "transformer_engine"));
    set("ckpt_format", StructureNode::String("torch"));
  }
  set("qk_layernorm", StructureNode::Bool(family.qk_norm));
  set("untie_embeddings_and_output_weights", StructureNode::Bool(!sizes.tied));
  set("vocab_size", StructureNode::Int(sizes.vocab));
  set("make_vocab_size_divisible_by", StructureNode::Int(kVocabDivisibleBy));
  const int64_t multiple = kVocabDivisibleBy * tp;
  set("padded_vocab_size", StructureNode::Int((sizes.vocab + multiple - 1) / multiple * multiple));
  set("params_dtype", TorchDType(dtype));
  set("fp16", StructureNode::Bool(dtype == DType::kF16));
  set("bf16", StructureNode::Bool(dtype == DType::kBF16));
  set("tensor_model_parallel_size", StructureNode::Int(tp));
  set("pipeline_model_parallel_size", StructureNode::Int(pp));
  set("virtual_pipeline_model_parallel_size", StructureNode());
  set("data_parallel_size", StructureNode::Int(1));
  set("world_size", StructureNode::Int(int64_t{tp} * pp));
  set("rank", StructureNode::Int(0));
  StructureNode args;
  args.kind = Kind::kObject;
  args.module = "argparse";
  args.name = "Namespace";
  args.construction = StructureNode::Construction::kNewObj;
  args.state.push_back(std::move(attributes));
  return args;
}

// ---------------------------------------------------------------------------- tensors

// Builds the Megatron tensors from the HF catalog's, remembering which HF tensors were used.
class Builder {
 public:
  Builder(const Catalog& hf, const std::string& config_path, const HfFamily& family,
          absl::string_view as_what)
      : hf_(hf), config_path_(config_path), family_(family), as_what_(as_what) {}

  // The HF tensor `name` of shape `shape`: InvalidArgument naming it when absent or shaped
  // otherwise, or of another dtype than the first one taken.
  absl::StatusOr<const CatalogTensor*> Take(const std::string& name, const Shape& shape) {
    const int index = hf_.Find(name);
    if (index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("the model has no tensor \"", name,
                                                     "\", which a ", family_.id, " model of ",
                                                     config_path_, " has"));
    }
    const CatalogTensor& tensor = hf_.tensors[index];
    if (tensor.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\" has shape ", ShapeToString(tensor.shape), ", but ",
                       config_path_, " makes it ", ShapeToString(shape)));
    }
    if (!dtype_.has_value()) dtype_ = tensor.dtype;
    // A Hugging Face model may mix dtypes (norms kept in fp32); a Megatron checkpoint may not.
    if (tensor.dtype != *dtype_ && as_what_ != kExportAsHf) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\" is ", DTypeName(tensor.dtype), " but the tensors before it are ",
          DTypeName(*dtype_), ": a ", as_what_, " checkpoint holds one params_dtype"));
    }
    used_.insert(index);
    return &tensor;
  }

  // `from` as the Megatron tensor `name`.
  void Whole(std::string name, const CatalogTensor& from) {
    CatalogTensor tensor = from;
    tensor.name = std::move(name);
    tensor.replicas.clear();
    out_.push_back(std::move(tensor));
  }

  absl::Status Copy(const std::string& hf_name, std::string name, const Shape& shape) {
    ASSIGN_OR_RETURN(const CatalogTensor* from, Take(hf_name, shape));
    Whole(std::move(name), *from);
    return absl::OkStatus();
  }

  // A Conv1D weight [in, out] as Megatron's [out, in].
  absl::Status Transposed(const std::string& hf_name, std::string name, const Shape& hf_shape) {
    ASSIGN_OR_RETURN(const CatalogTensor* from, Take(hf_name, hf_shape));
    ASSIGN_OR_RETURN(CatalogTensor viewed, ViewPermuted(*from, {1, 0}));
    Whole(std::move(name), viewed);
    return absl::OkStatus();
  }

  void Add(CatalogTensor tensor) { out_.push_back(std::move(tensor)); }

  // The HF tensors no Megatron tensor was made from, other than those in `skipped`.
  absl::Status CheckAllUsed(const std::set<std::string>& skipped) const {
    for (size_t i = 0; i < hf_.tensors.size(); ++i) {
      const std::string& name = hf_.tensors[i].name;
      if (used_.count(static_cast<int>(i)) != 0 || skipped.count(name) != 0) continue;
      if (as_what_ == kExportAsHf) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", name, "\" is not a parameter of a ", family_.id, " model (",
            config_path_, "): --format hf writes a model of one of the families ",
            HfFamilyList(), " under its own names (--family F reads the weights as another)"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\" has no ", as_what_, " counterpart in a ", family_.id, " model (",
          config_path_, "), so it cannot be imported; the families reshard imports ", "are ",
          HfFamilyList()));
    }
    return absl::OkStatus();
  }

  DType dtype() const { return dtype_.value_or(DType::kF32); }
  const std::string& config_path() const { return config_path_; }
  std::vector<CatalogTensor> TakeTensors() { return std::move(out_); }

 private:
  const Catalog& hf_;
  const std::string& config_path_;
  const HfFamily& family_;
  absl::string_view as_what_;
  std::optional<DType> dtype_;
  std::set<int> used_;
  std::vector<CatalogTensor> out_;
};

// Adds to `to` the pieces of `from` that hold `region` of it, placed at `to_origin`: each a
// byte range (or strided run) of the same file, so nothing is read.
void AddRegionPieces(const CatalogTensor& from, const Box& region,
                     const std::vector<int64_t>& to_origin, CatalogTensor& to) {
  const uint64_t element_size = DTypeSize(from.dtype);
  for (const SourcePiece& piece : from.pieces) {
    const std::optional<Box> common = Intersect(region, piece.box);
    if (!common.has_value()) continue;
    SourcePiece placed;
    placed.file = piece.file;
    placed.strides = piece.strides;
    placed.box.extent = common->extent;
    uint64_t skip = 0;
    for (size_t d = 0; d < common->rank(); ++d) {
      skip += (common->origin[d] - piece.box.origin[d]) * piece.strides[d];
      placed.box.origin.push_back(to_origin[d] + common->origin[d] - region.origin[d]);
    }
    placed.byte_offset = piece.byte_offset + skip * element_size;
    to.pieces.push_back(std::move(placed));
  }
}

// Rows [begin, begin + count) of `tensor` (a matrix or a vector).
Box Rows(const CatalogTensor& tensor, int64_t begin, int64_t count) {
  Box box = Box::Full(tensor.shape);
  box.origin[0] = begin;
  box.extent[0] = count;
  return box;
}

std::vector<int64_t> RowOrigin(const CatalogTensor& tensor, int64_t row) {
  std::vector<int64_t> origin(tensor.shape.size(), 0);
  origin[0] = row;
  return origin;
}

// Rows of one of q, k, v: a tensor and the row where its heads start.
struct HeadRows {
  const CatalogTensor* tensor = nullptr;
  int64_t first_row = 0;
};

// Megatron's fused query_key_value (or its bias): per query group g, its r query heads, then
// key head g, then value head g, each head_dim rows.
CatalogTensor FuseQkv(std::string name, const Sizes& sizes, HeadRows q, HeadRows k, HeadRows v) {
  const int64_t d = sizes.head_dim;
  const int64_t r = sizes.heads / sizes.groups;
  CatalogTensor fused;
  fused.name = std::move(name);
  fused.dtype = q.tensor->dtype;
  fused.shape = q.tensor->shape;
  fused.shape[0] = sizes.groups * (r + 2) * d;
  for (int64_t g = 0; g < sizes.groups; ++g) {
    const int64_t base = g * (r + 2) * d;
    AddRegionPieces(*q.tensor, Rows(*q.tensor, q.first_row + g * r * d, r * d),
                    RowOrigin(fused, base), fused);
    AddRegionPieces(*k.tensor, Rows(*k.tensor, k.first_row + g * d, d),
                    RowOrigin(fused, base + r * d), fused);
    AddRegionPieces(*v.tensor, Rows(*v.tensor, v.first_row + g * d, d),
                    RowOrigin(fused, base + (r + 1) * d), fused);
  }
  return fused;
}

// [gate; up]: Megatron's merged SwiGLU dense_h_to_4h.
CatalogTensor FuseGateUp(std::string name, const CatalogTensor& gate, const CatalogTensor& up) {
  CatalogTensor fused;
  fused.name = std::move(name);
  fused.dtype = gate.dtype;
  fused.shape = {2 * gate.shape[0], gate.shape[1]};
  AddRegionPieces(gate, Box::Full(gate.shape), {0, 0}, fused);
  AddRegionPieces(up, Box::Full(up.shape), {gate.shape[0], 0}, fused);
  return fused;
}

// The word embeddings from HF's `embeddings`, then `layer(hf, megatron, i)` for every layer i,
// with the name prefixes of its tensors (`<hf_layers><i>.`, `language_model.encoder.layers.<i>.`).
absl::Status BuildEmbeddingAndLayers(
    const Sizes& sizes, Builder& builder, const std::string& embeddings,
    const std::string& hf_layers,
    const std::function<absl::Status(const std::string&, const std::string&, int64_t)>& layer) {
  RETURN_IF_ERROR(builder.Copy(embeddings, "language_model.embedding.word_embeddings.weight",
                               {sizes.vocab, sizes.hidden}));
  for (int64_t i = 0; i < sizes.layers; ++i) {
    RETURN_IF_ERROR(
        layer(absl::StrCat(hf_layers, i, "."), absl::StrCat(kEncoder, "layers.", i, "."), i));
  }
  return absl::OkStatus();
}

// Megatron's merged SwiGLU MLP from HF's gate, up and down projections ([ffn, h], [ffn, h],
// [h, ffn]): gate and up fused as `fc1` ([gate; up]), down copied as `fc2`.
absl::Status BuildSwiGlu(const Sizes& sizes, Builder& builder, const std::string& gate_name,
                         const std::string& up_name, const std::string& down_name,
                         std::string fc1, std::string fc2) {
  const int64_t h = sizes.hidden, ffn = sizes.ffn;
  ASSIGN_OR_RETURN(const CatalogTensor* gate, builder.Take(gate_name, {ffn, h}));
  ASSIGN_OR_RETURN(const CatalogTensor* up, builder.Take(up_name, {ffn, h}));
  builder.Add(FuseGateUp(std::move(fc1), *gate, *up));
  return builder.Copy(down_name, std::move(fc2), {h, ffn});
}

// A Mixtral layer's MLP (HF names under `hf_layer`: post_attention_layernorm and
// block_sparse_moe) as Megatron-Core's MoE layer `layer` (the table in hf_import.h), the one
// mapping of mixture-of-experts layers for every output's names: InvalidArgument for
// MegatronNames::kMegatronLm, which has no such layer.
absl::Status BuildMixtralMoeLayer(const Sizes& sizes, Builder& builder,
                                  const std::string& hf_layer, int64_t layer,
                                  MegatronNames names) {
  if (names == MegatronNames::kMegatronLm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a Mixtral model (", builder.config_path(),
        ") has no Megatron-LM legacy names: Megatron-LM builds mixture-of-experts GPTs only as "
        "Megatron-Core models (its legacy SwitchMLP routes each token to one expert through a "
        "biased router), so it is imported under Megatron-Core's names"));
  }
  const int64_t h = sizes.hidden;
  const std::string mg = absl::StrCat(kCoreLayers, layer, ".");
  // Megatron-Core's MoE layers keep their own pre-MLP norm in both layer specs (only a dense
  // MLP fuses it into linear_fc1 under TransformerEngine).
  RETURN_IF_ERROR(builder.Copy(hf_layer + "post_attention_layernorm.weight",
                               mg + "pre_mlp_layernorm.weight", {h}));
  RETURN_IF_ERROR(builder.Copy(hf_layer + "block_sparse_moe.gate.weight",
                               mg + "mlp.router.weight", {sizes.experts, h}));
  for (int64_t e = 0; e < sizes.experts; ++e) {
    // Expert e's w1 (gate), w3 (up), w2 (down) as SequentialMLP's local expert e.
    const std::string from = absl::StrCat(hf_layer, "block_sparse_moe.experts.", e, ".");
    const std::string to = absl::StrCat(mg, "mlp.experts.local_experts.", e, ".");
    RETURN_IF_ERROR(BuildSwiGlu(sizes, builder, from + "w1.weight", from + "w3.weight",
                                from + "w2.weight", to + "linear_fc1.weight",
                                to + "linear_fc2.weight"));
  }
  return absl::OkStatus();
}


absl::Status BuildLlamaStyle(const HfFamily& family, const Sizes& sizes, MegatronNames names,
                             Builder& builder) {
  const int64_t h = sizes.hidden, d = sizes.head_dim, nh = sizes.heads, ng = sizes.groups;
  auto layer = [&](const std::string& hf, const std::string& mg, int64_t i) -> absl::Status {
    RETURN_IF_ERROR(
        builder.Copy(hf + "input_layernorm.weight", mg + "input_layernorm.weight", {h}));
    for (const char* suffix : {"weight", "bias"}) {
      const bool weight = absl::string_view(suffix) == "weight";
      if (!weight && !family.qkv_bias) continue;
      auto shape = [&](int64_t heads) { return weight ? Shape{heads * d, h} : Shape{heads * d}; };
      ASSIGN_OR_RETURN(const CatalogTensor* q,
                       builder.Take(absl::StrCat(hf, "self_attn.q_proj.", suffix), shape(nh)));
      ASSIGN_OR_RETURN(const CatalogTensor* k,
                       builder.Take(absl::StrCat(hf, "self_attn.k_proj.", suffix), shape(ng)));
      ASSIGN_OR_RETURN(const CatalogTensor* v,
                       builder.Take(absl::StrCat(hf, "self_attn.v_proj.", suffix), shape(ng)));
      builder.Add(FuseQkv(absl::StrCat(mg, "self_attention.query_key_value.", suffix), sizes,
                          {q, 0}, {k, 0}, {v, 0}));
    }
    if (family.qk_norm) {
      RETURN_IF_ERROR(builder.Copy(hf + "self_attn.q_norm.weight",
                                   mg + "self_attention.q_layernorm.weight", {d}));
      RETURN_IF_ERROR(builder.Copy(hf + "self_attn.k_norm.weight",
                                   mg + "self_attention.k_layernorm.weight", {d}));
    }
    RETURN_IF_ERROR(builder.Copy(hf + "self_attn.o_proj.weight", mg + "self_attention.dense.weight",
                                 {h, nh * d}));
    if (family.moe) return BuildMixtralMoeLayer(sizes, builder, hf, i, names);
    RETURN_IF_ERROR(builder.Copy(hf + "post_attention_layernorm.weight",
                                 mg + "post_attention_layernorm.weight", {h}));
    return BuildSwiGlu(sizes, builder, hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight",
                       hf + "mlp.down_proj.weight", mg + "mlp.dense_h_to_4h.weight",
                       mg + "mlp.dense_4h_to_h.weight");
  };
  RETURN_IF_ERROR(
      BuildEmbeddingAndLayers(sizes, builder, "model.embed_tokens.weight", "model.layers.", layer));
  RETURN_IF_ERROR(
      builder.Copy("model.norm.weight", absl::StrCat(kEncoder, "final_layernorm.weight"), {h}));
  return absl::OkStatus();
}

absl::Status BuildGpt2(const Sizes& sizes, Builder& builder) {
  const int64_t h = sizes.hidden, ffn = sizes.ffn;
  auto layer = [&](const std::string& hf, const std::string& mg, int64_t) -> absl::Status {
    for (const char* suffix : {"weight", "bias"}) {
      RETURN_IF_ERROR(builder.Copy(absl::StrCat(hf, "ln_1.", suffix),
                                   absl::StrCat(mg, "input_layernorm.", suffix), {h}));
    }
    // c_attn.weight [h, 3h] holds [Q | K | V] in its columns: its transpose [3h, h] holds
    // them as row blocks of h, each nh heads of d rows.
    ASSIGN_OR_RETURN(const CatalogTensor* c_attn,
                     builder.Take(hf + "attn.c_attn.weight", {h, 3 * h}));
    ASSIGN_OR_RETURN(const CatalogTensor qkv_rows, ViewPermuted(*c_attn, {1, 0}));
    builder.Add(FuseQkv(mg + "self_attention.query_key_value.weight", sizes, {&qkv_rows, 0},
                        {&qkv_rows, h}, {&qkv_rows, 2 * h}));
    ASSIGN_OR_RETURN(const CatalogTensor* c_attn_bias,
                     builder.Take(hf + "attn.c_attn.bias", {3 * h}));
    builder.Add(FuseQkv(mg + "self_attention.query_key_value.bias", sizes, {c_attn_bias, 0},
                        {c_attn_bias, h}, {c_attn_bias, 2 * h}));
    RETURN_IF_ERROR(
        builder.Transposed(hf + "attn.c_proj.weight", mg + "self_attention.dense.weight", {h, h}));
    RETURN_IF_ERROR(builder.Copy(hf + "attn.c_proj.bias", mg + "self_attention.dense.bias", {h}));
    for (const char* suffix : {"weight", "bias"}) {
      RETURN_IF_ERROR(builder.Copy(absl::StrCat(hf, "ln_2.", suffix),
                                   absl::StrCat(mg, "post_attention_layernorm.", suffix), {h}));
    }
    RETURN_IF_ERROR(
        builder.Transposed(hf + "mlp.c_fc.weight", mg + "mlp.dense_h_to_4h.weight", {h, ffn}));
    RETURN_IF_ERROR(builder.Copy(hf + "mlp.c_fc.bias", mg + "mlp.dense_h_to_4h.bias", {ffn}));
    RETURN_IF_ERROR(
        builder.Transposed(hf + "mlp.c_proj.weight", mg + "mlp.dense_4h_to_h.weight", {ffn, h}));
    RETURN_IF_ERROR(builder.Copy(hf + "mlp.c_proj.bias", mg + "mlp.dense_4h_to_h.bias", {h}));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(
      BuildEmbeddingAndLayers(sizes, builder, "transformer.wte.weight", "transformer.h.", layer));
  // Megatron's embedding holds the learned positions beside the words.
  RETURN_IF_ERROR(builder.Copy("transformer.wpe.weight",
                               "language_model.embedding.position_embeddings.weight",
                               {sizes.positions, h}));
  for (const char* suffix : {"weight", "bias"}) {
    RETURN_IF_ERROR(builder.Copy(absl::StrCat("transformer.ln_f.", suffix),
                                 absl::StrCat(kEncoder, "final_layernorm.", suffix), {h}));
  }
  return absl::OkStatus();
}

}  // namespace

MegatronNames DefaultMegatronNames(const HfFamily& family) {
  return family.moe ? MegatronNames::kMegatronCoreLocal : MegatronNames::kMegatronLm;
}

absl::StatusOr<bool> PresentHfModelAsMegatron(const std::string& input, int tensor_parallel,
                                              int pipeline_parallel, absl::string_view as_what,
                                              const HfExportOptions& hf, InputModel& model,
                                              Catalog& catalog,
                                              std::optional<MegatronNames> names) {
  if (!IsHfImportInput(model)) return false;
  const HfFamily* family = nullptr;
  if (!hf.family.empty() && hf.family != "auto") {
    absl::StatusOr<const HfFamily*> named = FindHfFamily(hf.family);
    if (!named.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--family ", hf.family, ": unknown model family; the families reshard imports into ",
          as_what, " are ", HfFamilyList(),
          " (--family auto, the default, takes config.json's model_type, else its "
          "architectures)"));
    }
    family = *named;
  }
  std::string config_path;
  ASSIGN_OR_RETURN(const Json config,
                   ReadHfInputConfig(input, hf.config_file, &config_path, as_what));
  ASSIGN_OR_RETURN(MegatronImport imported,
                   ImportHfAsMegatron(catalog, config, config_path, tensor_parallel,
                                      pipeline_parallel, family, as_what, names));
  if (imported.tied_head >= 0) {
    RETURN_IF_ERROR(CheckTiedHeadEqualsEmbedding(catalog, imported.tied_head,
                                                 imported.tied_embedding, config_path, as_what));
  }
  catalog = std::move(imported.catalog);
  model.training_state = std::move(imported.training_state);
  model.default_rules = std::move(imported.rules);
  model.description = absl::StrCat(model.description, model.description.empty() ? "" : "; ",
                                   "Hugging Face ", imported.family->id, " model imported as ",
                                   as_what);
  return true;
}

absl::StatusOr<MegatronImport> ImportHfAsMegatron(const Catalog& catalog, const Json& config_json,
                                                  const std::string& config_path,
                                                  int tensor_parallel, int pipeline_parallel,
                                                  const HfFamily* family_override,
                                                  absl::string_view as_what,
                                                  std::optional<MegatronNames> names_asked) {
  MegatronImport imported;
  if (family_override != nullptr) {
    imported.family = family_override;
  } else {
    ASSIGN_OR_RETURN(imported.family, HfImportFamilyOfConfig(config_json, config_path, as_what));
  }
  const HfFamily& family = *imported.family;
  const MegatronNames names = names_asked.value_or(DefaultMegatronNames(family));
  ASSIGN_OR_RETURN(const Sizes sizes,
                   ReadHfImportSizes(config_json, config_path, family, as_what));
  const int tp = std::max(tensor_parallel, 1);
  if (sizes.heads % tp != 0 || sizes.groups % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": ", sizes.heads, " attention heads in ", sizes.groups,
        " query groups do not divide into TP ", tp,
        ": Megatron keeps whole heads and query groups on every tensor-parallel rank"));
  }

  Builder builder(catalog, config_path, family, as_what);
  if (family.gpt2) {
    RETURN_IF_ERROR(BuildGpt2(sizes, builder));
  } else {
    RETURN_IF_ERROR(BuildLlamaStyle(family, sizes, names, builder));
  }
  std::set<std::string> skipped;
  if (family.gpt2) {
    // The causal-mask buffers older transformers saved with GPT-2: not parameters.
    for (int64_t i = 0; i < sizes.layers; ++i) {
      skipped.insert(absl::StrCat("transformer.h.", i, ".attn.bias"));
      skipped.insert(absl::StrCat("transformer.h.", i, ".attn.masked_bias"));
    }
  }
  const std::string lm_head = kHfLmHead;
  if (sizes.tied) {
    // A tied model's head is the embedding: transformers ties it on load. A head saved anyway
    // is left out once PresentHfModelAsMegatron has found it equal to the embedding.
    skipped.insert(lm_head);
    ASSIGN_OR_RETURN(const SavedTiedHead saved, FindSavedTiedHead(catalog, family, config_path));
    imported.tied_head = saved.head;
    imported.tied_embedding = saved.embedding;
  } else {
    RETURN_IF_ERROR(
        builder.Copy(lm_head, "language_model.output_layer.weight", {sizes.vocab, sizes.hidden}));
  }
  RETURN_IF_ERROR(builder.CheckAllUsed(skipped));

  imported.catalog.format = catalog.format;
  imported.catalog.files = catalog.files;
  imported.catalog.tensors = builder.TakeTensors();
  if (names != MegatronNames::kMegatronLm) {
    // Megatron-Core's names of the tensors built under Megatron-LM's (the MoE layers are built
    // under Megatron-Core's already).
    const MegatronCoreSpec spec = names == MegatronNames::kMegatronCoreLocal
                                      ? MegatronCoreSpec::kLocal
                                      : MegatronCoreSpec::kTransformerEngine;
    for (CatalogTensor& tensor : imported.catalog.tensors) {
      if (!absl::StartsWith(tensor.name, "language_model.")) continue;
      ASSIGN_OR_RETURN(const MegatronCoreTensor core, MegatronCoreName(tensor.name, spec));
      tensor.name = core.UnstackedName();
    }
  }
  imported.catalog.Reindex();

  TrainingState& state = imported.training_state;
  state.values["megatron.args"] =
      MakeArgs(family, sizes, config_json, builder.dtype(), tp, std::max(pipeline_parallel, 1),
               names);
  state.values["megatron.iteration"] = StructureNode::Int(0);
  state.values["megatron.checkpoint_version"] = Float(3.0);
  state.values["megatron.release"] = StructureNode::Bool(true);
  state.values[kHfImportFamilyKey] = StructureNode::String(std::string(family.id));

  imported.rules = MegatronPartitionRules(/*swiglu=*/!family.gpt2,
                                          (sizes.heads / sizes.groups + 2) * sizes.head_dim);
  // The output cuts the vocabulary for each TP rank itself, padded (megatron_output.h).
  const std::string model = names == MegatronNames::kMegatronLm ? "language_model\\." : "";
  imported.rules.insert(
      imported.rules.begin(),
      {PartitionRule{absl::StrCat("^", model, "embedding\\.word_embeddings\\.weight$"), true},
       PartitionRule{absl::StrCat("^", model, "output_layer\\.weight$"), true}});
  return imported;
}

}  // namespace reshard
