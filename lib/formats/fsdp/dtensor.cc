#include "lib/formats/fsdp/dtensor.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;

// Module paths of the DTensor classes: torch 2.0-2.3 (torch.distributed._tensor), 2.4 on
// (torch.distributed.tensor, whose public classes set __module__ to the package).
constexpr const char* kDTensorModules[] = {
    "torch.distributed._tensor.api",
    "torch.distributed.tensor",
    "torch.distributed.tensor._api",
};
constexpr const char* kSpecModules[] = {
    "torch.distributed._tensor.placement_types",
    "torch.distributed.tensor._dtensor_spec",
    "torch.distributed._tensor._dtensor_spec",
};
constexpr const char* kPlacementModules[] = {
    "torch.distributed._tensor.placement_types",
    "torch.distributed.tensor.placement_types",
    "torch.distributed.tensor",
};
constexpr const char* kMeshModules[] = {
    "torch.distributed.device_mesh",
    "torch.distributed._tensor.device_mesh",
};

template <size_t N>
bool OneOf(const char* const (&modules)[N], const std::string& module) {
  for (const char* m : modules) {
    if (module == m) return true;
  }
  return false;
}

bool IsGlobalIn(const PickleValue* value, bool (*accept)(const std::string&),
                absl::string_view name) {
  return value != nullptr && value->kind == Kind::kGlobal && value->name == name &&
         accept(value->module);
}

bool IsDTensorModule(const std::string& m) { return OneOf(kDTensorModules, m); }
bool IsSpecModule(const std::string& m) { return OneOf(kSpecModules, m); }
bool IsPlacementModule(const std::string& m) { return OneOf(kPlacementModules, m); }
bool IsMeshModule(const std::string& m) { return OneOf(kMeshModules, m); }

bool IsDeviceMesh(const PickleValue* value) {
  return value != nullptr && value->kind == Kind::kObject &&
         IsGlobalIn(value->callable, IsMeshModule, "DeviceMesh");
}

// The value under `key` of a dict, or of an object state that is a dict or (dict or None,
// slots dict).
const PickleValue* StateField(const PickleValue* state, absl::string_view key) {
  if (state == nullptr) return nullptr;
  if (state->kind == Kind::kTuple && state->items.size() == 2) {
    for (const PickleValue* part : state->items) {
      if (const PickleValue* found = PickleField(part, key); found != nullptr) return found;
    }
    return nullptr;
  }
  return PickleField(state, key);
}

}  // namespace

const PickleValue* ObjectField(const PickleValue* object, absl::string_view key, size_t index) {
  if (object == nullptr || object->kind != Kind::kObject) return nullptr;
  if (const PickleValue* found = StateField(object->state, key); found != nullptr) return found;
  if (object->args != nullptr && object->args->kind == Kind::kTuple) {
    if (index < object->args->items.size()) return object->args->items[index];
  }
  return nullptr;
}

namespace {

struct GlobalCheck {
  const std::function<bool(const std::string&, const std::string&)>& allowed;
  absl::string_view allowed_text;
  const std::function<bool(const PickleValue*)>& opaque;
  absl::flat_hash_set<const PickleValue*> seen;

  absl::Status Check(const PickleValue* value, const std::string& where) {
    if (value == nullptr || !seen.insert(value).second) return absl::OkStatus();
    if (value->kind == Kind::kGlobal && !allowed(value->module, value->name)) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, "holds the Python global ", value->module, ".", value->name,
                       ", which is not part of ", allowed_text));
    }
    if (opaque && opaque(value)) return absl::OkStatus();
    RETURN_IF_ERROR(Check(value->callable, where));
    RETURN_IF_ERROR(Check(value->args, where));
    RETURN_IF_ERROR(Check(value->state, where));
    for (const PickleValue* item : value->items) RETURN_IF_ERROR(Check(item, where));
    for (const auto& [k, v] : value->entries) {
      RETURN_IF_ERROR(Check(k, where));
      RETURN_IF_ERROR(Check(v, where));
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<DTensorPlacement> ParsePlacement(const PickleValue* value, size_t index) {
  const PickleValue* cls =
      value != nullptr && value->kind == Kind::kObject ? value->callable : nullptr;
  if (IsGlobalIn(cls, IsPlacementModule, "Replicate")) return DTensorPlacement{};
  if (IsGlobalIn(cls, IsPlacementModule, "Shard")) {
    std::optional<int64_t> dim = PickleInt(ObjectField(value, "dim", 0));
    if (!dim.has_value()) {
      return absl::DataLossError(absl::StrCat("placement ", index, " is a Shard without a dim"));
    }
    return DTensorPlacement{true, *dim};
  }
  if (cls != nullptr && cls->kind == Kind::kGlobal) {
    return absl::UnimplementedError(absl::StrCat(
        "placement ", index, " is ", cls->name,
        ": only Shard and Replicate placements are read (a saved state dict holds no pending "
        "reduction)"));
  }
  return absl::DataLossError(
      absl::StrCat("placement ", index, " is a ", DescribePickleValue(value)));
}

}  // namespace

bool IsDTensorStateDictGlobal(const std::string& module, const std::string& name) {
  if (module == "torch._utils") {
    return name == "_rebuild_tensor_v2" || name == "_rebuild_tensor_v3" ||
           name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state" ||
           name == "_rebuild_wrapper_subclass";
  }
  if (module == "torch._tensor") return name == "_rebuild_from_type_v2";
  // torch.layout pickles as torch.serialization._get_layout("torch.strided").
  if (module == "torch.serialization") return name == "_get_layout";
  if (module == "torch") {
    return name == "Size" || name == "device" || name == "strided" ||
           name == "UntypedStorage" || TorchDType(name).has_value();
  }
  if (module == "collections") return name == "OrderedDict";
  if (IsDTensorModule(module) && name == "DTensor") return true;
  if (IsSpecModule(module) && (name == "DTensorSpec" || name == "TensorMeta")) return true;
  // Placements other than Shard and Replicate are known classes, refused where they are used.
  if (IsPlacementModule(module) && (name == "Shard" || name == "Replicate" || name == "Partial" ||
                                    name == "_Partial" || name == "_StridedShard")) {
    return true;
  }
  return IsMeshModule(module) && name == "DeviceMesh";
}

absl::Status CheckPickleGlobals(
    const PickleValue* root,
    const std::function<bool(const std::string&, const std::string&)>& allowed,
    absl::string_view allowed_text, const std::function<bool(const PickleValue*)>& opaque) {
  GlobalCheck check{allowed, allowed_text, opaque, {}};
  const auto* entries = PickleEntries(root);
  if (entries == nullptr) return check.Check(root, "the pickle ");
  for (const auto& [key, value] : *entries) {
    RETURN_IF_ERROR(check.Check(key, "a key of the state dict "));
    RETURN_IF_ERROR(check.Check(value, absl::StrCat("entry \"", PickleKeyName(key), "\" ")));
  }
  return absl::OkStatus();
}

absl::Status CheckDTensorStateDictGlobals(const PickleValue* root) {
  // Only the mesh tensor of a DeviceMesh is read; its other state (process group names) is
  // never interpreted.
  return CheckPickleGlobals(root, IsDTensorStateDictGlobal,
                            "a DTensor state dict (allowed: tensor rebuild functions, torch "
                            "dtypes, devices and sizes, DTensor, DTensorSpec, TensorMeta, "
                            "placements, DeviceMesh)",
                            IsDeviceMesh);
}

absl::StatusOr<std::optional<DTensorValue>> ParseDTensor(const PickleValue* value) {
  if (value == nullptr || !value->IsObjectOf("torch._tensor", "_rebuild_from_type_v2") ||
      value->args == nullptr || value->args->kind != Kind::kTuple ||
      value->args->items.size() != 4 ||
      !IsGlobalIn(value->args->items[1], IsDTensorModule, "DTensor")) {
    return std::nullopt;
  }
  const std::vector<PickleValue*>& rebuild = value->args->items;
  if (!rebuild[0]->IsGlobal("torch._utils", "_rebuild_wrapper_subclass")) {
    return absl::DataLossError(absl::StrCat("a DTensor rebuilt by ",
                                            DescribePickleValue(rebuild[0]),
                                            " rather than torch._utils._rebuild_wrapper_subclass"));
  }
  // (cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
  const PickleValue* wrapper = rebuild[2];
  if (wrapper->kind != Kind::kTuple || wrapper->items.size() < 3) {
    return absl::DataLossError(absl::StrCat("a DTensor's wrapper arguments are a ",
                                            DescribePickleValue(wrapper)));
  }
  DTensorValue out;
  const PickleValue* dtype = wrapper->items[1];
  std::optional<DType> parsed_dtype =
      dtype->kind == Kind::kGlobal && dtype->module == "torch" ? TorchDType(dtype->name)
                                                               : std::nullopt;
  if (!parsed_dtype.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat("a DTensor of dtype ", DescribePickleValue(dtype), " is not supported"));
  }
  out.dtype = *parsed_dtype;
  std::optional<std::vector<int64_t>> size = PickleShape(wrapper->items[2]);
  if (!size.has_value()) {
    return absl::DataLossError(
        absl::StrCat("a DTensor's size is a ", DescribePickleValue(wrapper->items[2])));
  }
  out.global_shape = *size;

  const PickleValue* state = rebuild[3];
  out.local_tensor = StateField(state, "_local_tensor");
  const PickleValue* spec = StateField(state, "_spec");
  if (out.local_tensor == nullptr || spec == nullptr) {
    return absl::DataLossError(
        "a DTensor's state lacks _local_tensor or _spec (torch pickles both, as __slots__)");
  }
  if (spec->kind != Kind::kObject || !IsGlobalIn(spec->callable, IsSpecModule, "DTensorSpec")) {
    return absl::DataLossError(
        absl::StrCat("a DTensor's _spec is a ", DescribePickleValue(spec), ", not a DTensorSpec"));
  }
  const PickleValue* placements = ObjectField(spec, "placements", 1);
  const std::vector<PickleValue*>* items = PickleItems(placements);
  if (items == nullptr || items->empty()) {
    return absl::DataLossError("a DTensorSpec without placements");
  }
  for (size_t i = 0; i < items->size(); ++i) {
    ASSIGN_OR_RETURN(DTensorPlacement placement, ParsePlacement((*items)[i], i));
    if (placement.shard &&
        (placement.dim < 0 || placement.dim >= static_cast<int64_t>(out.global_shape.size()))) {
      return absl::DataLossError(absl::StrCat("placement ", i, " is Shard(", placement.dim,
                                              ") of a tensor of ", out.global_shape.size(),
                                              " dimensions"));
    }
    out.placements.push_back(placement);
  }
  const PickleValue* meta = ObjectField(spec, "tensor_meta", 2);
  if (meta != nullptr && meta->kind != Kind::kNone) {
    std::optional<std::vector<int64_t>> shape = PickleShape(ObjectField(meta, "shape", 0));
    if (!shape.has_value() || *shape != out.global_shape) {
      return absl::DataLossError(
          absl::StrCat("the DTensorSpec's tensor_meta shape ",
                       shape.has_value() ? ShapeToString(*shape) : "is missing", " and the size ",
                       ShapeToString(out.global_shape), " differ"));
    }
  }
  const PickleValue* mesh = ObjectField(spec, "mesh", 0);
  if (IsDeviceMesh(mesh)) out.mesh_tensor = PickleField(mesh, "mesh");
  return out;
}

absl::StatusOr<Box> DTensorLocalBox(const Shape& global_shape,
                                    const std::vector<DTensorPlacement>& placements,
                                    const Shape& mesh_shape, int64_t world_size, int64_t rank) {
  if (mesh_shape.size() != placements.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(placements.size(), " placements ", DescribePlacements(placements),
                     " on a device mesh of shape ", ShapeToString(mesh_shape)));
  }
  int64_t devices = 1;
  for (int64_t extent : mesh_shape) {
    if (extent <= 0 || extent > world_size) {
      return absl::InvalidArgumentError(absl::StrCat("device mesh of shape ",
                                                     ShapeToString(mesh_shape), " for world size ",
                                                     world_size));
    }
    devices *= extent;
  }
  if (devices != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("the device mesh of shape ",
                                                   ShapeToString(mesh_shape), " holds ", devices,
                                                   " ranks, the save ", world_size));
  }
  Box box = Box::Full(global_shape);
  // Row-major coordinates of `rank` on the mesh.
  std::vector<int64_t> coordinate(mesh_shape.size());
  int64_t rest = rank;
  for (size_t i = mesh_shape.size(); i-- > 0;) {
    coordinate[i] = rest % mesh_shape[i];
    rest /= mesh_shape[i];
  }
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].shard) continue;
    const size_t d = static_cast<size_t>(placements[i].dim);
    const int64_t extent = box.extent[d];
    const int64_t n = mesh_shape[i];
    const int64_t chunk = (extent + n - 1) / n;  // torch.chunk's chunk size
    const int64_t begin = std::min(extent, coordinate[i] * chunk);
    const int64_t end = std::min(extent, begin + chunk);
    box.origin[d] += begin;
    box.extent[d] = end - begin;
  }
  return box;
}

std::string DescribePlacements(const std::vector<DTensorPlacement>& placements) {
  std::vector<std::string> parts;
  for (const DTensorPlacement& p : placements) {
    parts.push_back(p.shard ? absl::StrCat("Shard(", p.dim, ")") : "Replicate()");
  }
  if (parts.size() == 1) return parts[0];
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

}  // namespace reshard
