// ColossalAI distributed checkpoints (PR #6181, "[checkpointio] support distribute checkpoint
// io", colossalai/checkpoint_io/distributed_checkpoint_utils.py), read as one global model
// (id "colossalai-dist").
//
// With HybridParallelPlugin and `booster.save_model(..., gather_dtensor=False)` every
// (tp, pp) rank saves its local, ungathered parameters and a metadata file
// (colossalai_meta.h), dist_id = tp_size * pp_rank + tp_rank:
//   pytorch_model-meta-dist-{dist_id:05d}.json | .index.json    the boxes, one per parameter
//   pytorch_model-dist-{dist_id:05d}.bin | .safetensors          unsharded mode, or
//   ...-dist-{dist_id:05d}-shard-{idx:05d}.bin | .safetensors    sharded mode
// Each parameter of each metadata file becomes a SourcePiece: the box (`offsets`, `lengths`)
// of the global tensor (`global_shape`), located in place in the weight file `file` names
// (a torch.save archive, whose CRC-32s the executor checks, or a safetensors file). The last
// tensor-parallel rank's `lengths` may be shorter than its local tensor (vocabulary padding):
// the piece is the leading part of that tensor. Replicated parameters (the same box in every
// tensor-parallel rank's file) are read from the first; the other copies are kept as the
// tensor's replicas, which `verify` compares with it.
//
// `file` is the saving machine's full path in unsharded mode: an absolute path is taken as its
// last component inside the checkpoint folder; a relative one must stay inside the folder
// (no "..", no symlink leading out). Nothing outside the folder is opened.
//
// Refused before anything is written: a dist id without its metadata file (ids run 0..N-1),
// a weight file that is missing or lacks a parameter its metadata lists, shapes or dtypes that
// disagree, and boxes that do not tile their tensor exactly: the hole is named (the tensor and
// the index range no rank holds), as are overlaps. Tensors of the weight files that no
// metadata describes (buffers: ColossalAI's loader does not read them either) are listed by
// `inspect` and not read. Optimizer state is not part of the format (the PR saves none).

#ifndef RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_FORMAT_H_
#define RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"

namespace reshard {

class ColossalInput : public InputFormat {
 public:
  static constexpr char kId[] = "colossalai-dist";
  absl::string_view id() const override { return kId; }
  // A folder holding a `pytorch_model-meta-dist-NNNNN.json` / `.index.json` file.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Recognized by its metadata files; before DCP and the generic formats (its weight files
  // are ordinary torch.save / safetensors files).
  int probe_priority() const override { return 35; }
  // Metadata JSON and weight-file headers by range reads (safetensors, torch.save); every
  // piece is a rank's whole, contiguous tensor.
  // Options do not apply (no tags, no optimizer state).
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_COLOSSALAI_COLOSSALAI_FORMAT_H_
