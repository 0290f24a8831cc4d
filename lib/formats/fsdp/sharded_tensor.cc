#include "lib/formats/fsdp/sharded_tensor.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/colossalai/colossalai_meta.h"
#include "lib/formats/fsdp/dtensor.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;

constexpr char kApiModule[] = "torch.distributed._shard.sharded_tensor.api";
constexpr char kShardModule[] = "torch.distributed._shard.sharded_tensor.shard";
constexpr char kShardMetadataModule[] = "torch.distributed._shard.metadata";
constexpr char kMetadataModule[] = "torch.distributed._shard.sharded_tensor.metadata";
constexpr char kRemoteDeviceModule[] = "torch.distributed.remote_device";

bool IsShardingSpec(const PickleValue* value) {
  return value != nullptr && value->kind == Kind::kObject && value->callable != nullptr &&
         value->callable->kind == Kind::kGlobal &&
         absl::StartsWith(value->callable->module, "torch.distributed._shard.sharding_spec");
}

// One int of a list or tuple of ints (offsets, sizes), or nullopt.
std::optional<std::vector<int64_t>> IntList(const PickleValue* value) {
  const std::vector<PickleValue*>* items = PickleItems(value);
  if (items == nullptr) return std::nullopt;
  std::vector<int64_t> out;
  for (const PickleValue* item : *items) {
    std::optional<int64_t> v = PickleInt(item);
    if (!v.has_value()) return std::nullopt;
    out.push_back(*v);
  }
  return out;
}

// A ShardMetadata(shard_offsets, shard_sizes, placement) of a tensor of `shape`.
absl::StatusOr<ShardedTensorShard> ParseShardMetadata(const PickleValue* value, const Shape& shape,
                                                      absl::string_view what) {
  if (value == nullptr || !value->IsObjectOf(kShardMetadataModule, "ShardMetadata")) {
    return absl::DataLossError(
        absl::StrCat(what, " is a ", DescribePickleValue(value), ", not a ShardMetadata"));
  }
  std::optional<std::vector<int64_t>> offsets = IntList(ObjectField(value, "shard_offsets", 0));
  std::optional<std::vector<int64_t>> sizes = IntList(ObjectField(value, "shard_sizes", 1));
  if (!offsets.has_value() || !sizes.has_value() || offsets->size() != shape.size() ||
      sizes->size() != shape.size()) {
    return absl::DataLossError(absl::StrCat(
        what, " does not give shard_offsets and shard_sizes of ", shape.size(),
        " ints (one per dimension of the tensor of shape ", ShapeToString(shape), ")"));
  }
  ShardedTensorShard shard;
  shard.box.origin = *offsets;
  shard.box.extent = *sizes;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shard.box.origin[d] < 0 || shard.box.extent[d] < 0 ||
        shard.box.origin[d] > shape[d] - shard.box.extent[d]) {
      return absl::DataLossError(absl::StrCat(what, ": elements ", BoxRanges(shard.box),
                                              " leave the tensor of shape ", ShapeToString(shape)));
    }
  }
  const PickleValue* placement = ObjectField(value, "placement", 2);
  std::optional<int64_t> rank =
      placement != nullptr && placement->IsObjectOf(kRemoteDeviceModule, "_remote_device")
          ? PickleInt(PickleField(placement, "_rank"))
          : std::nullopt;
  if (!rank.has_value() || *rank < 0) {
    return absl::DataLossError(absl::StrCat(what, "'s placement is a ",
                                            DescribePickleValue(placement),
                                            ", not a _remote_device naming a rank"));
  }
  shard.rank = *rank;
  return shard;
}

}  // namespace

bool IsShardedTensorStateDictGlobal(const std::string& module, const std::string& name) {
  if (module == kApiModule) {
    return name == "ShardedTensor" || name == "ShardedTensor.ProcessGroupState";
  }
  if (module == kShardModule) return name == "Shard";
  if (module == kShardMetadataModule) return name == "ShardMetadata";
  if (module == kMetadataModule) {
    // Python >= 3.11 pickles an Enum member as getattr(Enum, "MEMBER"), which stays an inert
    // object of builtins.getattr (allowed below) unless it is called.
    return name == "ShardedTensorMetadata" || name == "TensorProperties" ||
           name == "MEM_FORMAT_ENCODING" || absl::StartsWith(name, "MEM_FORMAT_ENCODING.");
  }
  if (module == "builtins") return name == "getattr";
  if (module == kRemoteDeviceModule) return name == "_remote_device";
  if (module == "torch.distributed._shard.sharding_spec.chunk_sharding_spec") {
    return name == "ChunkShardingSpec";
  }
  if (module == "torch.distributed._shard.sharding_spec.api") {
    return name == "EnumerableShardingSpec";
  }
  // The tensor rebuilds, torch sizes, devices, layouts and dtypes of any state dict.
  if (absl::StartsWith(module, "torch.distributed")) return false;
  return IsDTensorStateDictGlobal(module, name);
}

absl::Status CheckShardedTensorStateDictGlobals(const PickleValue* root) {
  return CheckPickleGlobals(root, IsShardedTensorStateDictGlobal,
                            "a ShardedTensor state dict (allowed: tensor rebuild functions, "
                            "torch dtypes, devices and sizes, ShardedTensor, Shard, "
                            "ShardMetadata, ShardedTensorMetadata, TensorProperties, "
                            "_remote_device, sharding specs)",
                            IsShardingSpec);
}

bool IsShardedTensorPickle(const PickleValue* value) {
  return value != nullptr && value->IsObjectOf("torch._tensor", "_rebuild_from_type_v2") &&
         value->args != nullptr && value->args->kind == Kind::kTuple &&
         value->args->items.size() == 4 &&
         value->args->items[1]->IsGlobal(kApiModule, "ShardedTensor");
}

absl::StatusOr<std::optional<ShardedTensorValue>> ParseShardedTensor(const PickleValue* value) {
  if (!IsShardedTensorPickle(value)) return std::nullopt;
  const std::vector<PickleValue*>& rebuild = value->args->items;
  if (!rebuild[0]->IsGlobal("torch._utils", "_rebuild_wrapper_subclass")) {
    return absl::DataLossError(absl::StrCat("a ShardedTensor rebuilt by ",
                                            DescribePickleValue(rebuild[0]),
                                            " rather than torch._utils._rebuild_wrapper_subclass"));
  }
  // (cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
  const PickleValue* wrapper = rebuild[2];
  if (wrapper->kind != Kind::kTuple || wrapper->items.size() < 3) {
    return absl::DataLossError(
        absl::StrCat("a ShardedTensor's wrapper arguments are a ", DescribePickleValue(wrapper)));
  }
  ShardedTensorValue out;
  const PickleValue* dtype = wrapper->items[1];
  std::optional<DType> parsed_dtype = dtype->kind == Kind::kGlobal && dtype->module == "torch"
                                          ? TorchDType(dtype->name)
                                          : std::nullopt;
  if (!parsed_dtype.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat("a ShardedTensor of dtype ", DescribePickleValue(dtype), " is not supported"));
  }
  out.dtype = *parsed_dtype;
  std::optional<std::vector<int64_t>> size = PickleShape(wrapper->items[2]);
  if (!size.has_value()) {
    return absl::DataLossError(
        absl::StrCat("a ShardedTensor's size is a ", DescribePickleValue(wrapper->items[2])));
  }
  out.global_shape = *size;

  // __getstate__: (local_shards, metadata, pg_state, sharding_spec, init_rrefs)
  const std::vector<PickleValue*>* state = PickleItems(rebuild[3]);
  if (state == nullptr || state->size() != 5 || rebuild[3]->kind != Kind::kTuple) {
    return absl::DataLossError(absl::StrCat(
        "a ShardedTensor's state is a ", DescribePickleValue(rebuild[3]),
        ", not ShardedTensor.__getstate__'s (local_shards, metadata, pg_state, sharding_spec, "
        "init_rrefs)"));
  }
  const PickleValue* metadata = (*state)[1];
  if (!metadata->IsObjectOf(kMetadataModule, "ShardedTensorMetadata")) {
    return absl::DataLossError(absl::StrCat("a ShardedTensor's metadata is a ",
                                            DescribePickleValue(metadata),
                                            ", not a ShardedTensorMetadata"));
  }
  std::optional<std::vector<int64_t>> metadata_size = PickleShape(ObjectField(metadata, "size", 1));
  if (!metadata_size.has_value() || *metadata_size != out.global_shape) {
    return absl::DataLossError(
        absl::StrCat("the ShardedTensorMetadata's size ",
                     metadata_size.has_value() ? ShapeToString(*metadata_size) : "is missing",
                     " and the tensor's size ", ShapeToString(out.global_shape), " differ"));
  }
  // TensorProperties' state: (dtype, layout, requires_grad, memory format, pin_memory).
  const PickleValue* properties = ObjectField(metadata, "tensor_properties", 2);
  const std::vector<PickleValue*>* property_state =
      properties != nullptr && properties->IsObjectOf(kMetadataModule, "TensorProperties")
          ? PickleItems(properties->state)
          : nullptr;
  const PickleValue* properties_dtype =
      property_state != nullptr && !property_state->empty() ? (*property_state)[0] : nullptr;
  if (properties_dtype == nullptr || !properties_dtype->IsGlobal("torch", dtype->name)) {
    return absl::DataLossError(absl::StrCat(
        "the ShardedTensorMetadata's tensor_properties do not give the tensor's dtype ",
        DTypeName(out.dtype), " (", DescribePickleValue(properties_dtype), ")"));
  }
  const std::vector<PickleValue*>* shards_metadata =
      PickleItems(ObjectField(metadata, "shards_metadata", 0));
  if (shards_metadata == nullptr) {
    return absl::DataLossError("the ShardedTensorMetadata has no shards_metadata list");
  }
  for (size_t i = 0; i < shards_metadata->size(); ++i) {
    ASSIGN_OR_RETURN(ShardedTensorShard shard,
                     ParseShardMetadata((*shards_metadata)[i], out.global_shape,
                                        absl::StrCat("shards_metadata[", i, "]")));
    out.shards_metadata.push_back(std::move(shard));
  }

  const PickleValue* pg_state = (*state)[2];
  std::optional<int64_t> rank = pg_state->IsObjectOf(kApiModule, "ShardedTensor.ProcessGroupState")
                                    ? PickleInt(ObjectField(pg_state, "global_rank", 1))
                                    : std::nullopt;
  std::optional<int64_t> world_size =
      rank.has_value() ? PickleInt(ObjectField(pg_state, "global_world_size", 3)) : std::nullopt;
  if (!world_size.has_value() || *rank < 0 || *rank >= *world_size) {
    return absl::DataLossError(
        absl::StrCat("a ShardedTensor's pg_state is a ", DescribePickleValue(pg_state),
                     ", not a ProcessGroupState of a rank inside its world size"));
  }
  out.rank = *rank;
  out.world_size = *world_size;

  const std::vector<PickleValue*>* local_shards = PickleItems((*state)[0]);
  if (local_shards == nullptr) {
    return absl::DataLossError(
        absl::StrCat("a ShardedTensor's local_shards are a ", DescribePickleValue((*state)[0])));
  }
  for (size_t i = 0; i < local_shards->size(); ++i) {
    const PickleValue* shard = (*local_shards)[i];
    const std::string what = absl::StrCat("local shard ", i);
    if (!shard->IsObjectOf(kShardModule, "Shard")) {
      return absl::DataLossError(
          absl::StrCat(what, " is a ", DescribePickleValue(shard), ", not a Shard"));
    }
    ASSIGN_OR_RETURN(ShardedTensorShard local,
                     ParseShardMetadata(ObjectField(shard, "metadata", 1), out.global_shape,
                                        absl::StrCat(what, "'s metadata")));
    local.tensor = ObjectField(shard, "tensor", 0);
    bool listed = false;
    for (const ShardedTensorShard& entry : out.shards_metadata) {
      listed = listed || (entry.box == local.box && entry.rank == local.rank);
    }
    if (!listed || local.rank != out.rank) {
      return absl::DataLossError(
          absl::StrCat(what, " holds elements ", BoxRanges(local.box), " on rank ", local.rank,
                       ", which the ShardedTensorMetadata does not list on the saving rank ",
                       out.rank, " (it lists ", DescribeShards(out.shards_metadata), ")"));
    }
    out.local_shards.push_back(std::move(local));
  }
  return out;
}

std::string DescribeShards(const std::vector<ShardedTensorShard>& shards) {
  if (shards.empty()) return "no shard";
  std::vector<std::string> parts;
  for (const ShardedTensorShard& shard : shards) {
    parts.push_back(absl::StrCat(BoxRanges(shard.box), " on rank ", shard.rank));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace reshard
