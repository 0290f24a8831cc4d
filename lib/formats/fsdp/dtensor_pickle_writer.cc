#include "lib/formats/fsdp/dtensor_pickle_writer.h"

namespace reshard {

void WritePickleIntTuple(PickleWriter& p, const std::vector<int64_t>& values) {
  p.BeginTuple();
  for (int64_t v : values) p.Int(v);
  p.EndTuple();
}

void WriteTorchSize(PickleWriter& p, const Shape& shape) {
  p.Global("torch", "Size");
  p.BeginTuple();
  WritePickleIntTuple(p, shape);
  p.EndTuple();
  p.Reduce();
}

void WritePickleObject(PickleWriter& p, const std::string& module, const std::string& name,
                       const std::function<void()>& state) {
  p.Global(module, name);
  p.BeginTuple();
  p.EndTuple();
  p.NewObj();
  state();
  p.Build();
}

void WriteStridedLayout(PickleWriter& p) {
  p.Global("torch.serialization", "_get_layout");
  p.BeginTuple();
  p.String("torch.strided");
  p.EndTuple();
  p.Reduce();
}

void WriteCudaDevice(PickleWriter& p, int64_t index) {
  p.Global("torch", "device");
  p.BeginTuple();
  p.String("cuda");
  p.Int(index);
  p.EndTuple();
  p.Reduce();
}

void BeginWrapperSubclass(PickleWriter& p, const std::string& module, const std::string& name,
                          const std::string& dtype, const Shape& shape, int64_t device) {
  p.Global("torch._tensor", "_rebuild_from_type_v2");
  p.BeginTuple();
  p.Global("torch._utils", "_rebuild_wrapper_subclass");
  p.Global(module, name);
  p.BeginTuple();
  p.Global(module, name);
  p.Global("torch", dtype);
  WriteTorchSize(p, shape);
  WritePickleIntTuple(p, RowMajorStrides(shape));
  p.Int(0);
  WriteStridedLayout(p);
  WriteCudaDevice(p, device);
  p.Bool(false);
  p.EndTuple();
}

namespace {

// A dataclass given `fields` (key, value, ...) as its state dict.
void Dataclass(PickleWriter& p, const std::string& module, const std::string& name,
               const std::function<void()>& fields) {
  WritePickleObject(p, module, name, [&] {
    p.BeginDict(false);
    fields();
    p.EndDict();
  });
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
  BeginWrapperSubclass(p, dtensor_module, "DTensor", d.dtype, d.global_shape, d.device);
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
    WriteTorchSize(p, d.meta_shape.empty() ? d.global_shape : d.meta_shape);
    WritePickleIntTuple(p, stride);
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
