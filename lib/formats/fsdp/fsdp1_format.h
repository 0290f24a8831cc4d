// FSDP1 state dicts of type SHARDED_STATE_DICT saved per rank with torch.save, read as id
// "fsdp1-sharded".
//
// A save folder holds, per rank r of world size W, `<prefix>rank{r}.pt` (one prefix for the
// save, "" or e.g. "model_"): torch.save(model.state_dict()) under
// StateDictType.SHARDED_STATE_DICT, whose parameters are ShardedTensors (sharded_tensor.h) and
// whose buffers are plain tensors that every rank saves. Every rank file is read for its
// metadata only (the safe pickle VM; globals outside a ShardedTensor state dict's are refused);
// each local shard becomes the box of the global tensor its ShardMetadata gives: pieces located
// in place in the rank files. The ranks' ShardedTensorMetadata must agree, and their shards
// tile each tensor exactly; the world size is the ProcessGroupState's of the saving ranks. Tensor
// names and order are rank 0's; a buffer's copies on the other ranks are kept for `verify`.

#ifndef RESHARD_LIB_FORMATS_FSDP_FSDP1_FORMAT_H_
#define RESHARD_LIB_FORMATS_FSDP_FSDP1_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"

namespace reshard {

// (prefix, rank) of a rank file name `<prefix>rank{r}.pt`; nullopt for any other name.
struct Fsdp1RankName {
  std::string prefix;
  int64_t rank = 0;
};
std::optional<Fsdp1RankName> ParseFsdp1RankName(absl::string_view name);

class Fsdp1ShardedInput : public InputFormat {
 public:
  static constexpr char kId[] = "fsdp1-sharded";
  absl::string_view id() const override { return kId; }
  // A folder holding `<prefix>rank{N}.pt` files whose lowest rank's state dict holds a
  // ShardedTensor (its pickle is parsed, nothing else read).
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Its .pt files would pass for a folder of torch.save files: before torch.
  int probe_priority() const override { return 14; }
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_FSDP1_FORMAT_H_
