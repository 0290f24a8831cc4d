#include "lib/formats/fsdp/dtensor_pickle_writer.h"

namespace reshard {
namespace {

void IntTuple(PickleWriter& p, const std::vector<int64_t>& values) {
  p.BeginTuple();
  for (int64_t v : values) p.Int(v);
  p.EndTuple();
}

void Size(PickleWriter& p, const Shape& shape) {
  p.Global("torch", "Size");
  p.BeginTuple();
  IntTuple(p, shape);
  p.EndTuple();
  p.Reduce();
}

// cls() given `fields` by BUILD: a dataclass as protocol 2 pickles it.
void Dataclass(PickleWriter& p, const std::string& module, const std::string& name,
               const std::function<void()>& fields) {
  p.Global(module, name);
  p.BeginTuple();
  p.EndTuple();
  p.NewObj();
  p.BeginDict(false);
  fields();
  p.EndDict();
  p.Build();
}

}  // namespace

void WriteDTensor(PickleWriter& p, const DTensorToWrite& d) {
  const std::string dtensor_module =
      d.torch_24 ? "torch.distributed.tensor" : "torch.distributed._tensor.api";
  const std::string spec_module = d.torch_24 ? "torch.distributed.tensor._dtensor_spec"
                                             : "torch.distributed._tensor.placement_types";
  const std::string placement_module = d.torch_24 ? "torch.distributed.tensor.placement_types"
                                                  : "torch.distributed._tensor.placement_types";
  const std::vector<int64_t> stride = RowMajorStrides(d.global_shape);
  p.Global("torch._tensor", "_rebuild_from_type_v2");
  p.BeginTuple();
  p.Global("torch._utils", "_rebuild_wrapper_subclass");
  p.Global(dtensor_module, "DTensor");
  p.BeginTuple();
  p.Global(dtensor_module, "DTensor");
  p.Global("torch", d.dtype);
  Size(p, d.global_shape);
  IntTuple(p, stride);
  p.Int(0);
  p.Global("torch.serialization", "_get_layout");
  p.BeginTuple();
  p.String("torch.strided");
  p.EndTuple();
  p.Reduce();
  p.Global("torch", "device");
  p.BeginTuple();
  p.String("cuda");
  p.Int(d.device);
  p.EndTuple();
  p.Reduce();
  p.Bool(false);
  p.EndTuple();
  // (None, slots)
  p.BeginTuple();
  p.None();
  p.BeginDict(false);
  p.String("_local_tensor");
  d.local_tensor(p);
  p.String("_spec");
  Dataclass(p, spec_module, "DTensorSpec", [&] {
    p.String("mesh");
    p.None();
    p.String("placements");
    p.BeginTuple();
    for (size_t i = 0; i < d.placements.size(); ++i) {
      const DTensorPlacement& placement = d.placements[i];
      if (i == 0 && !d.other_placement.empty()) {
        Dataclass(p, placement_module, d.other_placement, [] {});
      } else if (placement.shard) {
        Dataclass(p, placement_module, "Shard", [&] {
          p.String("dim");
          p.Int(placement.dim);
        });
      } else {
        Dataclass(p, placement_module, "Replicate", [] {});
      }
    }
    p.EndTuple();
    p.String("tensor_meta");
    // TensorMeta(shape, stride, dtype): a NamedTuple, cls.__new__(cls, *fields).
    p.Global(spec_module, "TensorMeta");
    p.BeginTuple();
    Size(p, d.meta_shape.empty() ? d.global_shape : d.meta_shape);
    IntTuple(p, stride);
    p.Global("torch", d.dtype);
    p.EndTuple();
    p.NewObj();
  });
  p.EndDict();
  p.EndTuple();
  p.EndTuple();
  p.Reduce();
}

}  // namespace reshard
