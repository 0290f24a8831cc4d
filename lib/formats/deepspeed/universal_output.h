// DeepSpeed universal checkpoints as output (`UniversalOutput`, id "deepspeed-universal"): the
// folder DeepSpeed's `load_checkpoint(..., load_universal=True)` resumes from at any
// data-parallel (and, with Megatron-DeepSpeed, tensor- or pipeline-parallel) size, as
// DeepSpeed's `checkpoint/ds_to_universal.py` writes it (docs/formats.md, "DeepSpeed universal
// checkpoints"):
//
//   OUT/mp_rank_00_model_states.pt          the input's model-states files, copied verbatim
//   OUT/zero/optimizer_state.pt             the optimizer's state without its partitions
//   OUT/zero/<param>/fp32.pt                {'cat_dim': 0, 'param': fp32 master weights}, with
//                                           the merge keys of universal_patterns.h;
//                                           ZeRO-3: the bare flat tensor (DeepSpeed's ZeRO-3
//                                           loader reads it so)
//   OUT/zero/<param>/exp_avg.pt             the same for Adam's first moment
//   OUT/zero/<param>/exp_avg_sq.pt          ... and second moment
//   OUT/zero/<param>/step.pt                the param group's step (ZeRO-1/2, when recorded)
//   <parent of OUT>/latest_universal        OUT's name (with --update-latest)
//
// Every trainable parameter (a Catalog tensor "<p>" with "<p>.exp_avg" and "<p>.exp_avg_sq",
// as the ZeRO reader produces them with the optimizer read) gets its three files, each written
// whole in float32 from the pieces of every rank: values are the fp32 master weights and
// moments, bit for bit. Parameters whose names match the model's
// `universal_checkpoint_info.vocabulary_parameter_patterns` are cut to `original_vocab_size`
// rows and marked `vocab_tensor: True` (DeepSpeed pads them again for the target TP).
// The merge keys follow universal_checkpoint_info as ds_to_universal sets them (no cat_dim for
// tp_replicated, cat_dim 1 for row-parallel, cat_dim 0 + param_n_sub_params 2 for
// parameter_with_2_sub_params_cat_dim_0, the SubparamShape object as `sub_param_shape` and no
// cat_dim for parameter_with_sub_params, cat_dim 0 otherwise). Parameters to average
// (parameter_to_average_patterns) get no cat_dim and the mean of the TP ranks' slices, which
// the reader keeps as training-state tensors "deepspeed.tp_slice.<t>.<name>", computed as
// ds_to_universal's `sum(slices) / len(slices)` in float32 (OutputTensor::mean_of). The readers
// that merge TP parts (the Megatron-DeepSpeed pipeline reader) merge them with rules from the
// same patterns.
// Buffers and frozen parameters are not in `zero/`: DeepSpeed loads them from the model-states
// files. Written by `consolidate` only (a universal checkpoint holds whole tensors; DeepSpeed
// slices them when it loads); --dtype must keep float32.
//
// Inputs without DeepSpeed training state (no model-states files to copy: safetensors, torch,
// a universal checkpoint itself) are refused with FailedPrecondition.
//
// The training state comes from the reader (InputModel::training_state): values
// "deepspeed.zero_stage", "deepspeed.optimizer_state" (structure of zero/optimizer_state.pt,
// whose tensors, ZeRO-3's per-sub-group steps, are training-state tensors),
// "deepspeed.param_group" (dict param name -> flat group index),
// "deepspeed.universal_checkpoint_info" (optional), tensors "deepspeed.step.<group>" (step.pt),
// and the model-states files to copy (verbatim_files).

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_OUTPUT_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_OUTPUT_H_

#include <string>
#include <utility>
#include <vector>

#include "lib/formats/format.h"

namespace reshard {

class UniversalOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "deepspeed-universal";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override;
  bool needs_optimizer_state() const override { return true; }
  absl::StatusOr<ArrangedOutput> Arrange(TargetLayout engine_layout,
                                         const ArrangeRequest& request) const override;
  // Every file is a torch.save archive (the torch writer frames it), or a verbatim copy.
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override;
  // None: the folder has no index.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_OUTPUT_H_
