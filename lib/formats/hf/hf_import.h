// A Hugging Face model (the tensors of a `save_pretrained` folder and its config.json) presented
// as the merged Megatron-LM model the megatron reader would have made of a Megatron-LM run of
// the same weights, for the outputs that write Megatron checkpoints from it:
//
//   reshardctl reshard HF_DIR OUT --format megatron --parts TP [--pipeline-parts PP]
//   reshardctl reshard HF_DIR OUT --format megatron-torch-dist --parts TP [--pipeline-parts PP]
//
// ImportHfAsMegatron is the one entry point (PresentHfModelAsMegatron, the outputs' hook, calls it
// with the config.json beside the weights, or the one `--config FILE` names, and the family
// `--family F` names; hf_import_config.h reads the folder: config.json, family, sizes, a tied
// model's saved head). The weights are safetensors (model.safetensors, or shards and their
// index) or torch.save zips (pytorch_model.bin, or pytorch_model-*-of-*.bin and
// pytorch_model.bin.index.json, as save_pretrained(safe_serialization=False) writes), read in
// place by their readers. It renames every HF tensor to Megatron-LM's legacy name
// (language_model.embedding.*, language_model.encoder.layers.<i>.*,
// language_model.encoder.final_layernorm.*, language_model.output_layer.weight) and builds the
// fused tensors from pieces of the HF tensors, without reading any data: each Megatron tensor's
// source pieces are byte ranges (or strided views) of the HF files, so the plan gathers them within
// the copy window like any other box and the bytes are copied exactly.
//
//   HF (llama, mistral, qwen2, qwen3)       Megatron-LM (layer i under language_model.encoder.)
//   model.embed_tokens.weight               language_model.embedding.word_embeddings.weight
//   model.layers.i.input_layernorm.weight   layers.i.input_layernorm.weight
//   self_attn.{q,k,v}_proj.weight (.bias)   layers.i.self_attention.query_key_value.weight (.bias)
//   self_attn.o_proj.weight                 layers.i.self_attention.dense.weight
//   self_attn.{q,k}_norm.weight             layers.i.self_attention.{q,k}_layernorm.weight
//   post_attention_layernorm.weight         layers.i.post_attention_layernorm.weight
//   mlp.{gate,up}_proj.weight               layers.i.mlp.dense_h_to_4h.weight
//   mlp.down_proj.weight                    layers.i.mlp.dense_4h_to_h.weight
//   model.norm.weight                       final_layernorm.weight
//   lm_head.weight (untied)                 language_model.output_layer.weight
//
//   A Mixtral model is written under Megatron-Core's names instead (MegatronNames below):
//   Megatron-LM builds mixture-of-experts GPTs only as Megatron-Core models (its legacy
//   SwitchMLP routes each token to one expert through a biased router, which Mixtral's top-k
//   softmax router is not). Layer i under decoder.layers.i., local layer spec:
//   HF (mixtral)                            Megatron-Core (X = mlp.experts.local_experts)
//   model.embed_tokens.weight               embedding.word_embeddings.weight
//   input_layernorm.weight                  input_layernorm.weight
//   self_attn.{q,k,v}_proj.weight           self_attention.linear_qkv.weight
//   self_attn.o_proj.weight                 self_attention.linear_proj.weight
//   post_attention_layernorm.weight         pre_mlp_layernorm.weight
//   block_sparse_moe.gate.weight            mlp.router.weight
//   block_sparse_moe.experts.e.{w1,w3}.weight   X.e.linear_fc1.weight
//   block_sparse_moe.experts.e.w2.weight    X.e.linear_fc2.weight
//   model.norm.weight                       decoder.final_layernorm.weight
//   lm_head.weight                          output_layer.weight
//   (SequentialMLP's names; every expert under its global id e, which the megatron output
//   places on EP rank e / E_local as local expert e % E_local.)
//
//   HF (gpt2, Conv1D weights [in, out])     Megatron-LM
//   transformer.wte.weight, wpe.weight      word_embeddings.weight, position_embeddings.weight
//   transformer.h.i.ln_1.{weight,bias}      layers.i.input_layernorm.{weight,bias}
//   attn.c_attn.{weight,bias}               self_attention.query_key_value.{weight,bias}
//   attn.c_proj.{weight,bias}               self_attention.dense.{weight,bias}
//   ln_2.{weight,bias}                      post_attention_layernorm.{weight,bias}
//   mlp.c_fc.{weight,bias}                  mlp.dense_h_to_4h.{weight,bias}
//   mlp.c_proj.{weight,bias}                mlp.dense_4h_to_h.{weight,bias}
//   transformer.ln_f.{weight,bias}          final_layernorm.{weight,bias}
//   (Conv1D weights transposed to Megatron's [out, in]; attn.bias / attn.masked_bias, the causal
//   mask buffers older transformers saved, are not parameters and are left out.)
//
// The fused tensors, as Megatron-LM (checkpoint_version 3) lays them out:
//   - query_key_value [ng * (r + 2) * d, h] (ng query groups = num_key_value_heads, r = heads /
//     ng, d = head_dim): per group g the rows of its r query heads, then k head g, then v head g,
//     i.e. viewed [ng, r + 2, d, h]; its bias [ng * (r + 2) * d] likewise. GPT-2 is multi-head:
//     ng = nh, r = 1, its c_attn columns [Q | K | V] regrouped per head;
//   - dense_h_to_4h (SwiGLU) [2 * ffn, h] = [gate; up], the global order the megatron reader
//     merges and the megatron output regroups as [gate_t; up_t] per TP rank; each Mixtral
//     expert's [w1; w3] likewise.
// The word embeddings and an untied output layer keep the HF model's vocab_size rows; the args
// say vocab_size and make_vocab_size_divisible_by (128), and the megatron output appends the
// zero rows of Megatron's padding for the TP it writes (padded_vocab_size). The partition rules
// returned keep those two tensors whole in the engine's split (the output cuts them, padded),
// so the vocabulary need not divide by TP.
//
// The args (MegatronImport::training_state "megatron.args", an argparse.Namespace) are what a
// Megatron-LM run of the model would have been started with, from config.json: num_layers,
// hidden_size, ffn_hidden_size, num_attention_heads, group_query_attention, num_query_groups,
// kv_channels, max_position_embeddings, seq_length, norm_epsilon, rotary_base (rope models),
// use_rope_scaling / rope_scaling_factor (Llama 3.1's rope_scaling), swiglu,
// untie_embeddings_and_output_weights, add_qkv_bias, add_bias_linear, qk_layernorm,
// normalization (RMSNorm; GPT-2 LayerNorm), position_embedding_type (rope; GPT-2
// learned_absolute), openai_gelu / bias_gelu_fusion (GPT-2's activation_function gelu_new /
// gelu_fast), sliding_window (Mistral, Mixtral), num_experts, moe_router_topk,
// moe_ffn_hidden_size, moe_aux_loss_coeff (router_aux_loss_coef when given),
// moe_router_load_balancing_type ("aux_loss"), moe_router_pre_softmax (False: softmax over the
// top-k logits, which equals Mixtral's renormalised top-k of the softmax), moe_grouped_gemm
// (False: SequentialMLP), expert_model_parallel_size (1; the megatron output sets the EP it
// writes), expert_tensor_parallel_size (TP), and for Megatron-Core names use_legacy_models
// (False), transformer_impl ("local", or "transformer_engine") and ckpt_format ("torch")
// (Mixtral), vocab_size, make_vocab_size_divisible_by,
// padded_vocab_size, params_dtype / fp16 / bf16 (the weights' dtype), tensor_ and
// pipeline_model_parallel_size, data_parallel_size, world_size, rank and
// virtual_pipeline_model_parallel_size (None). The checkpoint is a "release" one (iteration 0,
// checkpoint_version 3.0), as Megatron-LM loads converted pretrained weights.
//
// A tied model (tie_word_embeddings) has no output layer: the saved lm_head.weight, if any, must
// equal the word embeddings element by element (transformers loads the embedding as the head),
// and is then left out.
//
// Refused, naming what (InvalidArgument): a Mixtral model asked for under Megatron-LM's legacy
// names (MegatronNames::kMegatronLm); config.json whose model_type / architectures is none
// of the families, or a --family that is none (listing them); heads not divisible by
// num_key_value_heads, or heads or groups not divisible by `tensor_parallel`; a tensor the
// family has no Megatron counterpart for; a tensor missing or shaped otherwise than config.json
// says (both shapes named); tensors of different dtypes; rope_scaling other than Llama 3.1's.

#ifndef RESHARD_LIB_FORMATS_HF_HF_IMPORT_H_
#define RESHARD_LIB_FORMATS_HF_HF_IMPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/format.h"
#include "lib/formats/hf/hf_family.h"
#include "lib/formats/hf/hf_import_config.h"
#include "lib/plan/partition_rules.h"
#include "nlohmann/json.hpp"

namespace reshard {

// The training-state value (a string: "llama", ...) that says a model was imported from a
// Hugging Face model of that family.
inline constexpr char kHfImportFamilyKey[] = "hf_import.family";

// The names the imported tensors take.
enum class MegatronNames {
  // Megatron-LM's legacy GPTModel: language_model.encoder.layers.<i>.* (the table above).
  kMegatronLm,
  // Megatron-Core's GPTModel, as its flat state dict names them: embedding.*, decoder.layers.
  // <i>.*, decoder.final_layernorm.*, output_layer.*; the layer norms as the local layer spec
  // (input_layernorm, pre_mlp_layernorm) or the TransformerEngine spec (fused into linear_qkv
  // and linear_fc1 as layer_norm_weight; a mixture-of-experts layer keeps pre_mlp_layernorm)
  // names them (megatron_core_names.h).
  kMegatronCoreLocal,
  kMegatronCoreTransformerEngine,
};

// The names the Megatron outputs give a model of `family` unless told otherwise: Megatron-LM's
// for the dense families, Megatron-Core's (local spec) for mixture-of-experts ones.
MegatronNames DefaultMegatronNames(const HfFamily& family);

// The HF model as Megatron-LM's merged model.
struct MegatronImport {
  const HfFamily* family = nullptr;
  // The Megatron tensors (named as MegatronNames says), in Megatron's order; the pieces index
  // the input catalog's files, which `catalog.files` repeats.
  Catalog catalog;
  // "megatron.args", "megatron.iteration" (0), "megatron.checkpoint_version" (3.0) and
  // "megatron.release" (true), as the megatron reader sets them (megatron_format.h); and
  // kHfImportFamilyKey.
  TrainingState training_state;
  // How the engine splits the model over TP: Megatron's rules (MegatronPartitionRules, SwiGLU
  // fc1 as 2 fused blocks, QKV in whole groups) with the vocabulary tensors replicated.
  std::vector<PartitionRule> rules;
  // A tied model (tie_word_embeddings) whose weights also hold lm_head.weight: the indices of
  // that head and of the word embeddings in the input catalog, which must be equal element by
  // element for the head to be left out (PresentHfModelAsMegatron compares them); -1 otherwise.
  int tied_head = -1;
  int tied_embedding = -1;
};

// `catalog`: the HF model's tensors (one merged model); `config`: its config.json, read from
// `config_path` (named in messages); `tensor_parallel`, `pipeline_parallel`: the sizes the args
// record (the megatron output updates them per file); `family`: the family the tensors are
// read as, nullptr for the one config.json names (model_type, else architectures); `as_what`
// (kImportAsMegatronLm, kImportAsTorchDist): what messages say the model is imported as
// (kExportAsHf: the names and shapes of a training save checked for --format hf, hf_named.h);
// `names`: the names the tensors take, nullopt for DefaultMegatronNames(family). Reads no
// tensor data.
absl::StatusOr<MegatronImport> ImportHfAsMegatron(
    const Catalog& catalog, const nlohmann::ordered_json& config, const std::string& config_path,
    int tensor_parallel, int pipeline_parallel, const HfFamily* family = nullptr,
    absl::string_view as_what = kImportAsMegatronLm,
    std::optional<MegatronNames> names = std::nullopt);

// OutputFormat::PresentInput of the outputs that write Megatron checkpoints (megatron,
// megatron-torch-dist): when `model` is a Hugging Face model (IsHfImportInput), reads the
// config.json beside `input` (or `hf.config_file`), takes the family `hf.family` names
// (empty or "auto": config.json's) and replaces `catalog` with ImportHfAsMegatron's Megatron-LM
// model, `model.training_state` with its args (recording `tensor_parallel` x
// `pipeline_parallel`), `model.default_rules` with its rules, and adds to `model.description`
// which family was imported as `as_what` (kImportAsMegatronLm, kImportAsTorchDist); returns
// true. A tied model's saved lm_head.weight is compared with the word embeddings element by
// element, read window by window (FirstDifferingElement, lib/exec/tensor_compare.h): a
// difference is InvalidArgument naming both tensors, the head's file and the first element
// that differs. Returns false, changing nothing, for any other input. The other errors are
// ReadHfInputConfig's and ImportHfAsMegatron's, and InvalidArgument listing the families for
// an `hf.family` that is none of them. `names` as for ImportHfAsMegatron.
absl::StatusOr<bool> PresentHfModelAsMegatron(const std::string& input, int tensor_parallel,
                                              int pipeline_parallel, absl::string_view as_what,
                                              const HfExportOptions& hf, InputModel& model,
                                              Catalog& catalog,
                                              std::optional<MegatronNames> names = std::nullopt);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_HF_IMPORT_H_
