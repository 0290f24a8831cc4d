// The metadata files of ColossalAI's distributed checkpoints (PR #6181,
// colossalai/checkpoint_io/distributed_checkpoint_utils.py): one JSON file per (tp, pp) rank,
// `pytorch_model-meta-dist-{dist_id:05d}.json` (or `.index.json` when the weights are
// safetensors), dist_id = tp_size * pp_rank + tp_rank:
//
//   {"checkpoint_version": "1.0", "total_size": <int or null>,
//    "metadata": {"<param>": {"offsets": [..], "lengths": [..], "global_shape": [..],
//                             "file": "<weight file>", "rank": <global rank>}, ...}}
//
// Each parameter's entry is the box of the global tensor that the rank's weight file holds
// (`offsets`, `lengths`), the tensor's unsharded shape, and the file holding it: a bare name in
// sharded mode, the saving machine's full path in unsharded mode.

#ifndef RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_META_H_
#define RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_META_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/shape.h"

namespace reshard {

inline constexpr char kColossalMetaPrefix[] = "pytorch_model-meta-dist-";

// One parameter's entry of a metadata file.
struct ColossalParam {
  std::string name;
  Box box;  // offsets, lengths
  Shape global_shape;
  std::string file;  // as written
  int64_t rank = 0;
};

struct ColossalMeta {
  int64_t dist_id = 0;
  std::string path;                   // the metadata file
  std::vector<ColossalParam> params;  // in file order
};

// The dist_id of a metadata file name (`pytorch_model-meta-dist-00003.json` or
// `.index.json`), or nullopt for any other name.
std::optional<int64_t> ColossalMetaDistId(absl::string_view name);

// Parses the metadata file `json` found at `path` (named in errors) with dist id `dist_id`.
// DataLoss naming the file and parameter for anything malformed: missing or mistyped fields,
// offsets / lengths / global_shape of different ranks, negative sizes, a box outside
// global_shape, a parameter given twice.
absl::StatusOr<ColossalMeta> ParseColossalMeta(absl::string_view json, const std::string& path,
                                               int64_t dist_id);

// A box of a tensor of `shape` that none of `boxes` covers (every box inside the tensor), as
// large as the boxes' boundaries allow: the hole a missing rank leaves; nullopt when they cover
// every element, or when the boxes cut the tensor into more than `max_cells` cells.
std::optional<Box> FindUncoveredBox(const Shape& shape, const std::vector<Box>& boxes,
                                    uint64_t max_cells = uint64_t{1} << 20);

// A box as index ranges: "[26, 50) x [0, 16)"; "(all of it)" for a 0-d box.
std::string BoxRanges(const Box& box);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_META_H_
