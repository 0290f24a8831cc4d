// The Catalog a DeepSpeed reader builds: files added as their archives are first used, tensors
// added once by name, whole tensors of model-states files as one piece each. Shared by the
// ZeRO-1/2/3 reader and the reader of DeepSpeed without ZeRO.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_CATALOG_BUILDER_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_CATALOG_BUILDER_H_

#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/formats/deepspeed/zero_locate.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace zero_internal {

// DataLoss "<archive path>: <message>": a file whose contents are not what DeepSpeed writes.
absl::Status Corrupt(const TorchArchive& archive, absl::string_view message);

class ZeroCatalogBuilder {
 public:
  // `dir` (the checkpoint folder) names the checkpoint in messages.
  explicit ZeroCatalogBuilder(std::string dir) : dir_(std::move(dir)) {}

  // The index of `archive`'s file in the catalog, added on first use.
  int FileIndex(const TorchArchive& archive);

  // Appends `tensor`; DataLoss when its name is already taken.
  absl::Status Add(CatalogTensor tensor);

  // The index of tensor `name` in catalog().tensors, or -1.
  int Find(absl::string_view name) const;

  // A whole tensor of a model-states file (`value`, described by `what` in messages) as one
  // piece named `name`; DataLoss when `value` is not a tensor.
  absl::StatusOr<CatalogTensor> WholeTensor(const TorchArchive& archive, const PickleValue* value,
                                            const std::string& name, const std::string& what);

  // A 1-D contiguous float32 tensor of an optimizer file (a rank's flat group or flat moment;
  // `what` names it in messages) in `archive`'s file; DataLoss when `value` is missing or is
  // another kind of tensor.
  absl::StatusOr<FlatTensor> Flat(const TorchArchive& archive, const PickleValue* value,
                                  const std::string& what);

  // Adds the tensors of state dict `dict` of `archive` under their keys, in its order. `what`
  // names the dict in messages (`what["key"]`) and prefixes the other_entries that note its
  // non-tensor values ("<what>.<key>: ..."); values holding tensors deeper are refused
  // (Unimplemented), keys that are not names are DataLoss. `check` (may be empty) vets each
  // tensor's key before it is added.
  absl::Status AddStateDict(const TorchArchive& archive, const PickleValue* dict,
                            absl::string_view what,
                            const std::function<absl::Status(const std::string&)>& check);

  // The catalog so far. Tensors added through it directly must keep names unique (Add does).
  Catalog& catalog() { return catalog_; }

 private:
  std::string dir_;
  Catalog catalog_;
  absl::flat_hash_map<std::string, int> index_;       // tensor name -> index
  absl::flat_hash_map<std::string, int> file_index_;  // archive path -> file index
};

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_CATALOG_BUILDER_H_
