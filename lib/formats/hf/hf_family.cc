#include "lib/formats/hf/hf_family.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace reshard {
namespace {

using Kind = MegatronRole::Kind;

// A layer's tensors below `layers.<i>.`, Megatron-LM's and Megatron-Core's names alike.
constexpr std::pair<absl::string_view, Kind> kLayerTensors[] = {
    {"input_layernorm.weight", Kind::kInputNorm},
    {"self_attention.linear_qkv.layer_norm_weight", Kind::kInputNorm},
    {"self_attention.query_key_value.weight", Kind::kQkvWeight},
    {"self_attention.linear_qkv.weight", Kind::kQkvWeight},
    {"self_attention.query_key_value.bias", Kind::kQkvBias},
    {"self_attention.linear_qkv.bias", Kind::kQkvBias},
    {"self_attention.dense.weight", Kind::kAttentionOutput},
    {"self_attention.linear_proj.weight", Kind::kAttentionOutput},
    {"self_attention.q_layernorm.weight", Kind::kQNorm},
    {"self_attention.k_layernorm.weight", Kind::kKNorm},
    {"post_attention_layernorm.weight", Kind::kPostAttentionNorm},
    {"pre_mlp_layernorm.weight", Kind::kPostAttentionNorm},
    {"mlp.linear_fc1.layer_norm_weight", Kind::kPostAttentionNorm},
    {"mlp.dense_h_to_4h.weight", Kind::kFc1Weight},
    {"mlp.linear_fc1.weight", Kind::kFc1Weight},
    {"mlp.dense_4h_to_h.weight", Kind::kFc2Weight},
    {"mlp.linear_fc2.weight", Kind::kFc2Weight},
    {"input_layernorm.bias", Kind::kInputNormBias},
    {"self_attention.linear_qkv.layer_norm_bias", Kind::kInputNormBias},
    {"post_attention_layernorm.bias", Kind::kPostAttentionNormBias},
    {"pre_mlp_layernorm.bias", Kind::kPostAttentionNormBias},
    {"mlp.linear_fc1.layer_norm_bias", Kind::kPostAttentionNormBias},
    {"self_attention.dense.bias", Kind::kAttentionOutputBias},
    {"self_attention.linear_proj.bias", Kind::kAttentionOutputBias},
    {"mlp.dense_h_to_4h.bias", Kind::kFc1Bias},
    {"mlp.linear_fc1.bias", Kind::kFc1Bias},
    {"mlp.dense_4h_to_h.bias", Kind::kFc2Bias},
    {"mlp.linear_fc2.bias", Kind::kFc2Bias},
};

// Tensors outside the layers, with the stack prefix (`language_model.encoder.`, `decoder.`)
// already removed for the final norm.
constexpr std::pair<absl::string_view, Kind> kModelTensors[] = {
    {"language_model.embedding.word_embeddings.weight", Kind::kEmbedding},
    {"embedding.word_embeddings.weight", Kind::kEmbedding},
    {"language_model.output_layer.weight", Kind::kOutputLayer},
    {"output_layer.weight", Kind::kOutputLayer},
    {"language_model.embedding.position_embeddings.weight", Kind::kPositionEmbedding},
    {"embedding.position_embeddings.weight", Kind::kPositionEmbedding},
};

// An expert's tensors below `mlp.experts.local_experts.<g>.`.
constexpr std::pair<absl::string_view, Kind> kExpertTensors[] = {
    {"linear_fc1.weight", Kind::kExpertFc1},
    {"dense_h_to_4h.weight", Kind::kExpertFc1},
    {"linear_fc2.weight", Kind::kExpertFc2},
    {"dense_4h_to_h.weight", Kind::kExpertFc2},
};

constexpr absl::string_view kStacks[] = {"language_model.encoder.", "language_model.transformer.",
                                         "decoder."};

}  // namespace

const std::vector<HfFamily>& HfFamilies() {
  static const std::vector<HfFamily>* const kFamilies = new std::vector<HfFamily>{
      {"llama", "LlamaForCausalLM", "llama", false, false, false},
      {"mistral", "MistralForCausalLM", "mistral", false, false, true},
      {"qwen2", "Qwen2ForCausalLM", "qwen2", true, false, false},
      {"qwen3", "Qwen3ForCausalLM", "qwen3", false, true, false},
      {"gpt2", "GPT2LMHeadModel", "gpt2", true, false, false, true},
      {"mixtral", "MixtralForCausalLM", "mixtral", false, false, true, false, true},
  };
  return *kFamilies;
}

std::string HfFamilyList() {
  std::vector<std::string> ids;
  for (const HfFamily& family : HfFamilies()) ids.emplace_back(family.id);
  return absl::StrJoin(ids, ", ");
}

absl::StatusOr<const HfFamily*> FindHfFamily(absl::string_view id) {
  for (const HfFamily& family : HfFamilies()) {
    if (family.id == id) return &family;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model family \"", id, "\" for --format hf; the families are ", HfFamilyList(),
      " (--family F picks one, --family auto decides from the checkpoint; --config FILE "
      "overrides what the args say)"));
}

bool IsMoeOnlyRole(MegatronRole::Kind kind) {
  return kind == Kind::kRouter || kind == Kind::kExpertFc1 || kind == Kind::kExpertFc2;
}

bool IsGpt2OnlyRole(MegatronRole::Kind kind) {
  switch (kind) {
    case Kind::kPositionEmbedding:
    case Kind::kFinalNormBias:
    case Kind::kInputNormBias:
    case Kind::kPostAttentionNormBias:
    case Kind::kAttentionOutputBias:
    case Kind::kFc1Bias:
    case Kind::kFc2Bias:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<MegatronRole> MegatronTensorRole(absl::string_view name) {
  absl::string_view rest = name;
  absl::ConsumePrefix(&rest, "module.") || absl::ConsumePrefix(&rest, "model.");
  if (absl::EndsWith(rest, "._extra_state")) return MegatronRole{Kind::kSkipped, -1};
  for (const auto& [key, kind] : kModelTensors) {
    if (rest == key) return MegatronRole{kind, -1};
  }
  for (absl::string_view stack : kStacks) {
    absl::string_view inside = rest;
    if (!absl::ConsumePrefix(&inside, stack)) continue;
    if (inside == "final_layernorm.weight") return MegatronRole{Kind::kFinalNorm, -1};
    if (inside == "final_layernorm.bias") return MegatronRole{Kind::kFinalNormBias, -1};
    if (!absl::ConsumePrefix(&inside, "layers.")) break;
    const size_t dot = inside.find('.');
    int64_t layer = -1;
    if (dot == absl::string_view::npos || !absl::SimpleAtoi(inside.substr(0, dot), &layer) ||
        layer < 0) {
      break;
    }
    absl::string_view key = inside.substr(dot + 1);
    for (const auto& [layer_key, kind] : kLayerTensors) {
      if (key == layer_key) return MegatronRole{kind, layer};
    }
    if (key == "mlp.router.weight") return MegatronRole{Kind::kRouter, layer};
    if (absl::StartsWith(key, "mlp.shared_experts.") || absl::StartsWith(key, "mlp.router.")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\" is ",
          absl::StartsWith(key, "mlp.shared_experts.") ? "part of the shared experts"
                                                       : "a router bias",
          ", which Mixtral (the mixture-of-experts family reshard writes) has no place for: "
          "models with shared experts or router biases (Qwen-MoE, DeepSeek-MoE) are not "
          "written by --format hf"));
    }
    if (absl::ConsumePrefix(&key, "mlp.experts.local_experts.")) {
      const size_t expert_dot = key.find('.');
      int64_t expert = -1;
      if (expert_dot != absl::string_view::npos &&
          absl::SimpleAtoi(key.substr(0, expert_dot), &expert) && expert >= 0) {
        for (const auto& [expert_key, kind] : kExpertTensors) {
          if (key.substr(expert_dot + 1) == expert_key) return MegatronRole{kind, layer, expert};
        }
      }
    }
    break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor \"", name,
      "\" has no counterpart in the Hugging Face decoder families reshard writes (", HfFamilyList(),
      "): only the word and position embeddings, norm weights and biases, fused QKV, attention "
      "output and MLP (with their biases), the router and experts' MLPs, and output layer map "
      "onto their names"));
}

absl::StatusOr<const HfFamily*> ChooseHfFamily(absl::string_view requested,
                                               const FamilyEvidence& evidence) {
  if (!requested.empty() && requested != "auto") return FindHfFamily(requested);
  absl::string_view id = "llama";
  if (evidence.gpt2) {
    id = "gpt2";
  } else if (evidence.moe) {
    id = "mixtral";
  } else if (evidence.qk_norm) {
    id = "qwen3";
  } else if (evidence.qkv_bias) {
    id = "qwen2";
  } else if (evidence.sliding_window) {
    id = "mistral";
  }
  return FindHfFamily(id);
}

}  // namespace reshard
