// DTensors as torch.save pickles them (FSDP2 and FSDP1-with-a-device-mesh state dicts, which
// verl saves per rank), read from the object tree of the safe pickle VM: nothing is executed,
// and only the globals a DTensor state dict is made of are accepted.
//
// torch 2.x has no DTensor.__reduce_ex__: Tensor.__reduce_ex__ (torch/_tensor.py) gives
//   torch._tensor._rebuild_from_type_v2(
//       torch._utils._rebuild_wrapper_subclass, DTensor,
//       (DTensor, dtype, global size, global stride, storage_offset, layout, device,
//        requires_grad),
//       state)
// where DTensor is torch.distributed._tensor.api.DTensor (torch 2.0-2.3) or
// torch.distributed.tensor.DTensor (2.4 on), and `state` is torch._utils._get_obj_state: the
// instance __dict__ and, DTensor declaring __slots__ = ["_local_tensor", "_spec"], the slots
// as (__dict__ or None, {"_local_tensor": ..., "_spec": ...}). `_local_tensor` is the rank's
// shard (a plain tensor rebuilt from a storage); `_spec` a DTensorSpec dataclass (mesh,
// placements, tensor_meta) whose placements are Shard(dim) / Replicate() dataclasses, one per
// device mesh dimension, and whose tensor_meta is the NamedTuple TensorMeta(shape, stride,
// dtype).
//
// Which box of the global tensor a rank holds follows torch's Shard._split_tensor: along each
// mesh dimension i (in order) holding Shard(d), the extent of dimension d is cut as torch.chunk
// cuts it, ceil(extent / n_i) per chunk, so the last chunks may be shorter or empty; Replicate
// keeps the extent. A rank's coordinates on the mesh are those of its global rank in the
// row-major mesh of ranks 0..W-1 (init_device_mesh's).

#ifndef RESHARD_LIB_FORMATS_FSDP_DTENSOR_H_
#define RESHARD_LIB_FORMATS_FSDP_DTENSOR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/formats/torch/pickle.h"

namespace reshard {

// One placement of a DTensorSpec: Shard(dim) or Replicate().
struct DTensorPlacement {
  bool shard = false;
  int64_t dim = 0;  // Shard's tensor dimension
};

// A DTensor read from its pickle.
struct DTensorValue {
  const PickleValue* local_tensor = nullptr;  // the rank's shard, for TorchArchive::Tensor
  const PickleValue* mesh_tensor = nullptr;   // DeviceMesh.mesh, or null when absent
  Shape global_shape;
  DType dtype = DType::kF32;
  std::vector<DTensorPlacement> placements;
};

// Whether global `module`.`name` may appear in a DTensor state dict: the tensor rebuild
// functions, torch.Size / device / dtypes / layouts / storage classes, and the DTensor,
// DTensorSpec, TensorMeta, placement (Shard, Replicate, Partial, _StridedShard) and DeviceMesh
// classes under their module paths of torch 2.0 to 2.x.
bool IsDTensorStateDictGlobal(const std::string& module, const std::string& name);

// A dataclass or NamedTuple field of the object `object`: `key` of its BUILD state (a dict, or
// (dict or None, slots dict)), else its positional constructor argument `index` (NamedTuples
// pickle as cls.__new__(cls, *fields)); null when neither.
const PickleValue* ObjectField(const PickleValue* object, absl::string_view key, size_t index);

// Checks every global reachable from `root` with `allowed` (module, name); values `opaque`
// accepts (may be empty) are not looked into. FailedPrecondition naming the global, the
// top-level key of `root` it sits under, and "which is not part of <allowed_text>" otherwise.
absl::Status CheckPickleGlobals(
    const PickleValue* root,
    const std::function<bool(const std::string&, const std::string&)>& allowed,
    absl::string_view allowed_text, const std::function<bool(const PickleValue*)>& opaque = {});

// Checks every global reachable from `root` with IsDTensorStateDictGlobal (a DeviceMesh's
// state is not looked into: only its `mesh` tensor is read). FailedPrecondition naming the
// global and the top-level key it sits under otherwise.
absl::Status CheckDTensorStateDictGlobals(const PickleValue* root);

// The DTensor `value` is, or nullopt when it is no DTensor (a plain tensor, a number).
// DataLoss for a DTensor whose parts are malformed or disagree (a tensor_meta shape other than
// the size, a Shard dim outside the tensor); Unimplemented for a placement other than Shard
// and Replicate (Partial, _StridedShard). The caller names the tensor.
absl::StatusOr<std::optional<DTensorValue>> ParseDTensor(const PickleValue* value);

// The box of a tensor of `global_shape` that rank `rank` of `world_size` holds under
// `placements` on a device mesh of `mesh_shape` (one extent per placement; the ranks
// 0..world_size-1 in row-major order). InvalidArgument when the mesh does not hold world_size
// ranks or does not have one dimension per placement.
absl::StatusOr<Box> DTensorLocalBox(const Shape& global_shape,
                                    const std::vector<DTensorPlacement>& placements,
                                    const Shape& mesh_shape, int64_t world_size, int64_t rank);

// "Shard(0)", "(Replicate(), Shard(0))": placements as torch prints them, for messages.
std::string DescribePlacements(const std::vector<DTensorPlacement>& placements);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_DTENSOR_H_
