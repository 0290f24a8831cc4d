// ShardedTensors as torch.save pickles them (FSDP1 state dicts of type SHARDED_STATE_DICT, one
// file per rank), read from the object tree of the safe pickle VM: nothing is executed, and only
// the globals a ShardedTensor state dict is made of are accepted.
//
// ShardedTensor (torch.distributed._shard.sharded_tensor.api) is a wrapper tensor subclass:
// Tensor.__reduce_ex__ (torch/_tensor.py, torch 2.x) gives
//   torch._tensor._rebuild_from_type_v2(
//       torch._utils._rebuild_wrapper_subclass, ShardedTensor,
//       (ShardedTensor, dtype, global size, global stride, storage_offset, layout, device,
//        requires_grad),
//       state)
// with `state` its __getstate__: (local_shards, metadata, pg_state, sharding_spec, init_rrefs).
//   - local_shards: [Shard(tensor, metadata)] (a dataclass): the rank's pieces, each a plain
//     tensor and its ShardMetadata;
//   - metadata: ShardedTensorMetadata(shards_metadata, size, tensor_properties): every shard of
//     every rank as ShardMetadata(shard_offsets, shard_sizes, placement) (__slots__: pickled as
//     (None, slots)), placement a torch.distributed.remote_device._remote_device ("rank:r/
//     cuda:r": its `_rank`), and TensorProperties, whose state is (dtype, layout,
//     requires_grad, MEM_FORMAT_ENCODING, pin_memory);
//   - pg_state: the NamedTuple ShardedTensor.ProcessGroupState(local_rank, global_rank,
//     local_world_size, global_world_size) of the saving rank (protocol 2 pickles the nested
//     class as getattr(ShardedTensor, "ProcessGroupState"), which the VM names
//     "ShardedTensor.ProcessGroupState");
//   - sharding_spec (ChunkShardingSpec or EnumerableShardingSpec) and init_rrefs: not read.
// FSDP1 (torch/distributed/fsdp/_shard_utils.py, _create_chunk_sharded_tensor) cuts each
// parameter along dim 0 as torch.chunk cuts it over the ranks; the box of every shard is given
// by its offsets and sizes, so any tiling is read.

#ifndef RESHARD_LIB_FORMATS_FSDP_SHARDED_TENSOR_H_
#define RESHARD_LIB_FORMATS_FSDP_SHARDED_TENSOR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/formats/torch/pickle.h"

namespace reshard {

// One shard of a ShardedTensor: its box of the global tensor and the rank its placement names.
struct ShardedTensorShard {
  Box box;
  int64_t rank = 0;
  const PickleValue* tensor = nullptr;  // a local shard's tensor (TorchArchive::Tensor); null
                                        // for an entry of shards_metadata
};

// A ShardedTensor read from its pickle.
struct ShardedTensorValue {
  Shape global_shape;
  DType dtype = DType::kF32;
  std::vector<ShardedTensorShard> local_shards;
  std::vector<ShardedTensorShard> shards_metadata;  // every rank's shards, in their order
  // The saving rank and world size (ProcessGroupState's global_rank / global_world_size).
  int64_t rank = 0;
  int64_t world_size = 0;
};

// Whether global `module`.`name` may appear in a ShardedTensor state dict: the tensor rebuild
// functions, torch.Size / device / dtypes / layouts / storage classes, and ShardedTensor (with
// its ProcessGroupState), Shard, ShardMetadata, ShardedTensorMetadata, TensorProperties,
// MEM_FORMAT_ENCODING, _remote_device and the sharding spec classes under torch's module paths.
bool IsShardedTensorStateDictGlobal(const std::string& module, const std::string& name);

// Checks every global reachable from `root` with IsShardedTensorStateDictGlobal (a sharding
// spec's state is not looked into: it is never read). FailedPrecondition naming the global and
// the top-level key it sits under otherwise.
absl::Status CheckShardedTensorStateDictGlobals(const PickleValue* root);

// Whether `value` is the pickle of a ShardedTensor (cheap; no checks).
bool IsShardedTensorPickle(const PickleValue* value);

// The ShardedTensor `value` is, or nullopt when it is no ShardedTensor (a plain tensor, a
// number). DataLoss for a ShardedTensor whose parts are malformed or disagree: a metadata size
// or dtype other than the wrapper's, a shard whose offsets and sizes do not have one entry per
// dimension or leave the tensor, a placement without a rank, a local shard that the metadata
// does not list on the saving rank, a ProcessGroupState whose rank is outside its world size.
// Unimplemented for a dtype reshard does not know. The caller names the tensor.
absl::StatusOr<std::optional<ShardedTensorValue>> ParseShardedTensor(const PickleValue* value);

// "[0, 4) x [0, 8) on rank 0, [4, 8) x [0, 8) on rank 1": shards as boxes and ranks, for
// messages.
std::string DescribeShards(const std::vector<ShardedTensorShard>& shards);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_SHARDED_TENSOR_H_
