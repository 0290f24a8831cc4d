// Hand-written DCP `.metadata` pickles (protocol 4) shaped as torch writes them: dataclasses as
// NEWOBJ + BUILD, TensorProperties' 5-tuple state, torch.Size REDUCEs. Each fragment pushes
// exactly one value, so they compose by concatenation. Used by the `.metadata` reader's tests
// and by the fixture of the "torch-dcp" input format (dcp_fixture.cc, see
// lib/formats/format_fixture.h).
//
// testonly: nothing here is checked.

#ifndef RESHARD_LIB_FORMATS_DCP_DCP_FIXTURE_H_
#define RESHARD_LIB_FORMATS_DCP_DCP_FIXTURE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lib/formats/torch/torch_fixture.h"

namespace reshard {
namespace dcp_testing {

inline constexpr char kMd[] = "torch.distributed.checkpoint.metadata";
inline constexpr char kOldTp[] = "torch.distributed._shard.sharded_tensor.metadata";

std::string Str(const std::string& s);
std::string Int(int64_t v);
std::string None();
std::string Global(const std::string& module, const std::string& name);
std::string Tuple(const std::vector<std::string>& items);
std::string List(const std::vector<std::string>& items);
std::string Dict(const std::vector<std::pair<std::string, std::string>>& entries);
std::string Size(const std::vector<int64_t>& dims);
// A dataclass instance: cls.__new__(cls) then BUILD with `state` (omitted when empty).
std::string Object(const std::string& module, const std::string& name,
                   const std::string& state = "");
std::string Pickle(const std::string& value);

// TensorProperties as torch pickles it: the 5-tuple state of __getstate__.
std::string Properties(const std::string& dtype, const std::string& module = kOldTp);
std::string Chunk(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes);
std::string TensorMd(const std::string& properties, const std::vector<int64_t>& size,
                     const std::vector<std::string>& chunks);
std::string Index(const std::string& fqn, const std::vector<int64_t>* offsets, int64_t index);
std::string Info(const std::string& file, int64_t offset, int64_t length,
                 const std::string& transforms = "");
std::string Metadata(const std::string& sdm, const std::string& storage,
                     const std::string& planner = None());

// A torch.save archive of one bare tensor (`bytes` of `shape`, `numel` elements of the storage
// class, laid out by `strides`: row-major when empty), as DCP's FileSystemWriter writes a tensor
// item.
TorchSaveFile TensorItem(const std::string& storage_class, int64_t numel,
                         const std::vector<int64_t>& shape, const std::string& bytes,
                         std::vector<int64_t> strides = {});

}  // namespace dcp_testing
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DCP_DCP_FIXTURE_H_
