// Writes ShardedTensors into pickles as torch 2.x pickles them (sharded_tensor.h's file
// comment), for tests and fixtures: torch 1.13's ShardedTensor needs a process group to pickle.
//
// testonly.

#ifndef RESHARD_LIB_FORMATS_FSDP_SHARDED_TENSOR_PICKLE_WRITER_H_
#define RESHARD_LIB_FORMATS_FSDP_SHARDED_TENSOR_PICKLE_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/core/shape.h"
#include "lib/formats/torch/pickle_writer.h"

namespace reshard {

// A ShardedTensor as rank `rank` of `world_size` saves it.
struct ShardedTensorToWrite {
  std::string dtype = "float32";  // a torch dtype global
  Shape global_shape;
  // Every rank's shard: box and placement rank (ShardedTensorMetadata.shards_metadata).
  struct Entry {
    Box box;
    int64_t rank = 0;
  };
  std::vector<Entry> shards;
  int64_t rank = 0;
  int64_t world_size = 1;
  // The rank's local shards: indices into `shards`, each with the writer of its tensor (a torch
  // tensor of the shard's box, PickleWriter::Tensor).
  std::vector<size_t> local;
  std::function<void(PickleWriter&, size_t)> local_tensor;
};

// Chunks of dim 0 as FSDP1's _create_chunk_sharded_tensor cuts a tensor of `shape` over
// `world_size` ranks (torch.chunk: ceil(rows / world_size) per chunk, the ranks torch.chunk
// leaves nothing listing no shard).
std::vector<ShardedTensorToWrite::Entry> ChunkShards(const Shape& shape, int64_t world_size);

// Writes `st` into `p`: _rebuild_from_type_v2(_rebuild_wrapper_subclass, ShardedTensor,
// (ShardedTensor, dtype, size, stride, 0, layout, device, False), (local_shards, metadata,
// getattr(ShardedTensor, "ProcessGroupState")(rank, rank, world, world), ChunkShardingSpec,
// False)).
void WriteShardedTensor(PickleWriter& p, const ShardedTensorToWrite& st);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_SHARDED_TENSOR_PICKLE_WRITER_H_
