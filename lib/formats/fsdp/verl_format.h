// verl's FSDP checkpoints (verl/utils/checkpoint/fsdp_checkpoint_manager.py), read as id
// "verl-fsdp".
//
// A save folder (`global_step_N/actor/`) holds, per rank r of world size W,
// `model_world_size_{W}_rank_{r}.pt`: a torch.save of the rank's sharded model state dict, whose
// values are DTensors (dtensor.h) over a device mesh of the W ranks; beside them
// `optim_world_size_*` and `extra_state_world_size_*` (not read), `fsdp_config.json` and a
// `huggingface/` folder with config.json and the tokenizer (model files carried into Hugging
// Face outputs, lib/formats/hf/model_files.h).
//
// Every rank file is read for its metadata only (the safe pickle VM; globals outside a DTensor
// state dict's are refused) and each DTensor's local tensor becomes the box of the global
// tensor its rank holds: pieces located in place in the rank files. Boxes must tile each tensor
// exactly; a box held by several ranks (Replicate placements, or plain tensors every rank
// saves) is read once and its other copies are kept for `verify` to compare. Tensor names and
// order are rank 0's; every rank must hold the same names, dtypes and global shapes.

#ifndef RESHARD_LIB_FORMATS_FSDP_VERL_FORMAT_H_
#define RESHARD_LIB_FORMATS_FSDP_VERL_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"

namespace reshard {

// (world size, rank) of a verl model shard name `model_world_size_{W}_rank_{r}.pt`; nullopt for
// any other name.
struct VerlShardName {
  int64_t world_size = 0;
  int64_t rank = 0;
};
std::optional<VerlShardName> ParseVerlShardName(absl::string_view name);

// The folder of model files verl saves beside the shards.
inline constexpr char kVerlHuggingFaceFolder[] = "huggingface";

class VerlFsdpInput : public InputFormat {
 public:
  static constexpr char kId[] = "verl-fsdp";
  absl::string_view id() const override { return kId; }
  // A folder holding a model_world_size_{W}_rank_{r}.pt file.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Its .pt files would pass for a folder of torch.save files: before torch.
  int probe_priority() const override { return 17; }
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_VERL_FORMAT_H_
