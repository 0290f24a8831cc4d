// Writes Megatron-Core `torch_dist` distributed checkpoints (`TorchDistOutput`, id
// "megatron-torch-dist") from Megatron input or a Hugging Face model, for Megatron-Core to load
// at any TP x PP:
//
//   reshardctl consolidate IN OUT --format megatron-torch-dist             world size 1
//   reshardctl reshard IN OUT --parts N [--pipeline-parts P] [--expert-parts EP]
//       --format megatron-torch-dist                                       world size N x EP
//
//   OUT/latest_checkpointed_iteration.txt   "100" (or "release"), no newline
//   OUT/iter_0000100/__R_0.distcp           rank R's tensor chunks (DcpOutput's framing)
//   OUT/iter_0000100/common.pt              torch.save({"args": Namespace,
//                                             "checkpoint_version": 3.0, "iteration": 100})
//   OUT/iter_0000100/.metadata              the pickled DCP Metadata (DcpOutput's)
//   OUT/iter_0000100/metadata.json          {"sharded_backend": "torch_dist",
//                                             "sharded_backend_version": 1, "common_backend":
//                                             "torch", "common_backend_version": 1}
// (release/ for a release checkpoint), each written as Megatron-Core's dist_checkpointing.save
// with the torch_dist strategy writes it: metadata.json, the asdict() of its
// CheckpointingConfig, last.
//
// IN is what the megatron readers give (Megatron-LM and Megatron-DeepSpeed TP x PP, merged:
// TP shards joined, global layer numbers; Megatron-DeepSpeed pipeline names first mapped to
// Megatron-LM's), the torch_dist reader's model (layers unstacked), or a Hugging Face model
// (one safetensors or save_pretrained torch.save model and its config.json) that PresentInput
// presents as the merged Megatron-LM model with its args (PresentHfModelAsMegatron,
// lib/formats/hf/hf_import.h: TP N, PP P, a release checkpoint; messages say "Megatron-Core
// torch_dist"). Every tensor is named by
// MegatronCoreName (megatron_core_names.h): the keys and global shapes of Megatron-Core's GPTModel
// `sharded_state_dict`, flat (DCP fqn = key), a layer's tensors stacked under
// `decoder.layers.<rest>` with a leading axis over all num_layers layers (pipeline stages
// included). The spec names the layer norms: TransformerEngine's (`linear_qkv.layer_norm_weight`,
// `linear_fc1.layer_norm_weight`) unless args.transformer_impl is "local". Values are copied
// exactly: the fused QKV is Megatron-Core's (query groups in order, each [its query heads; k; v])
// as the merged legacy tensor is, and the gated fc1 is the global [gate; up] that Megatron-Core's
// apply_swiglu_sharded_factory saves, as the megatron reader merges legacy [gate_t; up_t] shards.
// Mixture-of-experts layers (experts under global ids: a legacy save's
// `mlp.experts.local_experts.<e>.linear_fc{1,2}.*` as the megatron reader merges it, an imported
// Mixtral's `dense_h_to_4h` / `dense_4h_to_h`, the torch_dist reader's unstacked experts) are
// written as SequentialMLP's sharded_state_dict saves them: `decoder.layers.mlp.router.weight`
// [L, E, h] replicated, and each expert tensor stacked over the layers and the experts under
// `decoder.layers.mlp.experts.experts.linear_fc{1,2}.*` [L, E, ...], one chunk per expert (and
// TP block, a gated fc1 [gate; up] per expert), the expert axis (axis 1) in the chunk offsets.
// Every layer must hold every expert, and args.num_experts, when given, must be E.
// The word embeddings and output layer have args.padded_vocab_size rows when the input has
// fewer (an imported HF model's vocab_size rows; zero rows appended, as Megatron-Core pads the
// vocabulary to make_vocab_size_divisible_by x TP); Megatron input keeps its own rows, already
// padded for the TP it was trained at (Megatron-Core loads them with allow_shape_mismatch at any
// TP). TransformerEngine's `_extra_state` is not written.
//
// Chunks (world size N): a TP-split tensor has N chunks along its TP axis, rank R's in
// `__R_0.distcp`, a gated fc1 two per rank (its gate rows and its up rows, Megatron-Core's
// swiglu sharding); a replicated tensor one chunk, stored by rank 0. Each chunk spans all
// layers of a stacked tensor (Megatron-Core saves one chunk per layer; DCP loads any tiling).
// The experts are saved as Megatron-Core's distributed save at EP (--expert-parts, default 1)
// places them: rank t + N x e (Megatron's tp-ep rank order) stores TP rank t's chunks of EP
// rank e's experts, g in [e x E / EP, (e + 1) x E / EP); the tensors outside the experts are
// stored by EP rank 0's ranks 0 .. N - 1, as DP replicas are saved once. The chunks and the
// tensors are the same at any EP (Megatron-Core loads them at any EP); only the files holding
// the expert chunks and the args differ. EP must divide E; --expert-parts on a model without
// experts is refused. The common state carries the input's args
// (tensor_model_parallel_size N, with experts num_experts E (added when missing),
// expert_model_parallel_size EP and expert_tensor_parallel_size N where the args have them,
// pipeline_model_parallel_size P (1 without --pipeline-parts), no virtual or uneven stages,
// ckpt_format "torch_dist", each where the args have it: what Megatron saves for a run of
// TP N x PP P, which --use-checkpoint-args --use-mp-args-from-checkpoint-args starts at; the
// checkpoint loads at any TP x PP), checkpoint_version (3.0 when the input has none) and
// iteration. The data files are N x EP whatever P (each chunk spans all layers).
//
// Megatron-LM loads it with --ckpt-format torch_dist (or --auto-detect-ckpt-format).
// Not written: the optimizer state and RNG state (resume with --no-load-optim --no-load-rng),
// nor `_extra_state` (with TransformerEngine layers, load with a --dist-ckpt-strictness that
// tolerates keys missing from the checkpoint, such as log_unexpected).
//
// Refused before anything is written, naming what: input that is neither Megatron nor a Hugging
// Face model (a safetensors model without config.json: the missing file); --dtype other
// than keep (the args name the dtype); a tensor with no Megatron-Core name; layers missing from
// a stacked key or disagreeing in shape or dtype; N that does not divide a split axis, the
// query groups (attention heads) or the gated halves; P that does not divide the layers; an
// input without iteration.
//
// Not checked against a real Megatron-Core (none is installed here): that its loader accepts
// chunks spanning several layers and the missing `_extra_state` under the strictness above, and
// that `common.pt` without `num_floating_point_operations_so_far` and `rng_state` loads with
// --no-load-rng. The keys, shapes, metadata.json and the DCP framing follow Megatron-Core's
// source (megatron/core/dist_checkpointing and models/gpt).

#ifndef RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_OUTPUT_H_
#define RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_OUTPUT_H_

#include <string>
#include <utility>
#include <vector>

#include "lib/formats/dcp/dcp_output.h"
#include "lib/formats/format.h"
#include "lib/formats/torch/torch_output.h"

namespace reshard {

class TorchDistOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "megatron-torch-dist";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override { return dcp_.naming(); }
  absl::StatusOr<ArrangedOutput> Arrange(TargetLayout engine_layout,
                                         const ArrangeRequest& request) const override;
  // A Hugging Face model (one safetensors model with its config.json) is presented as the
  // merged Megatron-LM model of the same weights, its args recording TP `parts` and PP
  // `pipeline_parts` (PresentHfModelAsMegatron, lib/formats/hf/hf_import.h, as
  // kImportAsTorchDist); other input is left as it is.
  absl::StatusOr<bool> PresentInput(const std::string& input, int parts, int pipeline_parts,
                                    const HfExportOptions& hf, InputModel& model,
                                    Catalog& catalog) const override;
  // common.pt by the torch writer, the `.distcp` files by DcpOutput.
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override;
  // `.metadata`, metadata.json, latest_checkpointed_iteration.txt.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;

 private:
  DcpOutput dcp_;
  TorchOutput torch_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_TORCH_DIST_OUTPUT_H_
