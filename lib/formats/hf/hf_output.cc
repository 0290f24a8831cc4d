#include "lib/formats/hf/hf_output.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/hf/hf_config.h"
#include "lib/formats/hf/hf_family.h"
#include "lib/formats/hf/hf_named.h"
#include "lib/formats/hf/model_files.h"
#include "lib/io/file_access.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/plan/layout_builders.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Json = nlohmann::ordered_json;
using Role = MegatronRole::Kind;

// The input formats whose tensors carry Megatron's names (NeMo's under `model.` / `module.`).
constexpr absl::string_view kMegatronFormats[] = {"megatron", "megatron-torch-dist", "nemo"};

constexpr char kConfigName[] = "config.json";
constexpr char kGenerationConfigName[] = "generation_config.json";

// The args Namespace's attributes: the Megatron-LM reader's "megatron.args", or the `args` of
// a torch_dist checkpoint's common state; null when neither holds them.
const StructureNode* FindArgs(const InputModel& model, const Catalog& catalog) {
  if (const StructureNode* saved = model.training_state.Value("megatron.args")) {
    if (const StructureNode* attributes = saved->Attributes()) return attributes;
  }
  const StructureNode* root = catalog.structure.get();
  for (const StructureNode* holder : {FindKey(root, "common"), root}) {
    if (const StructureNode* args = FindKey(holder, "args")) {
      if (const StructureNode* attributes = args->Attributes()) return attributes;
    }
  }
  return nullptr;
}

// The tensors of one layer, by role (catalog indices), and its experts' by global expert id.
struct LayerTensors {
  std::map<Role, int> by_role;
  std::map<int64_t, std::map<Role, int>> experts;
};

// The HF name of a layer tensor's role, for messages about a missing one.
absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kInputNorm:
      return "input_layernorm.weight";
    case Role::kPostAttentionNorm:
      return "post_attention_layernorm.weight";
    case Role::kQkvWeight:
      return "self_attn.{q,k,v}_proj.weight (fused QKV)";
    case Role::kQkvBias:
      return "self_attn.{q,k,v}_proj.bias (fused QKV bias)";
    case Role::kAttentionOutput:
      return "self_attn.o_proj.weight";
    case Role::kQNorm:
      return "self_attn.q_norm.weight";
    case Role::kKNorm:
      return "self_attn.k_norm.weight";
    case Role::kFc1Weight:
      return "mlp.{gate,up}_proj.weight (fused fc1)";
    case Role::kFc2Weight:
      return "mlp.down_proj.weight";
    case Role::kInputNormBias:
      return "ln_1.bias";
    case Role::kPostAttentionNormBias:
      return "ln_2.bias";
    case Role::kAttentionOutputBias:
      return "attn.c_proj.bias";
    case Role::kFc1Bias:
      return "mlp.c_fc.bias";
    case Role::kFc2Bias:
      return "mlp.c_proj.bias";
    case Role::kRouter:
      return "block_sparse_moe.gate.weight (router)";
    case Role::kExpertFc1:
      return "w1.weight, w3.weight (fused fc1)";
    case Role::kExpertFc2:
      return "w2.weight (fc2)";
    default:
      return "?";
  }
}

// Refuses `tensor` unless its shape is `expected`, naming both and what made the expectation.
absl::Status CheckShape(const CatalogTensor& tensor, const Shape& expected,
                        const std::string& because) {
  if (tensor.shape == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor \"", tensor.name, "\" has shape ", ShapeToString(tensor.shape),
                   ", but config.json (", because, ") makes it ", ShapeToString(expected),
                   ": the checkpoint's args (or --config) disagree with its weights"));
}

// A Megatron model's tensors by role, and what decides its family.
struct ScannedModel {
  const StructureNode* args = nullptr;
  std::map<Role, int> model_tensors;
  std::map<int64_t, LayerTensors> layers;
  FamilyEvidence evidence;
  int first_qkv_bias = -1;  // catalog index, -1: none
  int first_qk_norm = -1;
  int first_gpt2_only = -1;  // a LayerNorm or linear bias, or learned position embeddings
  int first_moe_only = -1;   // a router or an expert's tensor
};

absl::StatusOr<ScannedModel> Scan(const InputModel& model, const Catalog& catalog) {
  ScannedModel scanned;
  scanned.args = FindArgs(model, catalog);
  scanned.evidence.qk_norm = HfArgSet(scanned.args, "qk_layernorm");
  scanned.evidence.qkv_bias = HfArgSet(scanned.args, "add_qkv_bias");
  scanned.evidence.sliding_window =
      HfArgSet(scanned.args, "sliding_window") || HfArgSet(scanned.args, "window_size");
  scanned.evidence.moe = IntAttribute(scanned.args, "num_experts").value_or(0) > 1;
  // Megatron-DeepSpeed pipeline names (`3.self_attention.query_key_value.weight`) are read
  // under the Megatron-LM names of the same tensors; messages keep the checkpoint's names.
  std::vector<std::string> names;
  names.reserve(catalog.tensors.size());
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  ASSIGN_OR_RETURN(const auto pipe_names, PipeNamesToMegatronLM(names));
  for (size_t i = 0; i < catalog.tensors.size(); ++i) {
    const std::string& name = catalog.tensors[i].name;
    const auto renamed = pipe_names.find(name);
    const bool pipe = renamed != pipe_names.end();
    ASSIGN_OR_RETURN(const MegatronRole role, MegatronTensorRole(pipe ? renamed->second : name),
                     pipe ? absl::StrCat("the Megatron-DeepSpeed pipeline tensor \"", name,
                                         "\" (Megatron-LM's \"", renamed->second, "\")")
                          : std::string());
    if (role.kind == Role::kSkipped) continue;
    const int index = static_cast<int>(i);
    if (role.kind == Role::kQkvBias && scanned.first_qkv_bias < 0) scanned.first_qkv_bias = index;
    if ((role.kind == Role::kQNorm || role.kind == Role::kKNorm) && scanned.first_qk_norm < 0) {
      scanned.first_qk_norm = index;
    }
    if (IsGpt2OnlyRole(role.kind) && scanned.first_gpt2_only < 0) {
      scanned.first_gpt2_only = index;
    }
    if (IsMoeOnlyRole(role.kind) && scanned.first_moe_only < 0) scanned.first_moe_only = index;
    auto& slot = role.layer < 0     ? scanned.model_tensors
                 : role.expert >= 0 ? scanned.layers[role.layer].experts[role.expert]
                                    : scanned.layers[role.layer].by_role;
    if (!slot.emplace(role.kind, index).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors \"", catalog.tensors[slot[role.kind]].name, "\" and \"", catalog.tensors[i].name,
          "\" are the same parameter of the model under two names"));
    }
  }
  scanned.evidence.qkv_bias = scanned.evidence.qkv_bias || scanned.first_qkv_bias >= 0;
  scanned.evidence.qk_norm = scanned.evidence.qk_norm || scanned.first_qk_norm >= 0;
  scanned.evidence.gpt2 = scanned.first_gpt2_only >= 0;
  scanned.evidence.moe = scanned.evidence.moe || scanned.first_moe_only >= 0;
  return scanned;
}

bool IsMegatron(const InputModel& model) {
  return std::find(std::begin(kMegatronFormats), std::end(kMegatronFormats), model.format) !=
         std::end(kMegatronFormats);
}

}  // namespace

std::string WithHfFamilyNote(const InputModel& model, const Catalog& catalog) {
  if (const std::string folder = SavePretrainedFormatName(model); !folder.empty()) {
    return DescribeInputModel(model, folder);
  }
  if (!IsMegatron(model) || catalog.tensors.empty()) return model.description;
  absl::StatusOr<ScannedModel> scanned = Scan(model, catalog);
  if (!scanned.ok()) return model.description;
  absl::StatusOr<const HfFamily*> family = ChooseHfFamily("auto", scanned->evidence);
  if (!family.ok()) return model.description;
  const FamilyEvidence& evidence = scanned->evidence;
  const char* why = evidence.gpt2             ? "LayerNorm biases or learned position embeddings"
                    : evidence.moe            ? "mixture-of-experts layers"
                    : evidence.qk_norm        ? "q/k norms"
                    : evidence.qkv_bias       ? "a QKV bias"
                    : evidence.sliding_window ? "a sliding window"
                                              : "no q/k norms, QKV bias or sliding window";
  return absl::StrCat(model.description, model.description.empty() ? "" : "; ",
                      "--format hf --family auto: ", (*family)->id, " (", why, ")");
}

std::optional<HfExportNote> DescribeHfExport(const InputModel& model, const Catalog& catalog,
                                             const std::string& input) {
  if (IsHfNamedTrainingFormat(model.format)) {
    const absl::StatusOr<HfNamedModel> named = ReadHfNamedModel(input, HfExportOptions(), catalog);
    if (!named.ok()) {
      return HfExportNote{"", absl::StrCat("does not export to Hugging Face (--format hf) as it "
                                           "stands: ",
                                           named.status().message())};
    }
    return HfExportNote{std::string(named->family->id),
                        absl::StrCat("exports to Hugging Face as ", named->family->id,
                                     " (--format hf): ", DescribeHfNamedModel(*named))};
  }
  if (!IsMegatron(model)) return std::nullopt;
  const HfFamily* family = nullptr;  // --family auto's choice, once the tensors are known
  const absl::Status refused = [&]() -> absl::Status {
    if (catalog.tensors.empty()) {
      return absl::InvalidArgumentError("the checkpoint holds no tensors");
    }
    ASSIGN_OR_RETURN(const ScannedModel scanned, Scan(model, catalog));
    ASSIGN_OR_RETURN(family, ChooseHfFamily("auto", scanned.evidence));
    return HfOutput().Arrange(TargetLayout(), ArrangeRequest{model, catalog}).status();
  }();
  if (!refused.ok()) {
    return HfExportNote{
        "", absl::StrCat("does not export to Hugging Face",
                         family != nullptr ? absl::StrCat(" as ", family->id) : "",
                         " (--format hf) as it stands: ", refused.message())};
  }
  return HfExportNote{std::string(family->id),
                      absl::StrCat("exports to Hugging Face as ", family->id, " (--format hf)")};
}

absl::StatusOr<bool> HfOutput::PresentInput(const std::string& input, int /*parts*/,
                                             int /*pipeline_parts*/, const HfExportOptions& hf,
                                             InputModel& model, Catalog& catalog) const {
  return PresentHfNamedModel(input, hf, model, catalog);
}

absl::StatusOr<ArrangedOutput> HfOutput::Arrange(TargetLayout engine_layout,
                                                 const ArrangeRequest& request) const {
  const InputModel& model = request.model;
  const Catalog& catalog = request.catalog;
  const bool hf_named = model.training_state.Value(kHfNamedFamilyKey) != nullptr;
  if (!IsMegatron(model) && !hf_named) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--format hf writes Hugging Face models from Megatron checkpoints (megatron, "
        "megatron-torch-dist, nemo input) and from training saves under Hugging Face names "
        "(deepspeed-zero, torch-dcp input), not from ",
        model.format,
        " input; a model already under Hugging Face names is written by --format safetensors"));
  }
  if (!request.consolidate) {
    return absl::InvalidArgumentError(
        "--format hf writes one model: use `reshardctl consolidate IN OUT --format hf`");
  }
  if (hf_named) return ArrangeHfNamed(std::move(engine_layout), request);
  // The file that records the model's config is malformed: config.json cannot be written.
  RETURN_IF_ERROR(model.training_state.args_problem);

  ASSIGN_OR_RETURN(ScannedModel scanned, Scan(model, catalog));
  const StructureNode* args = scanned.args;
  const std::map<Role, int>& model_tensors = scanned.model_tensors;
  const std::map<int64_t, LayerTensors>& layers = scanned.layers;
  ASSIGN_OR_RETURN(const HfFamily* family, ChooseHfFamily(request.hf.family, scanned.evidence));
  // GPT-2's tensors first: its QKV bias would otherwise be blamed on the family.
  if (scanned.first_gpt2_only >= 0 && !family->gpt2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", catalog.tensors[scanned.first_gpt2_only].name,
        "\" is a LayerNorm or linear bias or a learned position embedding, which family ",
        family->id, " has no place for (gpt2 has: --family gpt2)"));
  }
  if (scanned.first_moe_only >= 0 && !family->moe) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", catalog.tensors[scanned.first_moe_only].name,
                     "\" belongs to a mixture-of-experts layer, which family ", family->id,
                     " has no place for (mixtral has: --family mixtral)"));
  }
  // Qwen2-MoE and Qwen3-MoE are mixtures of experts with a QKV bias or q/k norms.
  const char* moe_note =
      family->moe ? "; mixture-of-experts models with them (Qwen-MoE) are not written by "
                    "--format hf"
                  : "";
  if (scanned.first_qkv_bias >= 0 && !family->qkv_bias) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor \"", catalog.tensors[scanned.first_qkv_bias].name,
                     "\" is a QKV bias, which family ", family->id,
                     " has no place for (qwen2 has: --family qwen2", moe_note, ")"));
  }
  if (scanned.first_qk_norm >= 0 && !family->qk_norm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", catalog.tensors[scanned.first_qk_norm].name, "\" is a q/k norm, which family ",
        family->id, " has no place for (qwen3 has: --family qwen3", moe_note, ")"));
  }
  // Every family but gpt2 has a SwiGLU MLP (hidden_act "silu"): args that say the MLP is not
  // gated (NeMo's `activation: gelu`) describe no model of that family.
  if (const StructureNode* swiglu = HfArg(args, "swiglu");
      !family->gpt2 && swiglu != nullptr && swiglu->kind == StructureNode::Kind::kBool &&
      !swiglu->boolean) {
    const StructureNode* activation = HfArg(args, "activation");
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint's MLP is not SwiGLU (args.swiglu is false",
        activation != nullptr && activation->kind == StructureNode::Kind::kString
            ? absl::StrCat("; activation is ", activation->text)
            : "",
        "), but family ", family->id,
        "'s is (hidden_act \"silu\"): --format hf writes no model of this activation"));
  }
  if (family->gpt2) {
    // Megatron-LM's checkpoint_version < 2 orders the fused QKV rows otherwise ([3, nh, d] or
    // [nh, d, 3]); the views below read [nh, 3, d].
    if (const StructureNode* version = model.training_state.Value("megatron.checkpoint_version");
        version != nullptr && version->kind == StructureNode::Kind::kFloat && version->real < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint's checkpoint_version is ", version->real,
          ": --format hf --family gpt2 reads the fused QKV of checkpoint_version 2 and later "
          "([heads, 3, head_dim] rows); load and save it with a newer Megatron-LM first"));
    }
  }
  const auto embedding = model_tensors.find(Role::kEmbedding);
  if (embedding == model_tensors.end()) {
    return absl::InvalidArgumentError(
        "the checkpoint has no word embeddings (embedding.word_embeddings.weight), which a "
        "Hugging Face model needs");
  }
  const auto output_layer = model_tensors.find(Role::kOutputLayer);
  const bool tied = output_layer == model_tensors.end();
  const CatalogTensor& embeddings = catalog.tensors[embedding->second];

  HfConfigSources sources;
  sources.args = args;
  sources.family = family;
  sources.vocab_size = request.hf.vocab_size;
  sources.tied = tied;
  sources.dtype = ApplyDTypePolicy(request.dtype, embeddings.dtype);
  if (!request.hf.config_file.empty()) {
    ASSIGN_OR_RETURN(sources.overrides, ReadHfConfigOverrides(request.hf.config_file));
  }
  ASSIGN_OR_RETURN(HfModelConfig config, MakeHfConfig(sources));
  // The tokenizer's special token ids, unless --config gives them.
  ASSIGN_OR_RETURN(const HfSpecialTokens special,
                   HfTokenizerSpecialIds(request.model_files, request.archive_model_files),
                   "reading the special token ids of the tokenizer carried into the output");
  for (const auto& [key, id] :
       {std::pair<const char*, std::optional<int64_t>>{"bos_token_id", special.bos_token_id},
        {"eos_token_id", special.eos_token_id},
        {"pad_token_id", special.pad_token_id}}) {
    if (id.has_value() && !config.json.contains(key)) config.json[key] = *id;
  }
  const int64_t h = config.hidden;
  const int64_t d = config.head_dim;
  const int64_t nh = config.heads;
  const int64_t ng = config.kv_heads;
  const int64_t r = nh / ng;
  const int64_t ffn = config.intermediate;
  const std::string sizes =
      family->gpt2
          ? absl::StrCat("n_embd ", h, ", n_head ", nh, ", n_inner ", ffn)
          : absl::StrCat("hidden_size ", h, ", num_attention_heads ", nh, ", num_key_value_heads ",
                         ng, ", head_dim ", d, ", intermediate_size ", ffn);

  // The vocabulary rows: the padded ones, of which the first vocab_size are written.
  for (auto it : {embedding, output_layer}) {
    if (it == model_tensors.end()) continue;
    const CatalogTensor& tensor = catalog.tensors[it->second];
    if (tensor.shape.size() != 2 || tensor.shape[1] != h) {
      return CheckShape(tensor, {config.vocab, h}, sizes);
    }
    if (tensor.shape[0] < config.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json's vocab_size ", config.vocab, " is more than the ", tensor.shape[0],
          " rows of tensor \"", tensor.name, "\" ", ShapeToString(tensor.shape)));
    }
  }
  if (const auto norm = model_tensors.find(Role::kFinalNorm); norm != model_tensors.end()) {
    RETURN_IF_ERROR(CheckShape(catalog.tensors[norm->second], {h}, sizes));
  } else {
    return absl::InvalidArgumentError(
        "the checkpoint has no final norm (final_layernorm.weight), which a Hugging Face model "
        "needs");
  }

  // Every layer 0..L-1 with the tensors of its family, shaped as config.json says.
  std::vector<Role> required = {Role::kInputNorm, Role::kQkvWeight, Role::kAttentionOutput,
                                Role::kPostAttentionNorm};
  if (family->moe) {
    required.push_back(Role::kRouter);
  } else {
    required.push_back(Role::kFc1Weight);
    required.push_back(Role::kFc2Weight);
  }
  if (family->gpt2) {
    for (Role role : {Role::kInputNormBias, Role::kAttentionOutputBias,
                      Role::kPostAttentionNormBias, Role::kFc1Bias, Role::kFc2Bias}) {
      required.push_back(role);
    }
  }
  if (family->qkv_bias) required.push_back(Role::kQkvBias);
  if (family->qk_norm) {
    required.push_back(Role::kQNorm);
    required.push_back(Role::kKNorm);
  }
  const int64_t qkv_rows = (nh + 2 * ng) * d;
  // GPT-2's MLP has no gate: fc1 is [ffn, h].
  const int64_t fc1_rows = family->gpt2 ? ffn : 2 * ffn;
  const std::map<Role, Shape> expected = {{Role::kInputNorm, {h}},
                                          {Role::kPostAttentionNorm, {h}},
                                          {Role::kQkvWeight, {qkv_rows, h}},
                                          {Role::kQkvBias, {qkv_rows}},
                                          {Role::kAttentionOutput, {h, nh * d}},
                                          {Role::kQNorm, {d}},
                                          {Role::kKNorm, {d}},
                                          {Role::kFc1Weight, {fc1_rows, h}},
                                          {Role::kFc2Weight, {h, ffn}},
                                          {Role::kInputNormBias, {h}},
                                          {Role::kPostAttentionNormBias, {h}},
                                          {Role::kAttentionOutputBias, {h}},
                                          {Role::kFc1Bias, {ffn}},
                                          {Role::kFc2Bias, {h}},
                                          {Role::kRouter, {config.experts, h}},
                                          {Role::kExpertFc1, {2 * ffn, h}},
                                          {Role::kExpertFc2, {h, ffn}}};
  const std::string moe_sizes = absl::StrCat(sizes, ", num_local_experts ", config.experts);
  if (family->gpt2) {
    // The model-level tensors GPT-2 adds: learned positions and the final norm's bias.
    for (const auto& [role, want] : std::vector<std::pair<Role, Shape>>{
             {Role::kPositionEmbedding, {config.positions, h}}, {Role::kFinalNormBias, {h}}}) {
      const auto found = model_tensors.find(role);
      if (found == model_tensors.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the checkpoint has no ",
            role == Role::kPositionEmbedding ? "position embeddings (position_embeddings.weight)"
                                             : "final norm bias (final_layernorm.bias)",
            ", which a GPT-2 model needs"));
      }
      RETURN_IF_ERROR(CheckShape(catalog.tensors[found->second], want,
                                 absl::StrCat(sizes, ", n_positions ", config.positions)));
    }
  }
  if (!layers.empty() && layers.rbegin()->first >= config.layers) {
    const LayerTensors& extra = layers.rbegin()->second;
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", catalog.tensors[extra.by_role.begin()->second].name, "\" is in layer ",
        layers.rbegin()->first, ", but config.json's num_hidden_layers is ", config.layers));
  }
  for (int64_t layer = 0; layer < config.layers; ++layer) {
    const auto found = layers.find(layer);
    for (Role role : required) {
      if (found == layers.end() || found->second.by_role.count(role) == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer, " of the checkpoint has no tensor for ", RoleName(role),
                         " (family ", family->id, ", num_hidden_layers ", config.layers, ")"));
      }
    }
    if (family->moe) {
      // Mixtral's every layer is a mixture of experts: no dense MLP, experts 0..E-1 each with
      // fc1 and fc2.
      for (Role dense : {Role::kFc1Weight, Role::kFc2Weight}) {
        const auto it = found->second.by_role.find(dense);
        if (it == found->second.by_role.end()) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", catalog.tensors[it->second].name, "\" is a dense MLP in layer ", layer,
            ", but every layer of a mixtral model is a mixture of experts (models mixing dense "
            "and expert layers are not written by --format hf)"));
      }
      const auto& experts = found->second.experts;
      if (!experts.empty() && experts.rbegin()->first >= config.experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", catalog.tensors[experts.rbegin()->second.begin()->second].name,
            "\" is expert ", experts.rbegin()->first, " of layer ", layer,
            ", but config.json's num_local_experts is ", config.experts));
      }
      for (int64_t expert = 0; expert < config.experts; ++expert) {
        const auto held = experts.find(expert);
        for (Role role : {Role::kExpertFc1, Role::kExpertFc2}) {
          if (held == experts.end() || held->second.count(role) == 0) {
            return absl::InvalidArgumentError(
                absl::StrCat("layer ", layer, " of the checkpoint has no tensor for expert ",
                             expert, "'s ", RoleName(role), " (family ", family->id,
                             ", num_local_experts ", config.experts, ")"));
          }
        }
        for (const auto& [role, index] : held->second) {
          RETURN_IF_ERROR(CheckShape(catalog.tensors[index], expected.at(role), moe_sizes));
        }
      }
    }
    for (const auto& [role, index] : found->second.by_role) {
      RETURN_IF_ERROR(
          CheckShape(catalog.tensors[index], expected.at(role), family->moe ? moe_sizes : sizes));
    }
  }

  // A Megatron-DeepSpeed fused QKV merged from sub-params (kMegatronSubParamsKey) is [q; k; v]
  // rather than grouped per query group: it must hold exactly q, k and v. No other tensor is
  // split from sub-params.
  std::set<int> qkv_tensors;
  for (const auto& [layer, held] : layers) {
    for (Role role : {Role::kQkvWeight, Role::kQkvBias}) {
      if (const auto it = held.by_role.find(role); it != held.by_role.end()) {
        qkv_tensors.insert(it->second);
      }
    }
  }
  const std::map<std::string, StructureNode>& state = model.training_state.values;
  const std::vector<int64_t> qkv_sizes = {nh * d, ng * d, ng * d};
  for (int index = 0; index < static_cast<int>(catalog.tensors.size()); ++index) {
    const CatalogTensor& tensor = catalog.tensors[index];
    const std::optional<SubParamLayout> layout = RecordedSubParams(state, tensor.name);
    if (!layout.has_value()) continue;
    const std::string held =
        absl::StrCat("tensor \"", tensor.name, "\" (",
                     tensor.pieces.empty() ? "" : catalog.files[tensor.pieces[0].file].path,
                     ") is fused from sub-params of ", absl::StrJoin(layout->sizes, ", "),
                     " along dimension ", layout->partition_dim,
                     " (universal_checkpoint_info.parameter_with_sub_params)");
    if (qkv_tensors.count(index) == 0) {
      return absl::UnimplementedError(
          absl::StrCat(held, ": --format hf splits only a fused QKV laid out so"));
    }
    if (layout->partition_dim != 0 || layout->sizes != qkv_sizes) {
      return absl::InvalidArgumentError(absl::StrCat(
          held, ", not q, k and v of ", absl::StrJoin(qkv_sizes, ", "), " rows (", sizes, ")"));
    }
  }
  auto sub_params = [&](int index) {
    return RecordedSubParams(state, catalog.tensors[index].name).has_value();
  };

  // The HF tensors, in the order transformers names them.
  ArrangedOutput arranged;
  std::vector<OutputTensor> tensors;
  const int base = static_cast<int>(catalog.tensors.size());
  auto whole = [&](std::string name, int source) {
    const CatalogTensor& tensor = catalog.tensors[source];
    tensors.push_back({std::move(name), source, Box::Full(tensor.shape),
                       ApplyDTypePolicy(request.dtype, tensor.dtype)});
  };
  auto rows = [&](std::string name, int source, int64_t count) {
    const CatalogTensor& tensor = catalog.tensors[source];
    Box region = Box::Full(tensor.shape);
    region.extent[0] = count;
    tensors.push_back(
        {std::move(name), source, region, ApplyDTypePolicy(request.dtype, tensor.dtype)});
  };
  // A view of a catalog tensor, read as an extra tensor: its index as an OutputTensor source.
  auto view = [&](CatalogTensor viewed) {
    arranged.extra_tensors.push_back(std::move(viewed));
    return base + static_cast<int>(arranged.extra_tensors.size()) - 1;
  };
  // Block `block` (`count` blocks from it) of dimension `dim` of a view, written as `written`.
  auto region = [&](std::string name, int source, const CatalogTensor& viewed, int dim,
                    int64_t block, int64_t count, Shape written) {
    Box box = Box::Full(viewed.shape);
    box.origin[dim] = block;
    box.extent[dim] = count;
    OutputTensor out{std::move(name), source, box, ApplyDTypePolicy(request.dtype, viewed.dtype)};
    out.written_shape = std::move(written);
    tensors.push_back(std::move(out));
  };

  // A Conv1D weight ([in, out]): the transpose of Megatron's [out, in].
  auto transposed = [&](std::string name, int source) -> absl::Status {
    ASSIGN_OR_RETURN(CatalogTensor viewed, ViewPermuted(catalog.tensors[source], {1, 0}));
    const int viewed_source = view(viewed);
    region(std::move(name), viewed_source, viewed, 0, 0, viewed.shape[0], {});
    return absl::OkStatus();
  };

  if (family->gpt2) {
    rows("transformer.wte.weight", embedding->second, config.vocab);
    whole("transformer.wpe.weight", model_tensors.at(Role::kPositionEmbedding));
    for (int64_t layer = 0; layer < config.layers; ++layer) {
      const std::map<Role, int>& by_role = layers.at(layer).by_role;
      const std::string prefix = absl::StrCat("transformer.h.", layer, ".");
      whole(prefix + "ln_1.weight", by_role.at(Role::kInputNorm));
      whole(prefix + "ln_1.bias", by_role.at(Role::kInputNormBias));
      // c_attn.weight [h, 3h] is the transpose of [Q; K; V]: the fused QKV [nh * 3 * d, h]
      // viewed as [nh, 3, d, h] and permuted to [h, 3, nh, d]; its bias [nh, 3, d] to
      // [3, nh, d]. (transformers' convert_megatron_gpt2_checkpoint.py: transpose(0, 1) of
      // the [nh, 3, d, ...] view, then of the matrix.)
      for (Role role : {Role::kQkvWeight, Role::kQkvBias}) {
        const bool weight = role == Role::kQkvWeight;
        if (sub_params(by_role.at(role))) {
          // Already [Q; K; V]: the weight transposed, the bias as it is.
          if (weight) {
            RETURN_IF_ERROR(transposed(prefix + "attn.c_attn.weight", by_role.at(role)));
          } else {
            whole(prefix + "attn.c_attn.bias", by_role.at(role));
          }
          continue;
        }
        ASSIGN_OR_RETURN(CatalogTensor heads,
                         ViewAsBlocks(catalog.tensors[by_role.at(role)], 0, nh));
        ASSIGN_OR_RETURN(CatalogTensor split, ViewAsBlocks(heads, 1, 3));
        ASSIGN_OR_RETURN(
            CatalogTensor viewed,
            ViewPermuted(split, weight ? std::vector<int>{3, 1, 0, 2} : std::vector<int>{1, 0, 2}));
        const int source = view(viewed);
        region(prefix + (weight ? "attn.c_attn.weight" : "attn.c_attn.bias"), source, viewed, 0, 0,
               viewed.shape[0], weight ? Shape{h, 3 * h} : Shape{3 * h});
      }
      RETURN_IF_ERROR(
          transposed(prefix + "attn.c_proj.weight", by_role.at(Role::kAttentionOutput)));
      whole(prefix + "attn.c_proj.bias", by_role.at(Role::kAttentionOutputBias));
      whole(prefix + "ln_2.weight", by_role.at(Role::kPostAttentionNorm));
      whole(prefix + "ln_2.bias", by_role.at(Role::kPostAttentionNormBias));
      RETURN_IF_ERROR(transposed(prefix + "mlp.c_fc.weight", by_role.at(Role::kFc1Weight)));
      whole(prefix + "mlp.c_fc.bias", by_role.at(Role::kFc1Bias));
      RETURN_IF_ERROR(transposed(prefix + "mlp.c_proj.weight", by_role.at(Role::kFc2Weight)));
      whole(prefix + "mlp.c_proj.bias", by_role.at(Role::kFc2Bias));
    }
    whole("transformer.ln_f.weight", model_tensors.at(Role::kFinalNorm));
    whole("transformer.ln_f.bias", model_tensors.at(Role::kFinalNormBias));
  } else {
    rows("model.embed_tokens.weight", embedding->second, config.vocab);
    for (int64_t layer = 0; layer < config.layers; ++layer) {
      const std::map<Role, int>& by_role = layers.at(layer).by_role;
      const std::string prefix = absl::StrCat("model.layers.", layer, ".");
      whole(prefix + "input_layernorm.weight", by_role.at(Role::kInputNorm));
      // QKV: [ng * (r + 2) * d, ...] viewed as [ng, r + 2, d, ...] (or [q; k; v], below).
      for (Role role : {Role::kQkvWeight, Role::kQkvBias}) {
        const auto it = by_role.find(role);
        if (it == by_role.end()) continue;
        const char* suffix = role == Role::kQkvWeight ? ".weight" : ".bias";
        if (sub_params(it->second)) {
          // [q; k; v]: three row ranges.
          const CatalogTensor& fused = catalog.tensors[it->second];
          region(absl::StrCat(prefix, "self_attn.q_proj", suffix), it->second, fused, 0, 0,
                 nh * d, {});
          region(absl::StrCat(prefix, "self_attn.k_proj", suffix), it->second, fused, 0, nh * d,
                 ng * d, {});
          region(absl::StrCat(prefix, "self_attn.v_proj", suffix), it->second, fused, 0,
                 (nh + ng) * d, ng * d, {});
          continue;
        }
        ASSIGN_OR_RETURN(CatalogTensor grouped, ViewAsBlocks(catalog.tensors[it->second], 0, ng));
        ASSIGN_OR_RETURN(CatalogTensor viewed, ViewAsBlocks(grouped, 1, r + 2));
        const int source = view(viewed);
        auto flat = [&](int64_t heads) {
          return role == Role::kQkvWeight ? Shape{heads * d, h} : Shape{heads * d};
        };
        region(absl::StrCat(prefix, "self_attn.q_proj", suffix), source, viewed, 1, 0, r, flat(nh));
        region(absl::StrCat(prefix, "self_attn.k_proj", suffix), source, viewed, 1, r, 1, flat(ng));
        region(absl::StrCat(prefix, "self_attn.v_proj", suffix), source, viewed, 1, r + 1, 1,
               flat(ng));
      }
      whole(prefix + "self_attn.o_proj.weight", by_role.at(Role::kAttentionOutput));
      if (family->qk_norm) {
        whole(prefix + "self_attn.q_norm.weight", by_role.at(Role::kQNorm));
        whole(prefix + "self_attn.k_norm.weight", by_role.at(Role::kKNorm));
      }
      whole(prefix + "post_attention_layernorm.weight", by_role.at(Role::kPostAttentionNorm));
      // Gated fc1: [gate; up] viewed as [2, ffn, h], written as the two names given.
      auto gated = [&](int source, std::string gate, std::string up) -> absl::Status {
        ASSIGN_OR_RETURN(CatalogTensor fc1, ViewAsBlocks(catalog.tensors[source], 0, 2));
        const int fc1_source = view(fc1);
        region(std::move(gate), fc1_source, fc1, 0, 0, 1, {ffn, h});
        region(std::move(up), fc1_source, fc1, 0, 1, 1, {ffn, h});
        return absl::OkStatus();
      };
      if (family->moe) {
        // The router is block_sparse_moe.gate; expert e's [gate; up] are w1 and w3, its fc2 w2.
        const std::string moe = prefix + "block_sparse_moe.";
        whole(moe + "gate.weight", by_role.at(Role::kRouter));
        for (const auto& [expert, roles] : layers.at(layer).experts) {
          const std::string expert_prefix = absl::StrCat(moe, "experts.", expert, ".");
          RETURN_IF_ERROR(gated(roles.at(Role::kExpertFc1), expert_prefix + "w1.weight",
                                expert_prefix + "w3.weight"));
          whole(expert_prefix + "w2.weight", roles.at(Role::kExpertFc2));
        }
      } else {
        RETURN_IF_ERROR(gated(by_role.at(Role::kFc1Weight), prefix + "mlp.gate_proj.weight",
                              prefix + "mlp.up_proj.weight"));
        whole(prefix + "mlp.down_proj.weight", by_role.at(Role::kFc2Weight));
      }
    }
    whole("model.norm.weight", model_tensors.at(Role::kFinalNorm));
  }
  if (!tied) rows("lm_head.weight", output_layer->second, config.vocab);
  // The views' pieces index the catalog's files; extra tensors index extra_files.
  if (!arranged.extra_tensors.empty()) arranged.extra_files = catalog.files;

  std::vector<std::vector<OutputTensor>> shards =
      PackShards(std::move(tensors), request.max_shard_size);
  const OutputNaming names = naming();
  arranged.layout.kind = TargetLayout::Kind::kConsolidated;
  const int count = static_cast<int>(shards.size());
  for (int i = 0; i < count; ++i) {
    OutputFileLayout file;
    file.name = names.shard_file(i, count);
    file.tensors = std::move(shards[i]);
    arranged.layout.files.push_back(std::move(file));
  }
  arranged.layout.format_files.emplace_back(
      kConfigName,
      config.json.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n");
  arranged.layout.format_files.emplace_back(kGenerationConfigName,
                                            HfGenerationConfigJson(config.json));
  // The tokenizer files (request.model_files) join the output in PlanConversion
  // (AddModelFiles, lib/formats/hf/model_files.h), which leaves the two files written here as
  // they are.
  return arranged;
}

absl::StatusOr<ArrangedOutput> HfOutput::ArrangeHfNamed(TargetLayout engine_layout,
                                                        const ArrangeRequest& request) const {
  // The tensors keep their names (PresentHfNamedModel stripped the wrapper prefix), sharded as
  // the engine laid them out; config.json is --config's, else the one carried from beside the
  // save (AddModelFiles, which sets its torch_dtype after a cast).
  ArrangedOutput arranged;
  arranged.layout = std::move(engine_layout);
  std::string config_path = request.hf.config_file;
  bool carried_generation_config = false;
  for (const auto& [name, path] : request.model_files) {
    if (name == kConfigName && config_path.empty()) config_path = path;
    if (name == kGenerationConfigName) carried_generation_config = true;
  }
  if (config_path.empty()) {
    return absl::InvalidArgumentError(
        "no config.json to write: give --config FILE (the model's config.json)");
  }
  ASSIGN_OR_RETURN(const std::string text, ReadSmallFile(config_path, kMaxConfigBytes),
                   config_path);
  if (!request.hf.config_file.empty()) {
    ASSIGN_OR_RETURN(std::string updated,
                     UpdateConfigDtype(text, request.hf.config_file, request.dtype));
    arranged.layout.format_files.emplace_back(kConfigName, std::move(updated));
  }
  if (!carried_generation_config) {
    const Json config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) {
      return absl::DataLossError(absl::StrCat(config_path, ": not a JSON object"));
    }
    arranged.layout.format_files.emplace_back(kGenerationConfigName,
                                              HfGenerationConfigJson(config));
  }
  return arranged;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> HfOutput::CompanionFiles(
    const TargetLayout& layout) const {
  ASSIGN_OR_RETURN(auto files, safetensors_.CompanionFiles(layout));
  for (const auto& file : layout.format_files) files.push_back(file);
  return files;
}

namespace {
const OutputFormatRegistration<HfOutput> register_output;
}  // namespace

}  // namespace reshard
