#include "lib/formats/folder_model.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/torch/pickle.h"
#include "lib/io/file_access.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

constexpr uint64_t kMaxIndexBytes = 256u << 20;

std::vector<std::string> SortedNames(const Catalog& catalog) {
  std::vector<std::string> names;
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

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

absl::StatusOr<std::vector<std::string>> ListFolder(const std::string& dir,
                                                    const std::vector<std::string>& suffixes) {
  std::vector<std::string> names;
  ASSIGN_OR_RETURN(std::vector<std::string> listed, ListInputFolder(dir));
  for (std::string& name : listed) {
    if (name.empty() || name[0] == '.') continue;
    for (const std::string& suffix : suffixes) {
      if (absl::EndsWith(name, suffix)) {
        names.push_back(std::move(name));
        break;
      }
    }
  }
  std::sort(names.begin(), names.end(), NaturalLess);
  return names;
}

InputModel ShardedFolderModel(const std::string& format, const std::string& dir, Catalog catalog,
                              std::string description, int64_t replicated_copies) {
  catalog.Reindex();
  InputModel model;
  model.format = format;
  model.arrangement = "sharded";
  model.description = std::move(description);
  if (replicated_copies > 0) {
    absl::StrAppend(&model.description, ", ", replicated_copies, " replicated copies read once");
  }
  model.part_names.push_back(dir);
  model.parts.push_back(std::move(catalog));
  return model;
}

absl::StatusOr<bool> FolderHoldsFileNamed(const std::string& path,
                                          const std::vector<std::string>& suffixes,
                                          const std::function<bool(const std::string&)>& matches) {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return false;
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(path, suffixes));
  return std::any_of(names.begin(), names.end(), matches);
}

absl::StatusOr<InputModel> ReadIndexedFolder(absl::string_view format, const std::string& dir,
                                             const std::string& index_path,
                                             const ReadFolderFile& read_one) {
  ASSIGN_OR_RETURN(const auto weight_map, ReadWeightMap(index_path));
  std::vector<std::string> names;
  for (const auto& [tensor, file] : weight_map) {
    if (std::find(names.begin(), names.end(), file) != names.end()) continue;
    // A remote folder's existence checks are answered by its one listing.
    const std::string path = absl::StrCat(dir, "/", file);
    ASSIGN_OR_RETURN(const bool exists, CheckInputExists(path));
    if (!exists) {
      return absl::NotFoundError(absl::StrCat(path, " not found: ", index_path, " maps tensor \"",
                                              tensor, "\" to it"));
    }
    names.push_back(file);
  }
  std::sort(names.begin(), names.end(), NaturalLess);
  ASSIGN_OR_RETURN(std::vector<FileCatalog> files, ReadFolderFiles(dir, names, read_one));
  return AssembleIndexedFolder(format, dir, index_path, weight_map, std::move(files));
}

absl::StatusOr<std::vector<FileCatalog>> ReadFolderFiles(const std::string& dir,
                                                         const std::vector<std::string>& names,
                                                         const ReadFolderFile& read_one) {
  std::vector<absl::StatusOr<FileCatalog>> read_files(names.size(), absl::UnknownError(""));
  if (InputReadsAreRequests(dir)) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    const size_t count = std::min<size_t>(kRemoteFileReads, names.size());
    // The files' pickles are charged to this thread's metadata allowance.
    const std::shared_ptr<MetadataAllowance> allowance = CurrentMetadataAllowance();
    for (size_t t = 0; t < count; ++t) {
      threads.emplace_back([&] {
        ScopedMetadataAllowance scoped(allowance);
        for (size_t i = next++; i < names.size(); i = next++) {
          read_files[i] = read_one(dir, names[i]);
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
  } else {
    for (size_t i = 0; i < names.size(); ++i) {
      read_files[i] = read_one(dir, names[i]);
      if (!read_files[i].ok()) break;
    }
  }
  std::vector<FileCatalog> files;
  for (absl::StatusOr<FileCatalog>& file : read_files) {
    if (!file.ok()) return file.status();  // the first failure in file order
    files.push_back(*std::move(file));
  }
  return files;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadWeightMap(
    const std::string& index_path) {
  auto text = ReadSmallFile(index_path, kMaxIndexBytes);
  if (!text.ok()) {
    if (absl::IsInvalidArgument(text.status()) &&
        absl::StrContains(text.status().message(), "larger than")) {
      return absl::DataLossError(absl::StrCat(index_path, ": index is larger than 256 MiB"));
    }
    return text.status();
  }
  nlohmann::ordered_json index;
  try {
    index = nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::ordered_json::exception& e) {
    return absl::DataLossError(absl::StrCat(index_path, ": invalid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::DataLossError(absl::StrCat(index_path, ": no \"weight_map\" object"));
  }
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    if (!it.value().is_string()) {
      return absl::DataLossError(
          absl::StrCat(index_path, ": weight_map entry \"", it.key(), "\" is not a file name"));
    }
    const std::string file = it.value().get<std::string>();
    if (!IsPlainPathComponent(file)) {
      return absl::DataLossError(absl::StrCat(index_path, ": weight_map entry \"", it.key(),
                                              "\" names \"", file,
                                              "\", which is not a file in the index's folder"));
    }
    weight_map.emplace_back(it.key(), file);
  }
  return weight_map;
}

std::string HuggingFaceIndexJson(const TargetLayout& layout) {
  nlohmann::json weight_map = nlohmann::json::object();  // std::map keys: sorted, as transformers
  nlohmann::json metadata = nlohmann::json::object();
  uint64_t total_size = 0;
  for (const OutputFileLayout& file : layout.files) {
    for (const OutputTensor& tensor : file.tensors) {
      if (tensor.alias_of >= 0) {
        metadata[tensor.name] = file.tensors[tensor.alias_of].name;
        continue;
      }
      weight_map[tensor.name] = file.name;
      total_size += tensor.bytes();
    }
  }
  metadata["total_size"] = total_size;
  const nlohmann::json index = {{"metadata", metadata}, {"weight_map", weight_map}};
  return index.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

absl::StatusOr<InputModel> AssembleIndexedFolder(
    absl::string_view format, const std::string& dir, const std::string& index_path,
    const std::vector<std::pair<std::string, std::string>>& weight_map,
    std::vector<FileCatalog> files) {
  absl::flat_hash_map<std::string, std::string> file_of(weight_map.begin(), weight_map.end());
  InputModel model;
  model.format = std::string(format);
  model.arrangement = "sharded";
  Catalog catalog;
  catalog.format = std::string(format);
  size_t listed_found = 0;
  for (FileCatalog& file : files) {
    for (const CatalogTensor& tensor : file.catalog.tensors) {
      auto it = file_of.find(tensor.name);
      const std::string path = absl::StrCat(dir, "/", file.name);
      if (it == file_of.end()) {
        return absl::DataLossError(
            absl::StrCat(path, ": tensor \"", tensor.name, "\" is not listed in ", index_path));
      }
      if (it->second != file.name) {
        return absl::DataLossError(absl::StrCat(
            path, ": tensor \"", tensor.name, "\" is mapped to ", it->second, " by ", index_path));
      }
      ++listed_found;
    }
    AppendCatalog(catalog, std::move(file.catalog));
  }
  catalog.Reindex();
  if (listed_found != file_of.size()) {
    for (const auto& [tensor, file] : weight_map) {
      if (catalog.Find(tensor) < 0) {
        return absl::DataLossError(absl::StrCat(index_path, " maps tensor \"", tensor, "\" to ",
                                                file, ", which does not hold it"));
      }
    }
  }
  model.parts.push_back(std::move(catalog));
  model.part_names.push_back(dir);
  return model;
}

absl::StatusOr<InputModel> AssembleFolder(absl::string_view format, const std::string& dir,
                                          std::vector<FileCatalog> files) {
  if (files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " holds no ", format, " files"));
  }
  InputModel model;
  model.format = std::string(format);
  const std::vector<std::string> first_names = SortedNames(files[0].catalog);
  bool all_same = files.size() > 1 && !first_names.empty();
  for (size_t i = 1; i < files.size() && all_same; ++i) {
    all_same = SortedNames(files[i].catalog) == first_names;
  }
  if (all_same) {
    model.arrangement = "model-parallel-parts";
    for (FileCatalog& file : files) {
      file.catalog.Reindex();
      model.part_names.push_back(absl::StrCat(dir, "/", file.name));
      model.parts.push_back(std::move(file.catalog));
    }
    return model;
  }
  model.arrangement = files.size() == 1 ? "single-file" : "sharded";
  Catalog catalog;
  catalog.format = std::string(format);
  absl::flat_hash_map<std::string, std::string> owner;
  for (FileCatalog& file : files) {
    for (const CatalogTensor& tensor : file.catalog.tensors) {
      auto [it, inserted] = owner.emplace(tensor.name, file.name);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, ": tensor \"", tensor.name, "\" is in both ", it->second, " and ", file.name,
            ", but the files do not all hold the same tensors: they are neither shards of one "
            "model nor model-parallel parts"));
      }
    }
    AppendCatalog(catalog, std::move(file.catalog));
  }
  catalog.Reindex();
  model.parts.push_back(std::move(catalog));
  model.part_names.push_back(dir);
  return model;
}

}  // namespace reshard
