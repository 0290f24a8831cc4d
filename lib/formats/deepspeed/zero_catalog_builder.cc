#include "lib/formats/deepspeed/zero_catalog_builder.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/core/status.h"

namespace reshard {
namespace zero_internal {
namespace {

// Whether `value` holds a tensor somewhere (bounded like the torch reader's walk).
bool ContainsTensor(const PickleValue* value, int depth, uint64_t& budget) {
  if (value == nullptr || depth > 64 || budget == 0) return false;
  --budget;
  if (TorchArchive::IsTensor(value)) return true;
  for (const PickleValue* item : value->items) {
    if (ContainsTensor(item, depth + 1, budget)) return true;
  }
  for (const auto& [key, item] : value->entries) {
    if (ContainsTensor(item, depth + 1, budget)) return true;
  }
  return value->state != nullptr && ContainsTensor(value->state, depth + 1, budget);
}

}  // namespace

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

absl::StatusOr<FlatTensor> ZeroCatalogBuilder::Flat(const TorchArchive& archive,
                                                    const PickleValue* value,
                                                    const std::string& what) {
  if (value == nullptr) return Corrupt(archive, absl::StrCat(what, " is missing"));
  ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive.Tensor(value, what));
  if (!location.has_value()) {
    return Corrupt(archive,
                   absl::StrCat(what, " is ", DescribePickleValue(value), ", not a tensor"));
  }
  if (location->dtype != DType::kF32 || location->shape.size() != 1 ||
      (location->shape[0] > 1 && location->strides[0] != 1)) {
    return Corrupt(archive, absl::StrCat(what, " is a ", DTypeName(location->dtype),
                                         " tensor of shape ", ShapeToString(location->shape),
                                         " strides ", ShapeToString(location->strides),
                                         "; expected a 1-D contiguous float32 tensor"));
  }
  return FlatTensor{FileIndex(archive), location->byte_offset, location->shape[0]};
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

absl::Status ZeroCatalogBuilder::AddStateDict(
    const TorchArchive& archive, const PickleValue* dict, absl::string_view what,
    const std::function<absl::Status(const std::string&)>& check) {
  const auto* entries = PickleEntries(dict);
  if (entries == nullptr) return absl::OkStatus();
  FileIndex(archive);
  uint64_t budget = 4 * archive.pickle_values() + 4096;
  for (const auto& [key, value] : *entries) {
    std::optional<std::string> name = PickleString(key);
    if (!name.has_value() || name->empty()) {
      return Corrupt(archive, absl::StrCat("`", what, "` has a key that is ",
                                           DescribePickleValue(key), ", not a name"));
    }
    if (!TorchArchive::IsTensor(value)) {
      if (ContainsTensor(value, 0, budget)) {
        return absl::UnimplementedError(absl::StrCat(
            archive.path(), ": ", what, "[\"", *name, "\"] is ", DescribePickleValue(value),
            " holding tensors; expected a flat state dict of tensors"));
      }
      catalog_.other_entries.push_back(
          absl::StrCat(what, ".", *name, ": ", DescribePickleValue(value), " (not carried)"));
      continue;
    }
    if (check) RETURN_IF_ERROR(check(*name));
    ASSIGN_OR_RETURN(CatalogTensor tensor,
                     WholeTensor(archive, value, *name, absl::StrCat(what, "[\"", *name, "\"]")));
    RETURN_IF_ERROR(Add(std::move(tensor)));
  }
  return absl::OkStatus();
}

}  // namespace zero_internal
}  // namespace reshard
