// PyTorch Distributed Checkpoints (torch.distributed.checkpoint, "DCP") written by
// FileSystemWriter, read as one global model (id "torch-dcp").
//
// A DCP checkpoint is a folder:
//   .metadata        pickled Metadata (see dcp_metadata.h): every tensor's global size, dtype
//                    and chunks (boxes of the global tensor), and where each chunk's bytes are
//   __R_N.distcp     data of rank R (bucket N): the concatenation, without header or padding,
//                    of the rank's write items; each item is a complete torch.save archive of
//                    one chunk tensor (or, for a non-tensor value, of that value), whose zip
//                    offsets are relative to the item's first byte
// Reading never loads data: for every chunk the byte range `[offset, offset + length)` of its
// file is parsed as a torch.save archive (headers and pickle only), its single tensor is
// checked against the chunk (shape = chunk sizes, dtype = the tensor's) and becomes a
// SourcePiece at (file, range offset + tensor offset, pickled strides): column-sharded chunks
// may be stored transposed, and the executor copies boxes from any strides. The chunks of each
// tensor must tile it exactly (inside, disjoint, complete).
//
// Non-tensor values (BytesStorageMetadata: step counters, hyper-parameters, optimizer
// param_groups) are parsed the same way and carried as Catalog::structure leaves: the nesting
// is rebuilt from planner_data (fqn -> key path; a str key is a dict key, an int a list
// position, as torch's own unflattening does), so a torch.save output holds the original
// nested state dict. Without planner_data the values sit flat under their fqns. Python objects
// other than plain data are listed in other_entries as not carried.
//
// Refused: data files outside the folder (absolute paths, "..", symlinks leading out), missing
// or truncated files, chunks that do not tile their tensor, archives that disagree with the
// metadata, stream transforms (zstd, torch >= 2.6 `_extensions`; Unimplemented naming the
// descriptor), rank-local metadata (`__R.metadata` without `.metadata`), and the safetensors
// flavour (HuggingFaceStorageWriter), which has no `.metadata`.

#ifndef RESHARD_LIB_FORMATS_DCP_DCP_FORMAT_H_
#define RESHARD_LIB_FORMATS_DCP_DCP_FORMAT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/dcp/dcp_metadata.h"
#include "lib/formats/format.h"

namespace reshard {

inline constexpr char kDcpMetadataName[] = ".metadata";

class DcpInput : public InputFormat {
 public:
  static constexpr char kId[] = "torch-dcp";
  absl::string_view id() const override { return kId; }
  // A folder holding `.metadata` or `__R_N.distcp` files, or the `.metadata` file itself.
  absl::StatusOr<bool> Probe(const std::string& path) const override;
  // Before folder-of-files formats: a DCP folder is recognized by its file names. Below
  // Megatron, above DeepSpeed ZeRO (the order detection has always had).
  int probe_priority() const override { return 30; }
  // `.metadata` is read whole (range reads); each item's torch.save archive by range reads of
  // its first and last bytes, prefetched for many items at once; chunks are contiguous boxes.
  // Options do not apply: a DCP checkpoint has no tags, and optimizer state is already stored
  // as tensors of their own.
  absl::StatusOr<InputModel> Read(const std::string& path,
                                  const ReadOptions& options) const override;
};

// A check a layout built on DCP makes of the parsed `.metadata` (at `metadata_path`) before the
// chunk tiling check, so that its refusals can say what an axis means in that layout
// (Megatron-Core's expert axis: which expert is missing or stored twice, and where).
using DcpMetadataCheck =
    std::function<absl::Status(const DcpMetadata& metadata, const std::string& metadata_path)>;

// Reads the DCP checkpoint in folder `dir` (its `.metadata` and data files, as DcpInput::Read
// does) as one model. For readers of layouts built on DCP (Megatron-Core's torch_dist), which
// may pass `check` (see above).
absl::StatusOr<InputModel> ReadDcpCheckpoint(const std::string& dir,
                                             const DcpMetadataCheck& check = nullptr);

// The data file `relative_path` (a `_StorageInfo.relative_path`) of the checkpoint in folder
// `dir`, as a path: it must be a relative path without ".." components, and name an existing
// regular file that, with symlinks resolved, lies inside `dir`. DataLoss naming the path
// otherwise, NotFound when it does not exist.
absl::StatusOr<std::string> ResolveDcpDataFile(const std::string& dir,
                                               absl::string_view relative_path);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DCP_DCP_FORMAT_H_
