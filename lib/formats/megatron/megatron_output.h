// Writes Megatron-LM checkpoints (`MegatronOutput`, id "megatron") from Megatron input, so that
// a run can continue training at another tensor-parallel (TP) and pipeline-parallel (PP) size:
//
//   reshardctl reshard IN OUT --parts TP [--pipeline-parts PP] --format megatron
//
//   OUT/latest_checkpointed_iteration.txt               "100" (or "release"), no newline
//   OUT/iter_0000100/mp_rank_TT/model_optim_rng.pt      PP = 1
//   OUT/iter_0000100/mp_rank_TT_PPP/model_optim_rng.pt  PP > 1   (release/... for "release")
//
// Each file is what Megatron-LM's legacy GPTModel saves on that rank (torch.save, written by
// TorchOutput::Frame from the file's structure):
//   {"args": Namespace, "checkpoint_version": 3.0, "iteration": 100, "model": {
//      "language_model": {
//        "embedding": {"word_embeddings": {"weight"}, "position_embeddings": {"weight"}},
//                                                                      first stage only
//        "encoder": {"layers.K.<key>" (stage-local K), ..., "final_layernorm.*" (last stage)},
//        "output_layer": {"weight"}},                                  last stage, untied only
//      "word_embeddings_for_head": {"weight"}}}       last stage, PP > 1, tied embeddings only:
//                                                     that TP rank's slice of word_embeddings
// with the encoder named as the input names it (`encoder`, or `transformer` in older files).
// The engine's split layout (one part per TP rank, tensors sliced by Megatron's partition
// rules) is regrouped by pipeline stage: num_layers / PP consecutive layers per stage (PP is
// 1 without --pipeline-parts, whatever the input's). `consolidate --format megatron` writes
// TP 1 x PP 1.
//
// Read from InputModel::training_state (the Megatron reader's values, megatron_format.h):
// "megatron.args" (copied, with tensor_model_parallel_size, pipeline_model_parallel_size,
// padded_vocab_size, world_size = TP x PP x data_parallel_size and rank = Megatron's rank of
// the file's (TP, PP) rank at data-parallel rank 0 updated; virtual pipeline stages and the
// args of uneven stages reset to None), "megatron.iteration", "megatron.checkpoint_version"
// and "megatron.release". Without args the files hold none (Megatron then warns and uses its
// command line).
//
// The vocabulary is padded again for the new TP as Megatron pads it:
// ceil(vocab / (make_vocab_size_divisible_by x TP)) x make_vocab_size_divisible_by x TP rows,
// vocab from args.vocab_size. Fewer rows than the input's: padding rows are dropped; more: zero
// rows are appended (OutputTensor::zero_fill). When the args do not record vocab_size, the
// input's rows are kept if they are a multiple of make_vocab_size_divisible_by x TP, and the
// conversion is refused otherwise. (The engine first splits the input's rows, so the new TP
// must also divide them.)
//
// Megatron-Core GPTs saved in the same rank folders (flat state dicts named "embedding.*",
// "decoder.layers.K.*", "decoder.final_layernorm.*", "output_layer.*") are written the same way
// under those names, one flat ordered dict per file (with PP > 1 and tied embeddings the last
// stage holds its copy as output_layer.weight, as Megatron-Core's GPTModel keeps it).
//
// Mixture-of-experts models (Megatron-Core names; the reader holds every expert once under its
// global id g, "...mlp.experts.local_experts.<g>.*") are written over EP expert-parallel ranks:
//
//   reshardctl reshard IN OUT --format megatron --parts TP --expert-parts EP [--pipeline-parts PP]
//
//   OUT/iter_0000100/mp_rank_TT_EEE/model_optim_rng.pt      PP = 1, EP > 1
//   OUT/iter_0000100/mp_rank_TT_PPP_EEE/model_optim_rng.pt  PP > 1, EP > 1
//
// EP rank e holds experts g in [e x E_local, (e + 1) x E_local), E_local = num_experts / EP, as
// local expert g % E_local, named as the input names its experts: SequentialMLP
// "mlp.experts.local_experts.<l>.*" or TEGroupedMLP "mlp.experts.linear_fc1.weight<l>"
// (training_state "megatron.grouped_experts", else args.moe_grouped_gemm). Experts are split over
// TP as the dense MLP is. Every other tensor (attention, router, shared experts, norms,
// embeddings) is in every EP rank's file. The args get expert_model_parallel_size = EP and
// expert_tensor_parallel_size = TP (num_experts unchanged), the data-parallel size rounded up to
// a multiple of EP (EP ranks are data-parallel ranks), and rank = t + TP x e + TP x DP x p.
// Without --expert-parts (and when consolidating) EP is 1: every expert in every file.
// Refused (InvalidArgument): EP not dividing num_experts (naming both); --expert-parts on a
// model without experts; MoE layers holding different numbers of experts.
//
// Megatron-DeepSpeed pipeline checkpoints (layer files, tensors `<layer spec index>.<key>`)
// are written under Megatron-LM's names: the layer holding word_embeddings is the embedding,
// the layers holding input_layernorm are layers 0, 1, ... in order, a later one holding only
// weight / bias is the final norm, `lm_head.weight` the untied output layer. The result is a
// Megatron-LM (non-DeepSpeed) checkpoint, with the DeepSpeed run's args.
//
// A Megatron-Core torch_dist checkpoint (the torch_dist reader's model, layers unstacked) is
// written the same way after PresentInput has renamed its tensors to Megatron-LM's
// (MegatronLmName, megatron_core_names.h; `_extra_state` left out): the tensors hold the same
// values, and the reader's partition rules split them, so no --rules is needed. A
// mixture-of-experts one (a tensor ParseExpertTensorName matches) keeps its Megatron-Core names
// instead, experts under global ids, and is written over --expert-parts as above, with
// args.ckpt_format "torch" where the args have it: Megatron-LM has no legacy router or expert
// modules, and saves Megatron-Core MoE models under these names in the same folders.
//
// A Hugging Face model (`reshardctl reshard HF_DIR OUT --format megatron --parts TP`: a
// safetensors or save_pretrained torch.save model and its config.json, families llama, mistral,
// qwen2, qwen3, gpt2, mixtral) is written the same way after PresentInput has made it the
// merged Megatron model with its args (lib/formats/hf/hf_import.h): a "release" checkpoint,
// vocabulary padded with zero rows. The dense families take Megatron-LM's names; mixtral takes
// Megatron-Core's (local spec, SequentialMLP experts), the only model Megatron-LM builds
// mixture-of-experts layers in, and --expert-parts spreads its experts as above.
//
// Refused, with a message naming what: input that is neither Megatron (legacy or torch_dist) nor
// a Hugging Face model; a tensor of a dense torch_dist model with no Megatron-LM name;
// num_layers not divisible
// by PP; num_attention_heads or num_query_groups (num_key_value_heads) not divisible by TP;
// tensors outside a GPT's embedding, encoder and output layer; --dtype other than keep (the
// args name the dtype).
//
// Not written: the optimizer state (resume with --no-load-optim, or go through a DeepSpeed
// universal checkpoint) and rng_state (resume with --no-load-rng); nor opt_param_scheduler.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_OUTPUT_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_OUTPUT_H_

#include <string>
#include <utility>
#include <vector>

#include "lib/formats/format.h"
#include "lib/formats/torch/torch_output.h"

namespace reshard {

class MegatronOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "megatron";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override;
  absl::StatusOr<ArrangedOutput> Arrange(TargetLayout engine_layout,
                                         const ArrangeRequest& request) const override;
  // A dense Megatron-Core torch_dist model is renamed to Megatron-LM's names (MegatronLmName),
  // a mixture-of-experts one keeps its Megatron-Core names (args.ckpt_format "torch"); a
  // Hugging Face model (one safetensors model with its config.json) is presented as the
  // merged Megatron model of the same weights, with the args of such a run
  // (ImportHfAsMegatron, lib/formats/hf/hf_import.h); other input is left as it is.
  absl::StatusOr<bool> PresentInput(const std::string& input, int parts, int pipeline_parts,
                                    const HfExportOptions& hf, InputModel& model,
                                    Catalog& catalog) const override;
  // torch.save files, framed by the torch writer from each file's structure.
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override;
  // latest_checkpointed_iteration.txt, naming the iteration folder the files are in.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;

 private:
  TorchOutput torch_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_OUTPUT_H_
