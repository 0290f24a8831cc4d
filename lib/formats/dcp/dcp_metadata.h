// The `.metadata` file of a PyTorch Distributed Checkpoint (DCP, torch.distributed.checkpoint)
// read into plain structs, and the checks a reader makes on it before touching any data file.
//
// `.metadata` is a pickle (protocol 4 as written by torch; 2 to 5 are accepted) of a
// `Metadata` dataclass:
//   state_dict_metadata: {fqn: TensorStorageMetadata(properties, size, chunks) |
//                              BytesStorageMetadata()}
//   storage_data:        {MetadataIndex(fqn, offset, index): _StorageInfo(relative_path,
//                                                             offset, length[, transforms])}
//   planner_data:        {fqn: key path tuple} (DefaultSavePlanner), or anything else
// It runs through the safe pickle reader (nothing is executed; the classes are inert objects),
// and is interpreted by field name only, so both generations of class paths are accepted:
// TensorProperties from torch.distributed._shard.sharded_tensor.metadata (torch <= 2.2) or
// torch.distributed.checkpoint.metadata (later), with its 5-tuple state (dtype first) or a
// field dict. Every chunk is matched to its byte range by (fqn, offsets), ignoring the index
// hint, as torch's reader does. How the data files are laid out: see dcp_format.h.

#ifndef RESHARD_LIB_FORMATS_DCP_DCP_METADATA_H_
#define RESHARD_LIB_FORMATS_DCP_DCP_METADATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"

namespace reshard {

// Where one write item (a tensor chunk or a pickled value) is: bytes [offset, offset + length)
// of `relative_path`, relative to the checkpoint folder (not yet checked against it).
struct DcpStorage {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  // Stream transforms the bytes went through ("stream.zstd/1"; torch >= 2.6 extensions).
  std::vector<std::string> transforms;
};

// One element of a planner_data key path: a dict key (string) or a list position (int).
struct DcpPathItem {
  bool is_index = false;
  std::string key;
  int64_t index = 0;
};

// One entry of state_dict_metadata.
struct DcpEntry {
  std::string fqn;
  bool is_tensor = false;
  // Tensors: element type, global size, and each chunk as a box of the global tensor with
  // the storage holding it (parallel vectors).
  DType dtype = DType::kF32;
  Shape size;
  std::vector<Box> chunks;
  // Tensors: one per chunk. Values (BytesStorageMetadata): exactly one.
  std::vector<DcpStorage> storage;
  // The key path planner_data gives for `fqn`; empty when it gives none.
  std::vector<DcpPathItem> path;
};

struct DcpMetadata {
  std::vector<DcpEntry> entries;  // in state_dict_metadata's order
  bool has_planner_data = false;  // planner_data is a {fqn: key path} dict
  std::string version;            // Metadata.version ("1.0.0", torch >= 2.6), or empty
  int64_t chunk_count = 0;        // chunks of all tensors
};

// Bounds on what a `.metadata` may declare (hostile input cannot make the reader allocate or
// loop beyond them).
struct DcpLimits {
  int64_t max_entries = 1 << 22;
  int64_t max_chunks = 1 << 24;  // over all tensors
  int max_rank = 64;
  int max_path_length = 64;
};

// Parses the pickled Metadata in `bytes` (the `.metadata` file at `path`, which names it in
// errors). DataLoss naming the fqn for anything malformed or inconsistent (a chunk without a
// storage_data entry, two entries for one chunk, a chunk whose rank differs from its tensor's);
// Unimplemented for a dtype reshard does not know. Chunk tiling is not checked here.
absl::StatusOr<DcpMetadata> ParseDcpMetadata(absl::string_view bytes, const std::string& path,
                                             const DcpLimits& limits = {});

// Checks that `chunks` tile a tensor of `size` exactly: each lies inside it, no two overlap,
// and together they cover every element. DataLoss naming the chunk(s) otherwise; the caller
// adds the tensor's name. A 0-d tensor has one chunk of rank 0.
absl::Status CheckChunkTiling(const Shape& size, const std::vector<Box>& chunks);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DCP_DCP_METADATA_H_
