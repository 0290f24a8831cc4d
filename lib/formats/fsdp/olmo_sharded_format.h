// OLMo's LocalShardedCheckpointer saves (olmo/checkpoint.py), read as id "olmo-sharded".
//
// A checkpoint folder (`step1000/`) holds `model/rank{N}.pt` for every rank N of the save,
// `optim/rank{N}.pt` and `train/rank{N}.pt` (not read), `metadata.yaml` (`world_size`) and
// `config.yaml`. Each model file is a torch.save of
//   {"modules": [{"name": <FSDP module fqn>, "handles": [{
//       "flat_param.data": <the rank's shard of the flat parameter, 1-d>,
//       "flat_param._fqns": (<parameter names relative to the module>, ...),
//       "flat_param._shapes": (<torch.Size>, ...),
//       "flat_param._shard_param_infos": (_ShardParamInfo(in_shard, offset_in_shard,
//            numel_in_shard, intra_param_start_idx, intra_param_end_idx), ...)   torch >= 2.1
//       or "flat_param._shard_indices": (first, last parameter in the shard) and
//          "flat_param._shard_param_offsets": ((start, end) in each of those parameters, ...)
//                                                                                torch <= 2.0
//       "flat_param._shard_numel_padded": <zeros at the shard's end>, ...}]}]}
// (LocalShardedCheckpointer._get_flat_param_state_to_save). Parameter `fqn` of module `name`
// is `name` without "_fsdp_wrapped_module." then ".fqn"; its flattening's elements
// [intra_param_start_idx, intra_param_end_idx] (inclusive) are the rank's flat data from
// offset_in_shard on, as _iter_flat_param_shards / _FlatParamShard.copy_into read them.
//
// Every rank file's pickle runs in the safe pickle VM (globals other than tensor rebuilds,
// torch sizes and dtypes and _ShardParamInfo are refused); each original parameter becomes a
// Catalog tensor whose pieces are flat ranges located in place in the ranks' files, and the
// ranges of every parameter must tile its elements exactly.

#ifndef RESHARD_LIB_FORMATS_FSDP_OLMO_SHARDED_FORMAT_H_
#define RESHARD_LIB_FORMATS_FSDP_OLMO_SHARDED_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"

namespace reshard {

class OlmoShardedInput : public InputFormat {
 public:
  static constexpr char kId[] = "olmo-sharded";
  absl::string_view id() const override { return kId; }
  // A folder whose model/ folder holds a rank{N}.pt file.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Its .pt files sit one folder down, where no generic reader looks; below verl-fsdp.
  int probe_priority() const override { return 16; }
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_OLMO_SHARDED_FORMAT_H_
