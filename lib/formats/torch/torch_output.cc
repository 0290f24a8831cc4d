#include "lib/formats/torch/torch_output.h"

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/core/status.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_archive_writer.h"
#include "lib/formats/torch/torch_format.h"

namespace reshard {

absl::StatusOr<std::string> PickledValueBytes(const StructureNode& node) {
  PickleWriter pickle;
  auto no_tensor = [](int) -> absl::Status { return absl::InternalError("no tensor is indexed"); };
  const absl::flat_hash_map<std::string, int> no_tensors;
  absl::Status status = PickleStructure(node, no_tensors, no_tensor, pickle);
  if (!status.ok() && status.code() == absl::StatusCode::kInternal) {
    return absl::InvalidArgumentError(
        absl::StrCat("the value holds a tensor, which a pickled value cannot: ", status.message()));
  }
  RETURN_IF_ERROR(status);
  return pickle.Finish();
}

OutputNaming TorchOutput::naming() const {
  OutputNaming naming;
  naming.shard_file = [](int index, int count) {
    if (count == 1) return std::string("pytorch_model.bin");
    return absl::StrFormat("pytorch_model-%05d-of-%05d.bin", index + 1, count);
  };
  naming.part_file = [](int rank, int) { return absl::StrCat("model_part-", rank, ".pt"); };
  return naming;
}

absl::StatusOr<FileFraming> TorchOutput::Frame(const OutputFileLayout& file) const {
  // torch names the top folder after the file (without its extension).
  std::string top = file.name.substr(file.name.rfind('/') + 1);
  top = top.substr(0, top.rfind('.'));
  for (char c : top) {
    if (static_cast<unsigned char>(c) >= 0x80 || c == '/') top = "archive";
  }
  // Storages: one per stored tensor, keys "0", "1", ... in file order; aliases share theirs.
  std::vector<std::string> keys(file.tensors.size());
  std::vector<int> stored;
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const OutputTensor& tensor = file.tensors[i];
    if (tensor.alias_of >= 0) continue;
    keys[i] = absl::StrCat(stored.size());
    stored.push_back(static_cast<int>(i));
  }
  PickleWriter pickle;
  auto write_tensor = [&](int index) -> absl::Status {
    const OutputTensor& tensor = file.tensors[index];
    const int owner = tensor.alias_of >= 0 ? tensor.alias_of : index;
    ASSIGN_OR_RETURN(std::string storage_class, TorchStorageClass(tensor.dtype, tensor.name));
    pickle.Tensor(storage_class, keys[owner], NumElementsUnchecked(tensor.shape()), tensor.shape(),
                  RowMajorStrides(tensor.shape()));
    return absl::OkStatus();
  };
  absl::flat_hash_map<std::string, int> tensor_index;
  for (size_t i = 0; i < file.tensors.size(); ++i) tensor_index[file.tensors[i].name] = i;
  if (file.structure != nullptr) {
    RETURN_IF_ERROR(PickleStructure(*file.structure, tensor_index, write_tensor, pickle),
                    file.name);
  } else {
    pickle.BeginDict(/*ordered=*/true);
    for (size_t i = 0; i < file.tensors.size(); ++i) {
      pickle.String(file.tensors[i].name);
      RETURN_IF_ERROR(write_tensor(static_cast<int>(i)), file.name);
    }
    pickle.EndDict();
  }
  std::vector<uint64_t> stored_bytes;
  for (int index : stored) stored_bytes.push_back(file.tensors[index].bytes());
  TorchArchiveFramer framer;
  framer.Add(top, pickle.Finish(), stored, stored_bytes);
  return framer.Finish();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TorchOutput::CompanionFiles(
    const TargetLayout& layout) const {
  std::vector<std::pair<std::string, std::string>> files;
  if (layout.kind != TargetLayout::Kind::kConsolidated || layout.files.size() < 2) return files;
  files.emplace_back(kTorchIndexName, HuggingFaceIndexJson(layout));
  return files;
}

namespace {
const OutputFormatRegistration<TorchOutput> register_output;
}  // namespace

}  // namespace reshard
