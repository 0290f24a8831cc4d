// DeepSpeed ZeRO-1/2/3 checkpoints (`ZeroInput`, id "deepspeed-zero"): the consolidated model
// that DeepSpeed's zero_to_fp32.py would produce, located in place in the checkpoint's files.
//
// Layout read (docs/formats.md, "DeepSpeed ZeRO"; DeepSpeed's runtime/engine.py and
// utils/zero_to_fp32.py):
//   <dir>/latest                 the tag ("global_step1200"), when a parent folder is given
//   <dir>/<tag>/[bf16_]zero_pp_rank_{R}_mp_rank_00_optim_states.pt   one per data-parallel rank
//   <dir>/<tag>/mp_rank_00_model_states.pt                  ZeRO-1/2
//   <dir>/<tag>/zero_pp_rank_{R}_mp_rank_00_model_states.pt ZeRO-3, one per rank
// Only pickles are read (TorchArchive); storages are never loaded. Ranks come from the file
// names, never from their order. The stage and world size W come from rank 0's
// `optimizer_state_dict` (`zero_stage`, `partition_count`, a list -> its max); there must be
// exactly W optimizer files for ranks 0..W-1 (and, for ZeRO-3, W model-states files).
//
// Tensors produced, in zero_to_fp32's order:
//   1. buffers: rank 0's `module` entries named in `buffer_names`, in module order. They keep
//      their dtype (zero_to_fp32 casts them to fp32; reshard leaves that to `--dtype`, which
//      converts floating tensors).
//   2. frozen params (`frozen_param_shapes`, stage >= 2), in their saved 16-bit dtype. ZeRO-2:
//      `frozen_param_fragments[name]` is the whole tensor. ZeRO-3: rank r's fragment holds
//      elements [r*P, (r+1)*P) with P = ceil(n/W); the first n of the concatenation. When a
//      ZeRO-1/2 checkpoint records no frozen params (ZeRO-1 never does), the tensors of
//      `module` that are neither trainable params, buffers nor tied aliases are taken from
//      `module` (their 16-bit copies); zero_to_fp32 drops them.
//   3. trainable params from `param_shapes`, float32, out of the fp32 master partitions:
//      ZeRO-1/2 `single_partition_of_fp32_groups[g]` (one flat buffer per param group, T_g
//      elements padded to A_g = ceil(T_g / 2W) * 2W, rank r owns [r*P_g, (r+1)*P_g) with
//      P_g = A_g / W; saved partitions may be unpadded or padded); ZeRO-3 `fp32_flat_groups[s]`
//      (each param padded to W*P_p with P_p = ceil(n/W); every rank holds its P_p slice of every
//      param back to back, across sub-groups). A param becomes one piece per (rank, sub-group)
//      run, pointing into the optimizer files.
//   4. tied aliases (`shared_params` alias -> owner): the owner's dtype, shape and pieces, so
//      writers store them once.
//   With ReadOptions::include_optimizer, "<param>.exp_avg" and "<param>.exp_avg_sq" follow:
//   ZeRO-1/2 `base_optimizer_state.state[g]` (same partitioning, padding kept), ZeRO-3 the
//   nested `optimizer_state_dict.state[s]`.
//
// Folders without optimizer files (the optimizer files were not copied, or the run did not use
// ZeRO) are claimed too, so that they never fall through to the generic torch reader (which
// would read mp_rank_00_model_states.pt as a plain state dict: `module.*` 16-bit tensors):
//   - refused (DataLoss, "DeepSpeed ZeRO-3 checkpoint global_step10 has no optimizer files
//     (zero_pp_rank_*_mp_rank_00_optim_states.pt): the fp32 weights live there; copy them too")
//     when the model states say ZeRO: zero_pp_rank_N model-states files (only ZeRO-3 names them
//     so), `ds_config.zero_optimization.stage` >= 1, or `param_shapes` not None (saved whenever
//     the fp32 weights are partitioned, BF16_Optimizer included). A bf16 run's ds_config gives
//     the `bf16_` prefix of the files to copy;
//   - DeepSpeed without ZeRO (stage 0: mp_rank_XX_model_states.pt only, param_shapes None): the
//     tensors of `module` (a full state dict), in its order, under their own names and dtypes;
//     tied weights are two names of one storage (identical pieces, stored once). Non-tensor
//     entries and the other keys of the file are listed in other_entries. One mp_rank_00 file:
//     layout "single-file". mp_rank_00..N-1 (tensor parallelism without the pipeline engine,
//     which would have written layer files and `module` None) are N model-parallel parts, in
//     rank order (layout "model-parallel-parts"): each rank's `module` is the state dict of its
//     shard of the model, exactly what the engine's --rules merge expects; DeepSpeed records no
//     partitioning, so the user supplies the rules. Missing ranks (or `mp_world_size`
//     disagreeing with the files) are refused. `module` None (the pipeline engine's model states
//     without their layer files) is refused. --include-optimizer is refused: the non-ZeRO
//     optimizer state (`optimizer`) is keyed by parameter index, not name.
//
// BF16_Optimizer files (bf16 ZeRO-1 as Megatron-DeepSpeed runs it) have no `zero_stage`; like
// ds_to_universal they are read as stage 1 (padded partitions). Checks, each naming the file:
// rank files complete and consistent, flat tensors 1-D contiguous float32 and as long as the
// layout needs (ZeRO-1/2: unpadded or padded partition lengths, and `group_paddings` where
// recorded), zero_to_fp32's sanity checks (ZeRO-1/2: aligned param total == aligned flat total
// per group; ZeRO-3: W*sum(P_p) == W*sum(sub-group sizes)). Not supported
// (Unimplemented): ZeRO with model parallelism (mp_rank_01... beside optimizer files), pipeline
// layer files (left to the Megatron reader, which probes first), per-group partition counts
// that differ without expert files (MiCS), AutoEP partition groups. Mixture-of-experts saves
// (layer_{m}_expert_{g}_mp_rank_XX_model_states.pt, or the legacy expert_{g}_mp_rank_XX, beside
// mp_rank_XX_model_states.pt) are read with every expert under its global id: without ZeRO from
// the expert files (moe_experts.h), with ZeRO-1/2 from the optimizer files' dense and expert
// param groups (moe_zero_reader.h).

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FORMAT_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/formats/deepspeed/zero_layout.h"
#include "lib/formats/format.h"

namespace reshard {

class ZeroInput : public InputFormat {
 public:
  static constexpr const char* kId = kZeroFormatId;
  absl::string_view id() const override { return kId; }
  // A folder holding ZeRO optimizer files or DeepSpeed model-states files
  // (`mp_rank_XX_model_states.pt`, `zero_pp_rank_N_mp_rank_XX_model_states.pt`), i.e. a
  // `global_stepN` folder, or a parent folder with a subfolder holding them (the `latest` file
  // or --tag picks one at Read). Folders with pipeline layer files
  // (`layer_01-model_00-model_states.pt`) are not claimed: they are the Megatron reader's.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Below Megatron (which claims pipeline folders) and DCP, above folder-of-files formats.
  int probe_priority() const override { return 20; }
  // Folders are listed and files opened through lib/io/file_access.h and TorchArchive::Open,
  // and every piece is a flat element range: s3:// checkpoints read as local ones.
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FORMAT_H_
