// Writes PyTorch Distributed Checkpoints (id "torch-dcp") that torch.distributed.checkpoint's
// FileSystemReader loads at any world size (dcp.load / load_state_dict with any planner).
//
// The folder holds, as FileSystemWriter (single_file_per_rank) lays it out:
//   __R_N.distcp  data of rank R (bucket N): the concatenation, without header or padding, of
//                 the rank's write items, non-tensor values (BYTE_IO items) first, then tensor
//                 chunks. Each item is a complete torch.save archive (top folder "archive", as
//                 torch.save onto a stream names it) whose zip offsets are relative to the
//                 item's first byte: a value's archive holds the value, a chunk's holds the
//                 chunk as one bare tensor.
//   .metadata     the pickled Metadata, written last (as the coordinator writes it): for every
//                 entry a TensorStorageMetadata (TensorProperties of the output dtype, the
//                 global torch.Size, one ChunkStorageMetadata per chunk) or a
//                 BytesStorageMetadata; storage_data maps MetadataIndex(fqn, chunk offsets,
//                 chunk index) (values: MetadataIndex(fqn)) to _StorageInfo(relative_path,
//                 offset, length); planner_data maps every fqn to its key path, from which
//                 torch rebuilds the nested state dict; version "1.0.0". Classes are pickled
//                 under current torch's module paths (torch.distributed.checkpoint.metadata,
//                 TensorProperties' 5-tuple state with _MEM_FORMAT_ENCODING,
//                 torch.distributed.checkpoint.filesystem._StorageInfo), and only torch.Size,
//                 torch dtypes and torch.serialization._get_layout beside them.
//
// consolidate writes one chunk per tensor, in rank 0's files `__0_N.distcp` (N > 0 only when
// --max-shard-size splits the model). reshard --parts M writes M ranks' files `__R_0.distcp`
// whose chunks are the parts' boxes: a split tensor has one chunk per rank, a replicated one a
// single chunk stored by rank 0 (DCP stores every element once). A checkpoint for a new world
// size can so be produced from any input; torch loads it into any sharding of the same
// tensors.
//
// Non-tensor values go where torch puts them: the input's nesting (Catalog::structure) is
// flattened as torch's flatten_state_dict does (every dict descended, its keys str()-ed; a list
// descended only when it holds a tensor, a dict or such a list; tuples and other objects are
// leaves; fqn = the path joined by "."), each non-tensor leaf becomes a BYTE_IO item of rank 0,
// and planner_data records every path. A leaf value that holds tensors (a tuple of tensors) is
// pickled with them, as torch.save(value) stores them: the tensors are storages of the value's
// archive, whole. Refused (Unimplemented, naming the tensor): such a tensor split by the
// partition rules, a split by a fused rule (a part's slice of K fused blocks is not one box of
// the tensor), dtypes torch.save writes through UntypedStorage (float8, unsigned > 8 bits).
// Tied weights are written under each name (DCP has no aliases).

#ifndef RESHARD_LIB_FORMATS_DCP_DCP_OUTPUT_H_
#define RESHARD_LIB_FORMATS_DCP_DCP_OUTPUT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/format.h"

namespace reshard {

class DcpOutput : public OutputFormat {
 public:
  static constexpr char kId[] = "torch-dcp";
  absl::string_view id() const override { return kId; }
  OutputNaming naming() const override;
  // Rank 0 carries the non-tensor values; replicated chunks are kept once; every tensor's
  // global shape is recorded for `.metadata`.
  absl::StatusOr<ArrangedOutput> Arrange(TargetLayout engine_layout,
                                         const ArrangeRequest& request) const override;
  absl::StatusOr<FileFraming> Frame(const OutputFileLayout& file) const override;
  // `.metadata`.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> CompanionFiles(
      const TargetLayout& layout) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DCP_DCP_OUTPUT_H_
