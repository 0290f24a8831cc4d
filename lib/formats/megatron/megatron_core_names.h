// The Megatron-Core name (`sharded_state_dict` key) of each tensor of a merged Megatron model,
// for writers of Megatron-Core checkpoints (torch_dist_output.h).
//
// Names read (global layer numbers, tensor-parallel shards joined):
//   Megatron-LM (the megatron reader's merged model; Megatron-DeepSpeed pipeline names first
//   go through PipeNamesToMegatronLM):
//     language_model.embedding.{word,position}_embeddings.weight, language_model.output_layer.weight,
//     language_model.{encoder,transformer}.final_layernorm.{weight,bias},
//     language_model.{encoder,transformer}.layers.<i>.<rest>
//   Megatron-Core (the torch_dist reader's model, layers unstacked): embedding.*,
//     output_layer.*, decoder.final_layernorm.*, decoder.layers.<i>.<rest>; kept as they are,
//     a name this table does not know included.
//
// A layer's tensors are layer-stacked, as Megatron-Core's TransformerBlock saves homogeneous
// layers: `decoder.layers.<rest>` with a leading axis over all layers. Legacy <rest> ->
// Megatron-Core <rest> (TransformerEngine spec | local spec), and the axis of the layer's tensor
// that tensor parallelism splits (-: replicated):
//   input_layernorm.{weight,bias}         self_attention.linear_qkv.layer_norm_{weight,bias}
//                                         | input_layernorm.{weight,bias}               -
//   self_attention.query_key_value.*      self_attention.linear_qkv.*                   0
//   self_attention.dense.weight           self_attention.linear_proj.weight             1
//   self_attention.dense.bias             self_attention.linear_proj.bias               -
//   self_attention.{q,k}_layernorm.weight self_attention.{q,k}_layernorm.weight         -
//   post_attention_layernorm.{weight,bias} mlp.linear_fc1.layer_norm_{weight,bias}
//                                         | pre_mlp_layernorm.{weight,bias}             -
//   mlp.dense_h_to_4h.*                   mlp.linear_fc1.*                              0
//   mlp.dense_4h_to_h.weight              mlp.linear_fc2.weight                         1
//   mlp.dense_4h_to_h.bias                mlp.linear_fc2.bias                           -
// and outside the layers: word_embeddings and output_layer split on axis 0, position
// embeddings and the final norm replicated. TransformerEngine's `*._extra_state` (FP8
// metadata) is skipped.
//
// Mixture-of-experts layers (a legacy import's `mlp.router.weight` and
// `mlp.experts.local_experts.<e>.dense_{h_to_4h,4h_to_h}.*` or SwitchMLP's
// `mlp.local_experts.<e>.*`, Megatron-Core's `mlp.experts.local_experts.<e>.linear_fc{1,2}.*`,
// with global expert ids): the router is
// `decoder.layers.mlp.router.weight` (replicated), and expert e's tensors are stacked over the
// layers and the experts as SequentialMLP's `sharded_state_dict` saves them:
//   mlp.experts.local_experts.<e>.linear_fc1.*  decoder.layers.mlp.experts.experts.linear_fc1.*
//                                               [L, E, ...]                                    0
//   mlp.experts.local_experts.<e>.linear_fc2.weight   ...experts.experts.linear_fc2.weight     1
//   mlp.experts.local_experts.<e>.linear_fc2.bias     ...experts.experts.linear_fc2.bias       -
// (`expert` = e, the index along axis 1 of the key). The shared experts
// (`mlp.shared_experts.linear_fc{1,2}.*`) are layer-stacked and split over TP as the dense MLP
// is: linear_fc1 on axis 0, linear_fc2.weight on axis 1.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_CORE_NAMES_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_CORE_NAMES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

// Which of Megatron-Core's layer specs names the layer norms.
enum class MegatronCoreSpec {
  kTransformerEngine,  // norms fused into linear_qkv / linear_fc1 (layer_norm_weight)
  kLocal,              // input_layernorm, pre_mlp_layernorm
};

struct MegatronCoreTensor {
  // The checkpoint key: "decoder.layers.self_attention.linear_qkv.weight" (layer-stacked),
  // "embedding.word_embeddings.weight".
  std::string key;
  int64_t layer = -1;  // its index along the key's layer axis; -1 when not layer-stacked
  int64_t expert = -1;  // its index along the key's expert axis (axis 1); -1: not an expert
  int tp_axis = -1;    // the axis of the (per-layer) tensor TP splits; -1: replicated
  bool skipped = false;  // not written (TransformerEngine's _extra_state)

  // The name reshard's torch_dist reader gives the tensor back (layers and experts unstacked):
  // "decoder.layers.3.self_attention.linear_qkv.weight",
  // "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight".
  std::string UnstackedName() const;
};

// The Megatron-Core tensor of the merged Megatron tensor `name`. InvalidArgument naming it when
// it is a Megatron-LM name outside a GPT's embedding, layers, final norm and output layer.
absl::StatusOr<MegatronCoreTensor> MegatronCoreName(absl::string_view name,
                                                    MegatronCoreSpec spec);

// The inverse, for writers of Megatron-LM checkpoints from a Megatron-Core one: the Megatron-LM
// name (`language_model.encoder.layers.<i>.<legacy rest>`, ...) of the Megatron-Core tensor
// `name` as the torch_dist reader gives it (layers unstacked: `decoder.layers.<i>.<rest>`),
// named by either spec. nullopt for TransformerEngine's `_extra_state`, which Megatron-LM has
// no counterpart for. InvalidArgument naming it when it is none of the tensors above.
absl::StatusOr<std::optional<std::string>> MegatronLmName(absl::string_view name);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_CORE_NAMES_H_
