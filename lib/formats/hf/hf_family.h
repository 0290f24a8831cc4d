// The Hugging Face model families reshard writes (`--format hf`), and how the tensors of a
// Megatron checkpoint map onto each family's parameter names.
//
// Names read, after a NeMo prefix (`model.` NeMo 1, `module.` NeMo 2) is stripped:
//   Megatron-LM (legacy, merged TP x PP with global layer numbers):
//     language_model.embedding.word_embeddings.weight, language_model.output_layer.weight,
//     language_model.{encoder,transformer}.final_layernorm.weight,
//     language_model.{encoder,transformer}.layers.<i>.<rest>, <rest> one of
//     input_layernorm.weight, self_attention.query_key_value.{weight,bias},
//     self_attention.dense.weight, post_attention_layernorm.weight, mlp.dense_h_to_4h.weight,
//     mlp.dense_4h_to_h.weight
//   (Megatron-DeepSpeed pipeline names, `<layer spec index>.<key>`, are read under these
//   names: PipeNamesToMegatronLM, lib/formats/megatron/megatron_layout.h)
//   and GPT-2's LayerNorm biases, linear biases and learned positions:
//     language_model.embedding.position_embeddings.weight,
//     language_model.{encoder,transformer}.final_layernorm.bias, and in a layer
//     input_layernorm.bias, post_attention_layernorm.bias, self_attention.dense.bias,
//     mlp.dense_h_to_4h.bias, mlp.dense_4h_to_h.bias
//   Megatron-Core (torch_dist unstacked, TE or local spec):
//     embedding.word_embeddings.weight, output_layer.weight, decoder.final_layernorm.weight,
//     decoder.layers.<i>.<rest>, <rest> one of self_attention.linear_qkv.layer_norm_weight,
//     input_layernorm.weight, self_attention.linear_qkv.{weight,bias},
//     self_attention.linear_proj.weight, self_attention.{q,k}_layernorm.weight,
//     mlp.linear_fc1.layer_norm_weight, pre_mlp_layernorm.weight, mlp.linear_fc1.weight,
//     mlp.linear_fc2.weight, and GPT-2's embedding.position_embeddings.weight,
//     decoder.final_layernorm.bias, self_attention.linear_qkv.layer_norm_bias,
//     input_layernorm.bias, self_attention.linear_proj.bias, mlp.linear_fc1.layer_norm_bias,
//     pre_mlp_layernorm.bias, mlp.linear_fc1.bias, mlp.linear_fc2.bias
//   Mixture-of-experts layers (Mixtral), in either stack: mlp.router.weight and expert g's
//     mlp.experts.local_experts.<g>.{linear_fc1,linear_fc2}.weight (Megatron-Core's SequentialMLP
//     names; the megatron reader gives TEGroupedMLP's linear_fc1.weight<l> these names with global
//     ids) or mlp.experts.local_experts.<g>.{dense_h_to_4h,dense_4h_to_h}.weight (the legacy
//     MLP's keys under SequentialMLP's path, read under language_model.encoder). Shared experts
//     (mlp.shared_experts.*) and router biases have no Mixtral counterpart.
// and TransformerEngine's `*._extra_state` (FP8 metadata), which has no HF counterpart.

#ifndef RESHARD_LIB_FORMATS_HF_HF_FAMILY_H_
#define RESHARD_LIB_FORMATS_HF_HF_FAMILY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

// What one family's HF model has and is called.
struct HfFamily {
  absl::string_view id;            // --family: "llama"
  absl::string_view architecture;  // config.json "architectures": "LlamaForCausalLM"
  absl::string_view model_type;    // config.json "model_type": "llama"
  bool qkv_bias = false;           // q/k/v projections have biases (Qwen2)
  bool qk_norm = false;            // per-head RMSNorm of queries and keys (Qwen3)
  bool sliding_window = false;     // config.json carries "sliding_window" (Mistral)
  // GPT-2: LayerNorm with biases, learned position embeddings, biased linear layers, an MLP
  // without gate, and Conv1D weights stored [in, out] (the transpose of Megatron's).
  bool gpt2 = false;
  // Mixtral: every layer's MLP is a router (block_sparse_moe.gate) over num_local_experts
  // SwiGLU experts (block_sparse_moe.experts.<e>.w1 gate, w3 up, w2 down).
  bool moe = false;
};

// The families, in the order messages list them.
const std::vector<HfFamily>& HfFamilies();

// The family `id`; InvalidArgument listing the families and the flags that override the
// checkpoint (--family, --config) otherwise.
absl::StatusOr<const HfFamily*> FindHfFamily(absl::string_view id);

// "llama, mistral, qwen2, qwen3, gpt2, mixtral".
std::string HfFamilyList();

// What a Megatron tensor is in the model, and its layer (-1 outside the layers).
struct MegatronRole {
  enum class Kind {
    kEmbedding,
    kOutputLayer,
    kFinalNorm,
    kInputNorm,
    kPostAttentionNorm,
    kQkvWeight,
    kQkvBias,
    kAttentionOutput,
    kQNorm,
    kKNorm,
    kFc1Weight,
    kFc2Weight,
    // GPT-2's (HfFamily::gpt2) tensors beyond the Llama-style ones.
    kPositionEmbedding,
    kFinalNormBias,
    kInputNormBias,
    kPostAttentionNormBias,
    kAttentionOutputBias,
    kFc1Bias,
    kFc2Bias,
    // Mixture-of-experts layers (HfFamily::moe): the router, and expert `expert`'s fc1 / fc2.
    kRouter,
    kExpertFc1,
    kExpertFc2,
    kSkipped,  // TransformerEngine's _extra_state
  };
  Kind kind = Kind::kSkipped;
  int64_t layer = -1;
  int64_t expert = -1;  // kExpertFc1, kExpertFc2: the global expert id
};

// Whether tensors of `kind` exist only in mixture-of-experts models.
bool IsMoeOnlyRole(MegatronRole::Kind kind);

// Whether tensors of `kind` exist only in GPT-2 models (LayerNorm and linear biases, learned
// position embeddings).
bool IsGpt2OnlyRole(MegatronRole::Kind kind);

// The role of the tensor `name`; InvalidArgument naming it when it has none in the families'
// decoders (saying so for shared experts and router biases, which Mixtral lacks).
absl::StatusOr<MegatronRole> MegatronTensorRole(absl::string_view name);

// What the checkpoint says that decides its family.
struct FamilyEvidence {
  bool qk_norm = false;         // q/k layernorm tensors, or args.qk_layernorm
  bool qkv_bias = false;        // a QKV bias tensor, or args.add_qkv_bias
  bool sliding_window = false;  // args.window_size / args.sliding_window set
  // LayerNorm biases or learned position embeddings (tensors or args.normalization
  // "LayerNorm" with args.position_embedding_type "learned_absolute"): a GPT-2 model.
  bool gpt2 = false;
  // Experts: expert tensors or a router, or args.num_experts > 1 (a mixture-of-experts model).
  bool moe = false;
};

// `requested` ("" or "auto": decided from `evidence` as docs/formats.md says: LayerNorm
// biases or learned position embeddings -> gpt2, else experts -> mixtral, else q/k norms ->
// qwen3, else a QKV bias -> qwen2, else a sliding window -> mistral, else llama); otherwise
// FindHfFamily(requested).
absl::StatusOr<const HfFamily*> ChooseHfFamily(absl::string_view requested,
                                               const FamilyEvidence& evidence);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_HF_FAMILY_H_
