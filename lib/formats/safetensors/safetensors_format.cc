#include "lib/formats/safetensors/safetensors_format.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr uint64_t kMaxIndexBytes = 256u << 20;

// "a2" < "a10": digits compare as numbers, so part and shard files sort in rank order.
bool NaturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i_end = i, j_end = j;
      while (i_end < a.size() && std::isdigit(static_cast<unsigned char>(a[i_end]))) ++i_end;
      while (j_end < b.size() && std::isdigit(static_cast<unsigned char>(b[j_end]))) ++j_end;
      absl::string_view x(a.data() + i, i_end - i), y(b.data() + j, j_end - j);
      while (x.size() > 1 && x[0] == '0') x.remove_prefix(1);
      while (y.size() > 1 && y[0] == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = i_end;
      j = j_end;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

std::vector<std::string> ListSafetensorsFiles(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file(error) && absl::EndsWith(name, ".safetensors") && name[0] != '.') {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end(), NaturalLess);
  return names;
}

struct FileHeader {
  std::string name;
  std::string path;
  uint64_t size = 0;
  SafetensorsHeader header;
};

absl::StatusOr<FileHeader> ReadOne(const std::string& dir, const std::string& name) {
  FileHeader file;
  file.name = name;
  file.path = dir.empty() ? name : absl::StrCat(dir, "/", name);
  ASSIGN_OR_RETURN(file.header, ReadSafetensorsHeader(file.path, &file.size));
  return file;
}

absl::StatusOr<InputModel> ReadIndexedFolder(const std::string& dir) {
  const std::string index_path = absl::StrCat(dir, "/", kSafetensorsIndexName);
  std::error_code error;
  const uint64_t index_size = fs::file_size(index_path, error);
  if (error) return absl::NotFoundError(absl::StrCat("cannot read ", index_path));
  if (index_size > kMaxIndexBytes) {
    return absl::DataLossError(absl::StrCat(index_path, ": index is larger than 256 MiB"));
  }
  std::ifstream in(index_path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  Json index;
  try {
    index = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(index_path, ": invalid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::DataLossError(absl::StrCat(index_path, ": no \"weight_map\" object"));
  }
  // File names in index order of first appearance, validated to stay inside the folder.
  std::vector<std::string> file_names;
  absl::flat_hash_map<std::string, std::string> file_of;  // tensor -> file
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": weight_map entry \"", it.key(), "\" is not a file name"));
    }
    const std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == ".." ||
        file.find('\0') != std::string::npos) {
      return absl::DataLossError(absl::StrCat(index_path, ": weight_map entry \"", it.key(),
                                              "\" names \"", file,
                                              "\", which is not a file in the index's folder"));
    }
    if (std::find(file_names.begin(), file_names.end(), file) == file_names.end()) {
      file_names.push_back(file);
    }
    file_of[it.key()] = file;
  }
  std::sort(file_names.begin(), file_names.end(), NaturalLess);
  InputModel model;
  model.format = SafetensorsInput::kId;
  model.layout = "sharded";
  Catalog catalog;
  catalog.format = SafetensorsInput::kId;
  size_t listed_found = 0;
  for (const std::string& name : file_names) {
    if (!fs::exists(absl::StrCat(dir, "/", name), error)) {
      return absl::NotFoundError(
          absl::StrCat(index_path, " lists ", name, ", which does not exist in ", dir));
    }
    ASSIGN_OR_RETURN(FileHeader file, ReadOne(dir, name));
    for (const SafetensorsTensorEntry& entry : file.header.tensors) {
      auto it = file_of.find(entry.name);
      if (it == file_of.end()) {
        return absl::DataLossError(
            absl::StrCat(file.path, ": tensor \"", entry.name, "\" is not listed in ", index_path));
      }
      if (it->second != name) {
        return absl::DataLossError(absl::StrCat(file.path, ": tensor \"", entry.name,
                                                "\" is mapped to ", it->second, " by ",
                                                index_path));
      }
      ++listed_found;
    }
    for (const auto& [key, value] : file.header.metadata) catalog.metadata.emplace(key, value);
    AddSafetensorsFileToCatalog(file.path, file.size, file.header, catalog);
  }
  if (listed_found != file_of.size()) {
    catalog.Reindex();
    for (const auto& [tensor, file] : file_of) {
      if (catalog.Find(tensor) < 0) {
        return absl::DataLossError(absl::StrCat(index_path, " maps tensor \"", tensor, "\" to ",
                                                file, ", which does not hold it"));
      }
    }
  }
  catalog.Reindex();
  model.parts.push_back(std::move(catalog));
  model.part_names.push_back(dir);
  return model;
}

absl::StatusOr<InputModel> ReadPlainFolder(const std::string& dir) {
  std::vector<std::string> names = ListSafetensorsFiles(dir);
  if (names.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " holds no .safetensors files"));
  }
  std::vector<FileHeader> files;
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(FileHeader file, ReadOne(dir, name));
    files.push_back(std::move(file));
  }
  InputModel model;
  model.format = SafetensorsInput::kId;
  auto names_of = [](const FileHeader& file) {
    std::vector<std::string> result;
    for (const auto& entry : file.header.tensors) result.push_back(entry.name);
    std::sort(result.begin(), result.end());
    return result;
  };
  const std::vector<std::string> first_names = names_of(files[0]);
  bool all_same = files.size() > 1 && !first_names.empty();
  for (size_t i = 1; i < files.size() && all_same; ++i)
    all_same = names_of(files[i]) == first_names;
  if (all_same) {
    model.layout = "model-parallel-parts";
    for (const FileHeader& file : files) {
      Catalog part;
      part.format = SafetensorsInput::kId;
      part.metadata = file.header.metadata;
      AddSafetensorsFileToCatalog(file.path, file.size, file.header, part);
      part.Reindex();
      model.parts.push_back(std::move(part));
      model.part_names.push_back(file.path);
    }
    return model;
  }
  // Otherwise the files must be disjoint shards of one model.
  model.layout = files.size() == 1 ? "single-file" : "sharded";
  Catalog catalog;
  catalog.format = SafetensorsInput::kId;
  absl::flat_hash_map<std::string, std::string> owner;
  for (const FileHeader& file : files) {
    for (const auto& entry : file.header.tensors) {
      auto [it, inserted] = owner.emplace(entry.name, file.name);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, ": tensor \"", entry.name, "\" is in both ", it->second, " and ", file.name,
            ", but the files do not all hold the same tensors: they are neither shards of one "
            "model nor model-parallel parts"));
      }
    }
    for (const auto& [key, value] : file.header.metadata) catalog.metadata.emplace(key, value);
    AddSafetensorsFileToCatalog(file.path, file.size, file.header, catalog);
  }
  catalog.Reindex();
  model.parts.push_back(std::move(catalog));
  model.part_names.push_back(dir);
  return model;
}

}  // namespace

void AddSafetensorsFileToCatalog(const std::string& path, uint64_t file_size,
                                 const SafetensorsHeader& header, Catalog& catalog) {
  const int file_index = static_cast<int>(catalog.files.size());
  catalog.files.push_back(SourceFile{path, file_size});
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

bool SafetensorsInput::Probe(const std::string& path) const {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    return fs::exists(absl::StrCat(path, "/", kSafetensorsIndexName), error) ||
           !ListSafetensorsFiles(path).empty();
  }
  if (absl::EndsWith(path, ".safetensors")) return true;
  // A file with another name: accept it when its length prefix and first JSON byte fit.
  std::ifstream in(path, std::ios::binary);
  char prefix[9] = {};
  if (!in.read(prefix, 9)) return false;
  const uint64_t length = absl::little_endian::Load64(prefix);
  return length <= kSafetensorsMaxHeaderBytes && prefix[8] == '{';
}

absl::StatusOr<InputModel> SafetensorsInput::Read(const std::string& path) const {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    if (fs::exists(absl::StrCat(path, "/", kSafetensorsIndexName), error)) {
      return ReadIndexedFolder(path);
    }
    return ReadPlainFolder(path);
  }
  ASSIGN_OR_RETURN(FileHeader file, ReadOne("", path));
  InputModel model;
  model.format = kId;
  model.layout = "single-file";
  Catalog catalog;
  catalog.format = kId;
  catalog.metadata = file.header.metadata;
  AddSafetensorsFileToCatalog(file.path, file.size, file.header, catalog);
  catalog.Reindex();
  model.parts.push_back(std::move(catalog));
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
  std::vector<int> order(file.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
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
    entries.push_back(
        {tensor.name, tensor.dtype, tensor.region.extent, offset, offset + tensor.bytes()});
    offset += tensor.bytes();
  }
  std::map<std::string, std::string> metadata = file.metadata;
  metadata["format"] = "pt";
  auto header = EncodeSafetensorsHeader(entries, metadata);
  if (!header.ok()) return Annotate(header.status(), file.name);
  FileFraming framing;
  framing.segments.push_back({FramingSegment::Kind::kBytes, *std::move(header), -1});
  for (int index : order) framing.segments.push_back({FramingSegment::Kind::kTensor, "", index});
  return framing;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> SafetensorsOutput::CompanionFiles(
    const TargetLayout& layout, const CopyPlan& plan) const {
  std::vector<std::pair<std::string, std::string>> files;
  if (layout.kind != TargetLayout::Kind::kConsolidated || layout.files.size() < 2) return files;
  // transformers' form: sorted keys, indent 2, trailing newline.
  Json weight_map = Json::object();
  uint64_t total_size = 0;
  for (const FilePlan& file : plan.files) {
    for (const TensorCopy& tensor : file.tensors) {
      weight_map[tensor.name] = file.name;
      total_size += tensor.dst_bytes();
    }
  }
  Json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  files.emplace_back(kSafetensorsIndexName,
                     index.dump(2, ' ', false, Json::error_handler_t::replace) + "\n");
  return files;
}

namespace {
const InputFormatRegistration<SafetensorsInput> register_input;
const OutputFormatRegistration<SafetensorsOutput> register_output;
}  // namespace

}  // namespace reshard
