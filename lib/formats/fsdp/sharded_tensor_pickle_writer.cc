#include "lib/formats/fsdp/sharded_tensor_pickle_writer.h"

#include <algorithm>

#include "lib/formats/fsdp/dtensor_pickle_writer.h"

namespace reshard {
namespace {

constexpr char kApi[] = "torch.distributed._shard.sharded_tensor.api";
constexpr char kMetadata[] = "torch.distributed._shard.sharded_tensor.metadata";

void IntList(PickleWriter& p, const std::vector<int64_t>& values) {
  p.BeginList();
  for (int64_t v : values) p.Int(v);
  p.EndList();
}

void RemoteDevice(PickleWriter& p, int64_t rank) {
  WritePickleObject(p, "torch.distributed.remote_device", "_remote_device", [&] {
    p.BeginDict(false);
    p.String("_worker_name");
    p.None();
    p.String("_rank");
    p.Int(rank);
    p.String("_device");
    WriteCudaDevice(p, rank);
    p.EndDict();
  });
}

// ShardMetadata has __slots__: its state is (None, {slots}).
void ShardMetadata(PickleWriter& p, const ShardedTensorToWrite::Entry& entry) {
  WritePickleObject(p, "torch.distributed._shard.metadata", "ShardMetadata", [&] {
    p.BeginTuple();
    p.None();
    p.BeginDict(false);
    p.String("shard_offsets");
    IntList(p, entry.box.origin);
    p.String("shard_sizes");
    IntList(p, entry.box.extent);
    p.String("placement");
    RemoteDevice(p, entry.rank);
    p.EndDict();
    p.EndTuple();
  });
}

}  // namespace

std::vector<ShardedTensorToWrite::Entry> ChunkShards(const Shape& shape, int64_t world_size) {
  std::vector<ShardedTensorToWrite::Entry> out;
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t chunk = (rows + world_size - 1) / world_size;
  for (int64_t rank = 0; rank < world_size && chunk > 0 && rank * chunk < rows; ++rank) {
    ShardedTensorToWrite::Entry entry;
    entry.rank = rank;
    entry.box = Box::Full(shape);
    entry.box.origin[0] = rank * chunk;
    entry.box.extent[0] = std::min(rows, (rank + 1) * chunk) - rank * chunk;
    out.push_back(entry);
  }
  return out;
}

void WriteShardedTensor(PickleWriter& p, const ShardedTensorToWrite& st) {
  BeginWrapperSubclass(p, kApi, "ShardedTensor", st.dtype, st.global_shape, st.rank);
  // __getstate__: (local_shards, metadata, pg_state, sharding_spec, init_rrefs)
  p.BeginTuple();
  p.BeginList();
  for (size_t index : st.local) {
    WritePickleObject(p, "torch.distributed._shard.sharded_tensor.shard", "Shard", [&] {
      p.BeginDict(false);
      p.String("tensor");
      st.local_tensor(p, index);
      p.String("metadata");
      ShardMetadata(p, st.shards[index]);
      p.EndDict();
    });
  }
  p.EndList();
  WritePickleObject(p, kMetadata, "ShardedTensorMetadata", [&] {
    p.BeginDict(false);
    p.String("shards_metadata");
    p.BeginList();
    for (const ShardedTensorToWrite::Entry& entry : st.shards) ShardMetadata(p, entry);
    p.EndList();
    p.String("size");
    WriteTorchSize(p, st.global_shape);
    p.String("tensor_properties");
    WritePickleObject(p, kMetadata, "TensorProperties", [&] {
      // (dtype, layout, requires_grad, MEM_FORMAT_ENCODING(0), pin_memory)
      p.BeginTuple();
      p.Global("torch", st.dtype);
      WriteStridedLayout(p);
      p.Bool(false);
      p.Global(kMetadata, "MEM_FORMAT_ENCODING");
      p.BeginTuple();
      p.Int(0);
      p.EndTuple();
      p.Reduce();
      p.Bool(false);
      p.EndTuple();
    });
    p.EndDict();
  });
  // getattr(ShardedTensor, "ProcessGroupState"), as protocol 2 names a nested class.
  p.Global("__builtin__", "getattr");
  p.BeginTuple();
  p.Global(kApi, "ShardedTensor");
  p.String("ProcessGroupState");
  p.EndTuple();
  p.Reduce();
  WritePickleIntTuple(p, {st.rank, st.rank, st.world_size, st.world_size});
  p.NewObj();
  WritePickleObject(p, "torch.distributed._shard.sharding_spec.chunk_sharding_spec",
                    "ChunkShardingSpec", [&] {
                      p.BeginDict(false);
                      p.String("dim");
                      p.Int(0);
                      p.String("placements");
                      p.BeginList();
                      for (const ShardedTensorToWrite::Entry& entry : st.shards)
                        RemoteDevice(p, entry.rank);
                      p.EndList();
                      p.EndDict();
                    });
  p.Bool(false);
  p.EndTuple();
  p.EndTuple();
  p.Reduce();
}

}  // namespace reshard
