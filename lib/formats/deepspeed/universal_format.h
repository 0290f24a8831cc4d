// DeepSpeed universal checkpoints (`UniversalInput`, id "deepspeed-universal"): the folder
// DeepSpeed's `ds_to_universal.py` writes from a ZeRO checkpoint, one full (unpartitioned,
// tensor-parallel slices merged) tensor per parameter and optimizer state.
//
// Layout read (docs/formats.md, "DeepSpeed universal checkpoints"; DeepSpeed's
// checkpoint/ds_to_universal.py, `merge_tp_slices`, `merge_zero3_slices`, `main`):
//   <save>/latest_universal           the universal folder's name, when a parent folder is given
//                                     (--tag names another)
//   <dir>/mp_rank_XX_model_states.pt  copied model states (ZeRO-3:
//                                     zero_pp_rank_N_mp_rank_XX_model_states.pt)
//   <dir>/zero/optimizer_state.pt     the optimizer's hyper-parameters and bookkeeping (not read)
//   <dir>/zero/<param>/fp32.pt        torch.save of {'param': full tensor, 'cat_dim': int,
//                                     ['vocab_tensor': True], ['param_n_sub_params': int],
//                                     ['sub_param_shape': ...]}; ZeRO-3 without tensor
//                                     parallelism: a bare flat 1-D tensor instead of the dict
//   <dir>/zero/<param>/exp_avg.pt, exp_avg_sq.pt   the Adam moments, in the same form
//   <dir>/zero/<param>/step.pt        the step, a bare value (ZeRO-1/2 only)
// Only pickles are read (TorchArchive); storages are never loaded: every tensor is one piece
// pointing into the storage record of its .pt file, whose CRC-32 the executor checks.
//
// Tensors produced:
//   1. one per sub-folder of zero/, named after it, from fp32.pt's 'param' (its dtype, shape
//      and strides as saved). Order: the order of `param_shapes` in the lowest-ranked
//      model-states file (a list of per-group ordered dicts, flattened), then the folders it
//      does not list in natural name order. A bare tensor (ZeRO-3) is 1-D; when `param_shapes`
//      gives the param a shape with as many elements and the tensor is contiguous, it takes
//      that shape (the view zero_to_fp32 gives it), otherwise it stays 1-D.
//      With ReadOptions::include_optimizer, "<param>.exp_avg" and "<param>.exp_avg_sq" follow
//      each param (the ZeRO reader's names), reshaped like it; their shape must be the param's.
//      A param folder with neither moment file (ds_to_universal writes only fp32.pt for params
//      that never got a gradient) is listed in other_entries; one moment without the other is
//      refused.
//   2. the tensors of the model-states file's `module` that zero/ does not hold, in module
//      order, in their saved dtype: buffers, and frozen params (ZeRO-1/2 keep their 16-bit
//      copies there; newer ds_to_universal also writes them to zero/ as fp32, which then
//      wins). Trainable params (`param_shapes`) are never taken from `module`: one missing from
//      zero/ is refused as a partial copy rather than replaced by its 16-bit copy. A ZeRO-3
//      frozen param (an empty placeholder in `module`, its data in the original checkpoint's
//      frozen_param_fragments, which ds_to_universal does not convert) is refused. With
//      tensor parallelism (model-states files of mp rank > 0), `module` holds per-rank slices
//      and is not read.
//   3. tied aliases (`shared_params` alias -> owner) absent from zero/: the owner's dtype,
//      shape and pieces, so that writers store them once.
// The non-tensor entries of fp32.pt (cat_dim, vocab_tensor, param_n_sub_params,
// sub_param_shape), the step (with include_optimizer), other state files of a param folder
// (another optimizer's `momentum_buffer.pt`) and non-tensor `module` entries are listed in
// Catalog::other_entries, "<param>.cat_dim: 0".
//
// Checks, each naming the file: fp32.pt present in every param folder, holding a dict with a
// tensor 'param' or a bare tensor; moments shaped as the param; a bare tensor's element count
// against `param_shapes`; every trainable param of `param_shapes` present; entries of zero/
// regular files or folders (FIFOs, devices refused); at most kMaxUniversalParams param folders.
// Paths are built only from the names zero/ lists, never from names inside files; every file
// is opened through lib/io/file_access.h (OpenRegularFile), so path confinement applies.
//
// The folder also holds mp_rank_00_model_states.pt, which the ZeRO reader would claim (and
// refuse, for its missing optimizer files): this reader probes first (priority 25). A parent
// folder holding `latest_universal` is claimed too, and read as the universal checkpoint it
// names, even when it also holds DeepSpeed's `latest`: give the global_stepN folder itself to
// read the original ZeRO checkpoint.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_FORMAT_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"

namespace reshard {

// The format id of UniversalInput, and of its Catalogs.
inline constexpr char kUniversalFormatId[] = "deepspeed-universal";
// ds_to_universal's tracker file in the parent of the universal folder: the folder's name.
inline constexpr char kUniversalTrackerName[] = "latest_universal";
// Param folders read from zero/ at most (entries listed at most: this plus a few).
inline constexpr int64_t kMaxUniversalParams = 1'000'000;

class UniversalInput : public InputFormat {
 public:
  static constexpr const char* kId = kUniversalFormatId;
  absl::string_view id() const override { return kId; }
  // A folder whose zero/ sub-folder holds optimizer_state.pt or a param folder with fp32.pt,
  // or a parent folder holding `latest_universal`.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Above deepspeed-zero (20), which would claim the universal folder for its model-states
  // file, below torch-dcp (30) and megatron (40), which claim nothing a universal folder holds.
  int probe_priority() const override { return 25; }
  // Folders listed and the .pt files of every param opened through lib/io/file_access.h and
  // TorchArchive::Open; each param is a whole, contiguous tensor.
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_UNIVERSAL_FORMAT_H_
