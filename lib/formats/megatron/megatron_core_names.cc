#include "lib/formats/megatron/megatron_core_names.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "lib/formats/megatron/megatron_layout.h"

namespace reshard {
namespace {

constexpr char kLayersKey[] = "decoder.layers.";
// A layer's experts: SequentialMLP's per-expert prefix (global ids) and its stacked key's.
constexpr char kLocalExperts[] = "mlp.experts.local_experts.";
constexpr char kStackedExperts[] = "mlp.experts.experts.";

// A legacy layer tensor: its Megatron-Core <rest> in the TransformerEngine and local specs.
struct LegacyLayerTensor {
  absl::string_view legacy;
  absl::string_view te;
  absl::string_view local;
};

constexpr LegacyLayerTensor kLegacyLayerTensors[] = {
    {"input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight",
     "input_layernorm.weight"},
    {"input_layernorm.bias", "self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
    {"self_attention.query_key_value.weight", "self_attention.linear_qkv.weight",
     "self_attention.linear_qkv.weight"},
    {"self_attention.query_key_value.bias", "self_attention.linear_qkv.bias",
     "self_attention.linear_qkv.bias"},
    {"self_attention.dense.weight", "self_attention.linear_proj.weight",
     "self_attention.linear_proj.weight"},
    {"self_attention.dense.bias", "self_attention.linear_proj.bias",
     "self_attention.linear_proj.bias"},
    {"self_attention.q_layernorm.weight", "self_attention.q_layernorm.weight",
     "self_attention.q_layernorm.weight"},
    {"self_attention.k_layernorm.weight", "self_attention.k_layernorm.weight",
     "self_attention.k_layernorm.weight"},
    {"post_attention_layernorm.weight", "mlp.linear_fc1.layer_norm_weight",
     "pre_mlp_layernorm.weight"},
    {"post_attention_layernorm.bias", "mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"},
    {"mlp.dense_h_to_4h.weight", "mlp.linear_fc1.weight", "mlp.linear_fc1.weight"},
    {"mlp.dense_h_to_4h.bias", "mlp.linear_fc1.bias", "mlp.linear_fc1.bias"},
    {"mlp.dense_4h_to_h.weight", "mlp.linear_fc2.weight", "mlp.linear_fc2.weight"},
    {"mlp.dense_4h_to_h.bias", "mlp.linear_fc2.bias", "mlp.linear_fc2.bias"},
};

// Megatron-Core tensors that tensor parallelism splits, and on which axis; the others are
// replicated.
constexpr std::pair<absl::string_view, int> kSplitTensors[] = {
    {"embedding.word_embeddings.weight", 0},
    {"output_layer.weight", 0},
    {"decoder.layers.self_attention.linear_qkv.weight", 0},
    {"decoder.layers.self_attention.linear_qkv.bias", 0},
    {"decoder.layers.self_attention.linear_proj.weight", 1},
    {"decoder.layers.mlp.linear_fc1.weight", 0},
    {"decoder.layers.mlp.linear_fc1.bias", 0},
    {"decoder.layers.mlp.linear_fc2.weight", 1},
    {"decoder.layers.mlp.experts.experts.linear_fc1.weight", 0},
    {"decoder.layers.mlp.experts.experts.linear_fc1.bias", 0},
    {"decoder.layers.mlp.experts.experts.linear_fc2.weight", 1},
    {"decoder.layers.mlp.shared_experts.linear_fc1.weight", 0},
    {"decoder.layers.mlp.shared_experts.linear_fc1.bias", 0},
    {"decoder.layers.mlp.shared_experts.linear_fc2.weight", 1},
};

// A legacy expert tensor's Megatron-Core name inside the expert.
constexpr std::pair<absl::string_view, absl::string_view> kLegacyExpertTensors[] = {
    {"dense_h_to_4h.weight", "linear_fc1.weight"},
    {"dense_h_to_4h.bias", "linear_fc1.bias"},
    {"dense_4h_to_h.weight", "linear_fc2.weight"},
    {"dense_4h_to_h.bias", "linear_fc2.bias"},
};

int TpAxis(absl::string_view key) {
  for (const auto& [split, axis] : kSplitTensors) {
    if (key == split) return axis;
  }
  return -1;
}

// "<digits>.<rest>" -> (index, rest).
std::optional<std::pair<int64_t, absl::string_view>> SplitLayer(absl::string_view inside) {
  const size_t dot = inside.find('.');
  if (dot == absl::string_view::npos) return std::nullopt;
  const std::optional<int> index = ParseMegatronIndex(inside.substr(0, dot));
  if (!index.has_value() || dot + 1 == inside.size()) return std::nullopt;
  return std::make_pair(int64_t{*index}, inside.substr(dot + 1));
}

MegatronCoreTensor Tensor(std::string key, int64_t layer = -1, int64_t expert = -1) {
  MegatronCoreTensor tensor;
  tensor.tp_axis = TpAxis(key);
  tensor.key = std::move(key);
  tensor.layer = layer;
  tensor.expert = expert;
  return tensor;
}

// Layer `layer`'s tensor `rest` (inside the layer) when it is an expert's, as Megatron-Core
// names it; nullopt otherwise. Under a legacy prefix (`legacy`) the expert may also be legacy
// SwitchMLP's `mlp.local_experts.<e>.`, and its tensors named as the legacy MLP names them
// (dense_h_to_4h, dense_4h_to_h) or as Megatron-Core's (linear_fc1, linear_fc2).
std::optional<MegatronCoreTensor> ExpertTensor(int64_t layer, absl::string_view rest,
                                               bool legacy) {
  if (!absl::ConsumePrefix(&rest, kLocalExperts) &&
      !(legacy && absl::ConsumePrefix(&rest, "mlp.local_experts."))) {
    return std::nullopt;
  }
  const std::optional<std::pair<int64_t, absl::string_view>> expert = SplitLayer(rest);
  if (!expert.has_value()) return std::nullopt;
  absl::string_view inside = expert->second;
  if (legacy) {
    const auto* found = std::find_if(std::begin(kLegacyExpertTensors),
                                     std::end(kLegacyExpertTensors),
                                     [&](const auto& pair) { return pair.first == inside; });
    if (found != std::end(kLegacyExpertTensors)) inside = found->second;
  }
  if (!absl::StartsWith(inside, "linear_fc")) return std::nullopt;
  return Tensor(absl::StrCat(kLayersKey, kStackedExperts, inside), layer, expert->first);
}

}  // namespace

std::string MegatronCoreTensor::UnstackedName() const {
  if (layer < 0) return key;
  absl::string_view rest = key;
  if (!absl::ConsumePrefix(&rest, kLayersKey)) return key;
  if (expert >= 0 && absl::ConsumePrefix(&rest, kStackedExperts)) {
    return absl::StrCat(kLayersKey, layer, ".", kLocalExperts, expert, ".", rest);
  }
  return absl::StrCat(kLayersKey, layer, ".", rest);
}

absl::StatusOr<MegatronCoreTensor> MegatronCoreName(absl::string_view name,
                                                    MegatronCoreSpec spec) {
  if (absl::EndsWith(name, "._extra_state")) {
    MegatronCoreTensor skipped;
    skipped.key = std::string(name);
    skipped.skipped = true;
    return skipped;
  }
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, "language_model.")) {
    // Megatron-Core names: the layers stacked again, everything else as it is.
    absl::string_view inside = name;
    if (absl::ConsumePrefix(&inside, kLayersKey)) {
      if (auto layer = SplitLayer(inside); layer.has_value()) {
        if (std::optional<MegatronCoreTensor> expert =
                ExpertTensor(layer->first, layer->second, /*legacy=*/false)) {
          return *std::move(expert);
        }
        return Tensor(absl::StrCat(kLayersKey, layer->second), layer->first);
      }
    }
    return Tensor(std::string(name));
  }
  if (rest == "embedding.word_embeddings.weight" ||
      rest == "embedding.position_embeddings.weight" || rest == "output_layer.weight") {
    return Tensor(std::string(rest));
  }
  for (absl::string_view stack : {"encoder.", "transformer."}) {
    absl::string_view inside = rest;
    if (!absl::ConsumePrefix(&inside, stack)) continue;
    if (inside == "final_layernorm.weight" || inside == "final_layernorm.bias") {
      return Tensor(absl::StrCat("decoder.", inside));
    }
    if (!absl::ConsumePrefix(&inside, "layers.")) break;
    const auto layer = SplitLayer(inside);
    if (!layer.has_value()) break;
    for (const LegacyLayerTensor& tensor : kLegacyLayerTensors) {
      if (layer->second != tensor.legacy) continue;
      const absl::string_view core =
          spec == MegatronCoreSpec::kTransformerEngine ? tensor.te : tensor.local;
      return Tensor(absl::StrCat(kLayersKey, core), layer->first);
    }
    if (layer->second == "mlp.router.weight") {
      return Tensor(absl::StrCat(kLayersKey, layer->second), layer->first);
    }
    if (std::optional<MegatronCoreTensor> expert =
            ExpertTensor(layer->first, layer->second, /*legacy=*/true)) {
      return *std::move(expert);
    }
    break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor \"", name,
      "\" has no Megatron-Core counterpart: only a GPT's word and position embeddings, layer "
      "norms, fused QKV (and q/k norms), attention output, MLP, final norm and output layer "
      "map onto Megatron-Core names"));
}

absl::StatusOr<std::optional<std::string>> MegatronLmName(absl::string_view name) {
  if (absl::EndsWith(name, "._extra_state")) return std::nullopt;
  if (name == "embedding.word_embeddings.weight" ||
      name == "embedding.position_embeddings.weight" || name == "output_layer.weight") {
    return absl::StrCat("language_model.", name);
  }
  if (name == "decoder.final_layernorm.weight" || name == "decoder.final_layernorm.bias") {
    return absl::StrCat("language_model.encoder.", name.substr(name.find('.') + 1));
  }
  absl::string_view inside = name;
  if (absl::ConsumePrefix(&inside, kLayersKey)) {
    if (const auto layer = SplitLayer(inside); layer.has_value()) {
      for (const LegacyLayerTensor& tensor : kLegacyLayerTensors) {
        if (layer->second != tensor.te && layer->second != tensor.local) continue;
        return absl::StrCat("language_model.encoder.layers.", layer->first, ".", tensor.legacy);
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor \"", name,
      "\" has no Megatron-LM counterpart: only a GPT's word and position embeddings, layer "
      "norms, fused QKV (and q/k norms), attention output, MLP, final norm and output layer "
      "map onto Megatron-LM names"));
}

}  // namespace reshard
