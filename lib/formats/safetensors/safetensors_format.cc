#include "lib/formats/safetensors/safetensors_format.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "lib/formats/folder_model.h"
#include "lib/io/file_access.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Reads one file's header into a Catalog of its own.
absl::StatusOr<FileCatalog> ReadOne(const std::string& dir, const std::string& name) {
  FileCatalog file;
  file.name = name;
  const std::string path = dir.empty() ? name : absl::StrCat(dir, "/", name);
  uint64_t size = 0;
  std::string version;
  ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(path, &size, &version));
  file.catalog.format = SafetensorsInput::kId;
  file.catalog.metadata = header.metadata;
  AddSafetensorsFileToCatalog(path, size, version, header, file.catalog);
  return file;
}

absl::StatusOr<InputModel> ReadIndexedFolder(const std::string& dir) {
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexName);
  return ReadIndexedFolder(SafetensorsInput::kId, dir, index_path, ReadOne);
}

absl::StatusOr<InputModel> ReadPlainFolder(const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir, {".safetensors"}));
  ASSIGN_OR_RETURN(std::vector<FileCatalog> files, ReadFolderFiles(dir, names, ReadOne));
  return AssembleFolder(SafetensorsInput::kId, dir, std::move(files));
}

}  // namespace

void AddSafetensorsFileToCatalog(const std::string& path, uint64_t file_size,
                                 const std::string& version, const SafetensorsHeader& header,
                                 Catalog& catalog) {
  const int file_index = static_cast<int>(catalog.files.size());
  catalog.files.push_back(SourceFile{path, file_size, {}, version});
  for (const SafetensorsTensorEntry& entry : header.tensors) {
    CatalogTensor tensor{entry.name, entry.dtype, entry.shape, {}};
    SourcePiece piece;
    piece.file = file_index;
    piece.byte_offset = header.data_start + entry.begin;
    piece.box = Box::Full(entry.shape);
    piece.strides = RowMajorStrides(entry.shape);
    tensor.pieces.push_back(std::move(piece));
    catalog.tensors.push_back(std::move(tensor));
  }
}

absl::StatusOr<bool> SafetensorsInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (folder) {
    ASSIGN_OR_RETURN(const bool indexed,
                     CheckInputExists(absl::StrCat(path, "/", kSafetensorsIndexName)));
    if (indexed) return true;
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(path, {".safetensors"}));
    return !names.empty();
  }
  if (absl::EndsWith(path, ".safetensors")) return true;
  // A file with another name: accept it when its length prefix and first JSON byte fit.
  absl::StatusOr<std::string> prefix = ReadFilePrefix(path, 9);
  if (absl::IsNotFound(prefix.status())) return false;
  if (!prefix.ok()) return prefix.status();
  if (prefix->size() < 9) return false;
  const uint64_t length = absl::little_endian::Load64(prefix->data());
  return length <= kSafetensorsMaxHeaderBytes && (*prefix)[8] == '{';
}

// Tensors a writer stored once under another name (`__metadata__` maps the missing name to a
// stored one, as huggingface_hub and reshard write tied weights) become names of that data.
void RestoreTiedAliases(Catalog& catalog) {
  catalog.Reindex();
  for (const auto& [alias, original] : catalog.metadata) {
    const int stored = catalog.Find(original);
    if (stored < 0 || catalog.Find(alias) >= 0 || alias.rfind("reshard_", 0) == 0) continue;
    CatalogTensor copy = catalog.tensors[stored];
    copy.name = alias;
    catalog.tensors.push_back(std::move(copy));
    catalog.Reindex();
  }
}

absl::StatusOr<InputModel> SafetensorsInput::Read(const std::string& path,
                                                  const ReadOptions& /*options*/) const {
  ASSIGN_OR_RETURN(InputModel model, ReadWithoutAliases(path));
  for (Catalog& part : model.parts) {
    RestoreTiedAliases(part);
    // The nesting of a torch checkpoint this file was converted from, when it was carried.
    auto carried = part.metadata.find(kStructureMetadataKey);
    if (carried != part.metadata.end()) {
      auto structure = StructureFromJson(carried->second);
      if (!structure.ok()) {
        return Annotate(structure.status(),
                        absl::StrCat(path, ": __metadata__ \"", kStructureMetadataKey, "\""));
      }
      part.structure = std::make_shared<const StructureNode>(*std::move(structure));
      part.metadata.erase(carried);
    }
  }
  return model;
}

absl::StatusOr<InputModel> SafetensorsInput::ReadWithoutAliases(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (folder) {
    ASSIGN_OR_RETURN(const bool indexed,
                     CheckInputExists(absl::StrCat(path, "/", kSafetensorsIndexName)));
    return indexed ? ReadIndexedFolder(path) : ReadPlainFolder(path);
  }
  ASSIGN_OR_RETURN(FileCatalog file, ReadOne("", path));
  InputModel model;
  model.format = kId;
  model.arrangement = "single-file";
  file.catalog.Reindex();
  model.parts.push_back(std::move(file.catalog));
  model.part_names.push_back(path);
  return model;
}

absl::StatusOr<std::string> EncodeSafetensorsHeader(
    const std::vector<SafetensorsTensorEntry>& tensors,
    const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  for (const SafetensorsTensorEntry& entry : tensors) {
    OrderedJson tensor = OrderedJson::object();
    tensor["dtype"] = std::string(DTypeName(entry.dtype));
    tensor["shape"] = entry.shape;
    tensor["data_offsets"] = {entry.begin, entry.end};
    header[entry.name] = std::move(tensor);
  }
  std::string json;
  try {
    json = header.dump(-1, ' ', false, OrderedJson::error_handler_t::strict);
  } catch (const OrderedJson::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot encode a safetensors header (tensor or metadata names must be "
                     "UTF-8): ",
                     e.what()));
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kSafetensorsMaxHeaderBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "safetensors header would be ", json.size(), " bytes, over the format's limit of ",
        kSafetensorsMaxHeaderBytes, "; use a smaller --max-shard-size"));
  }
  std::string encoded(8, '\0');
  absl::little_endian::Store64(encoded.data(), json.size());
  encoded += json;
  return encoded;
}

OutputNaming SafetensorsOutput::naming() const {
  OutputNaming naming;
  naming.shard_file = [](int index, int count) {
    if (count == 1) return std::string("model.safetensors");
    return absl::StrFormat("model-%05d-of-%05d.safetensors", index + 1, count);
  };
  naming.part_file = [](int rank, int) {
    return absl::StrCat("model_part-", rank, ".safetensors");
  };
  return naming;
}

absl::StatusOr<FileFraming> SafetensorsOutput::Frame(const OutputFileLayout& file) const {
  // Tied aliases are not stored: `__metadata__` maps each to the tensor holding its data, as
  // huggingface_hub records the names it drops.
  std::map<std::string, std::string> metadata = file.metadata;
  std::vector<int> order;
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    const OutputTensor& tensor = file.tensors[i];
    if (tensor.alias_of >= 0) {
      metadata[tensor.name] = file.tensors[tensor.alias_of].name;
    } else {
      order.push_back(static_cast<int>(i));
    }
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const OutputTensor& x = file.tensors[a];
    const OutputTensor& y = file.tensors[b];
    if (x.dtype != y.dtype) return DTypeSortRank(x.dtype) > DTypeSortRank(y.dtype);
    return x.name < y.name;
  });
  std::vector<SafetensorsTensorEntry> entries;
  uint64_t offset = 0;
  absl::flat_hash_map<std::string, int> seen;
  for (int index : order) {
    const OutputTensor& tensor = file.tensors[index];
    if (!seen.emplace(tensor.name, index).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.name, ": tensor name \"", tensor.name, "\" appears twice"));
    }
    entries.push_back({tensor.name, tensor.dtype, tensor.shape(), offset, offset + tensor.bytes()});
    offset += tensor.bytes();
  }
  metadata["format"] = "pt";
  if (file.structure != nullptr) metadata[kStructureMetadataKey] = StructureToJson(*file.structure);
  ASSIGN_OR_RETURN(std::string header, EncodeSafetensorsHeader(entries, metadata), file.name);
  FileFraming framing;
  framing.segments.push_back({FramingSegment::Kind::kBytes, std::move(header), -1});
  for (int index : order) framing.segments.push_back({FramingSegment::Kind::kTensor, "", index});
  return framing;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> SafetensorsOutput::CompanionFiles(
    const TargetLayout& layout) const {
  std::vector<std::pair<std::string, std::string>> files;
  if (layout.kind != TargetLayout::Kind::kConsolidated || layout.files.size() < 2) return files;
  files.emplace_back(kSafetensorsIndexName, HuggingFaceIndexJson(layout));
  return files;
}

namespace {
const InputFormatRegistration<SafetensorsInput> register_input;
const OutputFormatRegistration<SafetensorsOutput> register_output;
}  // namespace

}  // namespace reshard
