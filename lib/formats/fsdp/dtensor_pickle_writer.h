// Writes DTensors into pickles as torch 2.x pickles them (dtensor.h's file comment), for tests
// and fixtures: torch 1.13, which the end-to-end tests run, has no DTensor class.
//
// testonly.

#ifndef RESHARD_LIB_FORMATS_FSDP_DTENSOR_PICKLE_WRITER_H_
#define RESHARD_LIB_FORMATS_FSDP_DTENSOR_PICKLE_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/formats/fsdp/dtensor.h"
#include "lib/formats/torch/pickle_writer.h"

namespace reshard {

// A DTensor as written: its global shape, placements and mesh, and the writer of its local
// tensor (a torch tensor of the rank's box, PickleWriter::Tensor).
struct DTensorToWrite {
  // torch >= 2.4 module paths (torch.distributed.tensor...), else those of torch 2.0 to 2.3.
  bool torch_24 = true;
  std::string dtype = "float32";  // a torch dtype global
  Shape global_shape;
  std::vector<DTensorPlacement> placements;
  // A placement class other than Shard / Replicate to write instead of placements[0] ("Partial").
  std::string other_placement;
  // Written as tensor_meta's shape (global_shape when empty).
  Shape meta_shape;
  int64_t device = 0;
  std::function<void(PickleWriter&)> local_tensor;
};

// Pieces of the pickles of torch's distributed classes, shared with the ShardedTensor writer:
// a tuple of ints; torch.Size(shape); cls.__new__(cls) given by BUILD the state `state` writes
// (an object as protocol 2 pickles it).
void WritePickleIntTuple(PickleWriter& p, const std::vector<int64_t>& values);
void WriteTorchSize(PickleWriter& p, const Shape& shape);
void WritePickleObject(PickleWriter& p, const std::string& module, const std::string& name,
                       const std::function<void()>& state);
// torch.strided as torch 2.x pickles it; torch.device("cuda", index).
void WriteStridedLayout(PickleWriter& p);
void WriteCudaDevice(PickleWriter& p, int64_t index);
// The start of Tensor.__reduce_ex__'s pickle of a wrapper tensor subclass `module`.`name`:
// _rebuild_from_type_v2, then its arguments up to the state: (_rebuild_wrapper_subclass, cls,
// (cls, dtype, size, stride, 0, layout, device, False). The caller writes the state, then
// EndTuple() and Reduce().
void BeginWrapperSubclass(PickleWriter& p, const std::string& module, const std::string& name,
                          const std::string& dtype, const Shape& shape, int64_t device);

// Writes `dtensor` into `p`: _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor,
// (DTensor, dtype, size, stride, 0, layout, device, False), (None, {"_local_tensor": ...,
// "_spec": DTensorSpec(mesh=None, placements, tensor_meta)})).
void WriteDTensor(PickleWriter& p, const DTensorToWrite& dtensor);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_DTENSOR_PICKLE_WRITER_H_
