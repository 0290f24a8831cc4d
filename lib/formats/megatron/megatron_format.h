// Megatron-LM and Megatron-DeepSpeed checkpoints split by tensor parallelism (TP) and pipeline
// parallelism (PP), read as one model-parallel part per TP rank (`MegatronInput`, id
// "megatron"). The pipeline stages of a TP rank are merged here; the engine then merges or
// splits the TP parts with the partition rules this reader supplies (InputModel::default_rules).
//
// Layouts read:
//
//   Megatron-LM (and Megatron-DeepSpeed without --deepspeed):
//     <save>/latest_checkpointed_iteration.txt     "100" -> iter_0000100, or "release"
//     <save>/iter_0000100/mp_rank_XX/model_optim_rng.pt        PP = 1, XX = TP rank
//     <save>/iter_0000100/mp_rank_XX_YYY/model_optim_rng.pt    PP > 1, YYY = PP rank
//   The input is the iteration folder, or the save folder (the tracker file picks the
//   iteration; ReadOptions::tag names another folder, "iter_0000050", or just "50"). Tensors
//   come from the file's `model` entry without the `model.` prefix
//   (`language_model.encoder.layers.0.mlp.dense_h_to_4h.weight`; older files say
//   `language_model.transformer.*`). Virtual pipeline stages (`model0`, `model1`, ...) are
//   read as the interleaved stages Megatron makes of them: chunk v of PP rank p holds the
//   (v * PP + p)-th slice of the layers.
//
//   Megatron-DeepSpeed with the DeepSpeed pipeline engine:
//     <save>/latest                                "global_step100"
//     <save>/global_step100/layer_XX-model_YY-model_states.pt  one layer's state dict;
//                                                  XX = global layer-spec index, YY = TP rank
//     <save>/global_step100/mp_rank_ZZ_model_states.pt         `module` None; args, iteration
//   The input is the global_step folder, or the save folder (`latest` picks it; the tag
//   "global_step50", or just "50", another).
//   Tensors are named `<XX>.<key>` with XX without leading zeros, as DeepSpeed's
//   ds_to_universal names them: `1.word_embeddings.weight`, `3.self_attention.dense.weight`,
//   `8.weight` (the final norm). ZeRO optimizer files beside them are not read, except with
//   ReadOptions::include_optimizer when the model states record partitioned fp32 weights
//   (param_shapes): then the fp32 master weights and Adam moments of every (pp, tp, dp) rank are
//   read instead, under the module's names (deepspeed_pipe_zero_reader.h, docs/formats.md).
//
// Pipeline merge (Megatron-LM): `layers.N.` indices in a file are local to its stage and are
// renumbered to global ones (offset = layers in earlier stages). Embeddings come from the first
// stage, the final norm and an untied `output_layer` from the last. The last stage's
// `word_embeddings_for_head.weight` (its copy of the tied word embeddings, kept in sync by an
// all-reduce) is not a tensor of the model: it is left out and listed in other_entries.
// Likewise DeepSpeed's second instance of the tied embedding layer (`TiedLayerSpec('embed')`,
// the last layer file, e.g. `9.word_embeddings.weight`) is left out and listed: only the first
// (`1.*`) is kept, so a consolidated model holds the embedding once (with PP > 1 the second
// instance's position_embeddings is not even trained). Copies are left out by name and shape
// only: reading is metadata-only, so their values are not compared. The other entries of the
// files (args, iteration, optimizer, rng_state, ...) are listed in other_entries; merged parts
// keep no nesting, but the values a Megatron output needs are carried in
// InputModel::training_state.values:
//   "megatron.args"                the args Namespace (a StructureNode kObject; the first file's
//                                  for Megatron-LM, mp_rank_00_model_states.pt's for DeepSpeed)
//   "megatron.iteration"           kInt, when the files record it
//   "megatron.checkpoint_version"  kFloat, when the files record it
//   "megatron.release"             kBool: the Megatron-LM folder is `release` (Megatron-LM only)
//   "megatron.grouped_experts"     kBool, mixture-of-experts only: the experts are named as
//                                  TEGroupedMLP names them (`linear_fc1.weight<l>`), not
//                                  SequentialMLP's `local_experts.<l>.*`
// (megatron_output.h writes them back).
//
// Checks, each failing with a message naming the file or folder:
//   - topology from `args` (tensor_model_parallel_size, pipeline_model_parallel_size,
//     expert_model_parallel_size), or from
//     the folder names when the files hold no args; every (TP, PP) folder and every
//     (layer, TP) file must be present: "Megatron TP2 x PP2: mp_rank_01_001/model_optim_rng.pt
//     is missing"; unexpected ones are refused too;
//   - model-defining args, `iteration` and `checkpoint_version` agree across files;
//   - the tensor names of a stage (a layer file) agree across TP ranks;
//   - each stage holds layers 0..n-1, n = num_layers / (PP x virtual stages) when the args set
//     no uneven split, and the stages together hold num_layers;
//   - word_embeddings rows x TP = args.padded_vocab_size;
//   - checkpoint_version >= 2 (older query_key_value orderings are not the per-head layout the
//     partition rules assume): Unimplemented otherwise.
//
// Mixture-of-experts with expert parallelism (Megatron-Core GPT in these folders): EP > 1 adds
// `_EEE` to the folder names (mp_rank_TT_PPP_EEE; with PP = 1 mp_rank_TT_EEE, told apart from a
// PP folder by args.pipeline_model_parallel_size and expert_model_parallel_size). The EP ranks
// of a TP rank are merged into its part: local expert l of EP rank e (SequentialMLP
// `mlp.experts.local_experts.<l>.*` or TEGroupedMLP `mlp.experts.linear_fc1.weight<l>`) becomes
// `mlp.experts.local_experts.<e * E_local + l>.*`; every expert of every MoE layer exactly once
// (a missing one is DataLoss, one held twice InvalidArgument, both naming the expert and the
// folders); the other tensors come from EP rank 0 and their EP copies are their replicas
// (CatalogTensor::replicas), which `verify` compares (MergeParts carries every TP rank's
// replicas: a TP rank's EP copy of a split tensor is compared with its EP rank 0 piece, an EP
// copy of a replicated tensor with TP rank 0's).
//
// Partition rules (default_rules): the `megatron` preset (MegatronPresetRules): column-parallel
// (dim 0) word_embeddings, query_key_value (since checkpoint version 2 every rank holds whole
// heads [np, 3, hn], so a plain split is Megatron's own), dense_h_to_4h, output_layer / lm_head;
// row-parallel (dim 1) attention.dense.weight, dense_4h_to_h.weight; replicated norms,
// row-parallel biases, position_embeddings and the pipe final norm (`8.weight`). With SwiGLU
// (args.swiglu, or without that arg a dense_h_to_4h twice as tall as dense_4h_to_h is wide)
// dense_h_to_4h is `fused: 2`: every rank holds [gate_i; up_i], and each half is split on its
// own. There is no catch-all: a tensor outside these names fails with the engine's "matches no
// partition rule" message.
//
// Vocabulary padding: word_embeddings (and an untied output_layer) keep the padded_vocab_size
// rows Megatron made (a multiple of make_vocab_size_divisible_by x TP); reshard neither strips
// nor re-pads them, except for `--format megatron` output (megatron_output.h), which pads them
// again for its TP. Splitting into a TP degree that does not divide the padded vocabulary fails
// ("... dimension 0 (size 52) is not divisible into 8 parts"). The split checks row counts only:
// the new TP degree must also divide the number of attention heads (query groups with GQA), as
// Megatron itself requires.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FORMAT_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"
#include "lib/formats/megatron/megatron_layout.h"

namespace reshard {

class MegatronInput : public InputFormat {
 public:
  static constexpr const char* kId = kMegatronFormatId;
  absl::string_view id() const override { return kId; }
  // A folder holding mp_rank_XX[_YYY] folders or DeepSpeed pipeline layer files, or a save
  // folder whose tracker (latest_checkpointed_iteration.txt, latest) names such a folder.
  // Without DeepSpeed's `latest`, also a save folder with iter_* / release / global_step*
  // checkpoint folders but no tracker, or whose tracker names a missing folder, so that Read
  // can say what is wrong. A `latest` naming a folder without layer files (DeepSpeed ZeRO)
  // and a tracker naming a folder without rank folders (torch_dist) are left to other readers.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Above DeepSpeed ZeRO, which leaves folders with pipeline layer files to this reader.
  int probe_priority() const override { return 40; }
  // Folders listed and rank files opened through lib/io/file_access.h and TorchArchive::Open;
  // TP shards are boxes read row by row (contiguous in their last dimension).
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_FORMAT_H_
