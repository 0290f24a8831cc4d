#include "lib/formats/deepspeed/zero_catalog_builder.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {
namespace zero_internal {

absl::Status Corrupt(const TorchArchive& archive, absl::string_view message) {
  return absl::DataLossError(absl::StrCat(archive.path(), ": ", message));
}

int ZeroCatalogBuilder::FileIndex(const TorchArchive& archive) {
  auto [it, inserted] = file_index_.try_emplace(archive.path(), catalog_.files.size());
  if (inserted) catalog_.files.push_back(archive.Source());
  return it->second;
}

absl::Status ZeroCatalogBuilder::Add(CatalogTensor tensor) {
  if (index_.contains(tensor.name)) {
    return absl::DataLossError(absl::StrCat(dir_, ": \"", tensor.name,
                                            "\" is both a buffer, a frozen or a trainable "
                                            "param, or an optimizer moment: named twice"));
  }
  index_[tensor.name] = static_cast<int>(catalog_.tensors.size());
  catalog_.tensors.push_back(std::move(tensor));
  return absl::OkStatus();
}

int ZeroCatalogBuilder::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

absl::StatusOr<CatalogTensor> ZeroCatalogBuilder::WholeTensor(const TorchArchive& archive,
                                                              const PickleValue* value,
                                                              const std::string& name,
                                                              const std::string& what) {
  ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive.Tensor(value, what));
  if (!location.has_value()) {
    return Corrupt(archive,
                   absl::StrCat(what, " is ", DescribePickleValue(value), ", not a tensor"));
  }
  return CatalogTensorAt(name, *std::move(location), FileIndex(archive));
}

}  // namespace zero_internal
}  // namespace reshard
