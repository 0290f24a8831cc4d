#include "lib/formats/colossalai/colossalai_format.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/colossalai/colossalai_meta.h"
#include "lib/formats/dcp/dcp_format.h"
#include "lib/formats/dcp/dcp_metadata.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/safetensors/header.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/formats/torch/torch_format.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

constexpr uint64_t kMaxMetaBytes = uint64_t{256} << 20;

// A weight file, read: its tensors (whole, as the rank saved them) as a Catalog of one file.
struct WeightFile {
  std::string name;  // as resolved inside the folder
  Catalog catalog;
  std::vector<bool> described;  // per tensor: some metadata entry names it
};

absl::StatusOr<Catalog> ReadWeightCatalogOf(const std::string& path) {
  if (absl::EndsWith(path, ".safetensors")) {
    uint64_t size = 0;
    std::string version;
    ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(path, &size, &version));
    Catalog catalog;
    AddSafetensorsFileToCatalog(path, size, version, header, catalog);
    catalog.Reindex();
    return catalog;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(path));
  ASSIGN_OR_RETURN(Catalog catalog, CatalogFromArchive(*archive));
  return catalog;
}

// ReadWeightCatalogOf, its errors naming the file (a storage error may not).
absl::StatusOr<Catalog> ReadWeightCatalog(const std::string& path) {
  absl::StatusOr<Catalog> catalog = ReadWeightCatalogOf(path);
  if (!catalog.ok() && !absl::StrContains(catalog.status().message(), path)) {
    return Annotate(catalog.status(), path);
  }
  return catalog;
}

// The memory a parsed metadata file holds, roughly: what ReadInOrder bounds.
uint64_t MetaBytes(const ColossalMeta& meta) {
  uint64_t bytes = sizeof(meta) + meta.path.size();
  for (const ColossalParam& param : meta.params) {
    bytes += sizeof(param) + param.name.size() + param.file.size() +
             (param.box.origin.size() * 2 + param.global_shape.size()) * sizeof(int64_t);
  }
  return bytes;
}

// One piece of a parameter, with where it was described (for messages).
struct Described {
  SourcePiece piece;
  int64_t dist_id = 0;
};

struct Param {
  std::string name;
  Shape shape;
  std::optional<DType> dtype;
  std::vector<Described> pieces;
  int64_t first_dist_id = 0;
  std::vector<SourcePiece> replicas;  // later ranks' copies of a box already in `pieces`
};

class ColossalReader {
 public:
  explicit ColossalReader(std::string dir) : dir_(std::move(dir)) {}

  absl::StatusOr<InputModel> Read() {
    RETURN_IF_ERROR(ReadMetas());
    RETURN_IF_ERROR(PreloadWeightFiles());
    for (const ColossalMeta& meta : metas_) {
      for (const ColossalParam& param : meta.params) {
        RETURN_IF_ERROR(AddPiece(meta, param),
                        absl::StrCat(meta.path, ": parameter \"", param.name, "\""));
      }
    }
    return Assemble();
  }

 private:
  // Every metadata file, in dist id order; ids must run 0..N-1.
  absl::Status ReadMetas() {
    std::map<int64_t, std::string> names;
    ASSIGN_OR_RETURN(std::vector<std::string> listed, ListFolder(dir_, {".json"}));
    for (const std::string& name : listed) {
      std::optional<int64_t> id = ColossalMetaDistId(name);
      if (!id.has_value()) continue;
      auto [it, inserted] = names.emplace(*id, name);
      if (!inserted) {
        return absl::DataLossError(absl::StrCat(
            dir_, ": dist id ", *id, " has two metadata files, ", it->second, " and ", name));
      }
    }
    if (names.empty()) {
      return absl::NotFoundError(
          absl::StrCat(dir_, ": no ", kColossalMetaPrefix,
                       "NNNNN.json metadata file: not a ColossalAI distributed checkpoint"));
    }
    const int64_t last = names.rbegin()->first;
    for (int64_t id = 0; id <= last; ++id) {
      if (names.count(id) > 0) continue;
      return absl::NotFoundError(absl::StrFormat(
          "%s: the metadata file of dist id %d (%s%05d.json or .index.json) is missing, but "
          "dist id %d's is there (%d metadata files found): every tensor- and pipeline-parallel "
          "rank writes one; a partial save or copy is the usual cause",
          dir_, id, kColossalMetaPrefix, id, last, names.size()));
    }
    // Read and parsed several at once (each rank's file is a round trip on S3), kept in id
    // order.
    std::vector<std::string> paths;
    for (const auto& [id, name] : names) paths.push_back(JoinPath(dir_, name));
    return ReadInOrder<ColossalMeta>(
        static_cast<int>(paths.size()), ParallelReadOptions(),
        [&](int id) -> absl::StatusOr<ColossalMeta> {
          ASSIGN_OR_RETURN(std::string json, ReadSmallFile(paths[id], kMaxMetaBytes));
          return ParseColossalMeta(json, paths[id], id);
        },
        [](const ColossalMeta& meta) { return MetaBytes(meta); },
        [this](int id, ColossalMeta meta) {
          metas_.push_back(std::move(meta));
          return absl::OkStatus();
        });
  }

  // The weight files the metadata names, in the order AddPiece first asks for them, resolved
  // in the folder here and read several at once. A file that cannot be resolved or read keeps
  // its error, which File returns where the reading one after another would have met it.
  absl::Status PreloadWeightFiles() {
    struct Pending {
      std::string relative;
      absl::StatusOr<std::string> path;
    };
    std::vector<Pending> pending;
    absl::flat_hash_set<std::string> seen;
    for (const ColossalMeta& meta : metas_) {
      for (const ColossalParam& param : meta.params) {
        const std::string relative = RelativeName(param.file);
        if (!seen.insert(relative).second) continue;
        pending.push_back(Pending{relative, ResolveWeightFile(param.file)});
      }
    }
    return ReadInOrder<absl::StatusOr<Catalog>>(
        static_cast<int>(pending.size()), ParallelReadOptions(),
        [&](int i) -> absl::StatusOr<absl::StatusOr<Catalog>> {
          const Pending& file = pending[i];
          if (!file.path.ok()) return absl::StatusOr<Catalog>(file.path.status());
          return absl::StatusOr<Catalog>(ReadWeightCatalog(*file.path));
        },
        [](const absl::StatusOr<Catalog>& catalog) {
          return catalog.ok() ? CatalogBytes(*catalog) : uint64_t{0};
        },
        [&](int i, absl::StatusOr<Catalog> catalog) {
          preloaded_.emplace(pending[i].relative, std::move(catalog));
          return absl::OkStatus();
        });
  }

  // A weight file's name in the folder: unsharded saves record the saving machine's path, of
  // which the last component is looked for.
  static std::string RelativeName(const std::string& file) {
    return !file.empty() && file.front() == '/' ? BaseName(file) : file;
  }

  // Where weight file `file` (as a metadata entry gives it) is in the folder.
  absl::StatusOr<std::string> ResolveWeightFile(const std::string& file) const {
    const std::string relative = RelativeName(file);
    absl::StatusOr<std::string> path = ResolveDcpDataFile(dir_, relative);
    if (!path.ok() && relative != file) {
      return Annotate(path.status(),
                      absl::StrCat("\"file\" ", file, " (the saving machine's path; its name ",
                                   relative, " is looked for in the checkpoint folder)"));
    }
    return path;
  }

  // The weight file `file` (as a metadata entry gives it) read, by index into files_.
  absl::StatusOr<int> File(const std::string& file) {
    const std::string relative = RelativeName(file);
    auto it = file_index_.find(relative);
    if (it != file_index_.end()) return it->second;
    auto loaded = preloaded_.find(relative);
    if (loaded == preloaded_.end()) {
      return absl::InternalError(absl::StrCat(dir_, ": weight file ", file, " was not read"));
    }
    absl::StatusOr<Catalog> read = std::move(loaded->second);
    preloaded_.erase(loaded);
    if (!read.ok()) return read.status();
    Catalog catalog = *std::move(read);
    const int index = static_cast<int>(files_.size());
    WeightFile weights{relative, std::move(catalog), {}};
    weights.described.assign(weights.catalog.tensors.size(), false);
    files_.push_back(std::move(weights));
    file_index_[relative] = index;
    return index;
  }

  absl::Status AddPiece(const ColossalMeta& meta, const ColossalParam& param) {
    ASSIGN_OR_RETURN(const int f, File(param.file));
    WeightFile& weights = files_[f];
    const SourceFile& source = weights.catalog.files[0];
    const int t = weights.catalog.Find(param.name);
    if (t < 0) {
      return absl::DataLossError(absl::StrCat(source.path, " holds no tensor \"", param.name,
                                              "\", which the metadata of dist id ", meta.dist_id,
                                              " places there"));
    }
    weights.described[t] = true;
    const CatalogTensor& local = weights.catalog.tensors[t];
    auto local_error = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(source.path, ": tensor \"", param.name, "\" (",
                                              DTypeName(local.dtype), " ",
                                              ShapeToString(local.shape), ", at byte offset ",
                                              local.pieces.at(0).byte_offset, ") ", why));
    };
    if (local.shape.size() != param.global_shape.size()) {
      return local_error(absl::StrCat("does not have the ", param.global_shape.size(),
                                      " dimensions of its global_shape ",
                                      ShapeToString(param.global_shape)));
    }
    for (size_t d = 0; d < local.shape.size(); ++d) {
      // The last tensor-parallel rank's box may be shorter: the vocabulary padding is dropped.
      if (param.box.extent[d] > local.shape[d]) {
        return local_error(absl::StrCat("is smaller than the box ", BoxRanges(param.box),
                                        " its metadata gives it"));
      }
    }
    if (local.pieces.size() != 1) return local_error("is not stored as one piece");
    auto [it, inserted] = param_index_.emplace(param.name, params_.size());
    if (inserted) {
      params_.push_back(Param{param.name, param.global_shape, std::nullopt, {}, meta.dist_id});
    }
    Param& global = params_[it->second];
    if (global.shape != param.global_shape) {
      return absl::DataLossError(absl::StrCat("global_shape ", ShapeToString(param.global_shape),
                                              " differs from the ", ShapeToString(global.shape),
                                              " of dist id ", global.first_dist_id, "'s metadata"));
    }
    if (global.dtype.has_value() && *global.dtype != local.dtype) {
      return local_error(absl::StrCat("differs in dtype from dist id ", global.first_dist_id,
                                      "'s copy (", DTypeName(*global.dtype), ")"));
    }
    global.dtype = local.dtype;
    SourcePiece piece = local.pieces[0];
    piece.file = f;
    piece.box = param.box;
    // Replicated parameters: the same box in several ranks' files; the first is read, the
    // others kept for `verify` to compare.
    for (const Described& seen : global.pieces) {
      if (seen.piece.box.origin == param.box.origin && seen.piece.box.extent == param.box.extent) {
        ++replicated_copies_;
        global.replicas.push_back(std::move(piece));
        return absl::OkStatus();
      }
    }
    global.pieces.push_back(Described{std::move(piece), meta.dist_id});
    return absl::OkStatus();
  }

  absl::StatusOr<InputModel> Assemble() {
    Catalog catalog;
    catalog.format = ColossalInput::kId;
    for (WeightFile& weights : files_) catalog.files.push_back(weights.catalog.files[0]);
    size_t pieces = 0;
    for (Param& param : params_) {
      std::vector<Box> boxes;
      for (const Described& described : param.pieces) boxes.push_back(described.piece.box);
      const std::string where = absl::StrCat(dir_, ": tensor \"", param.name, "\" (global shape ",
                                             ShapeToString(param.shape), ")");
      if (std::optional<Box> hole = FindUncoveredBox(param.shape, boxes); hole.has_value()) {
        return absl::DataLossError(absl::StrCat(
            where, ": no rank's file holds elements ", BoxRanges(*hole), " (", param.pieces.size(),
            param.pieces.size() == 1 ? " box" : " boxes", " found in the metadata of ",
            metas_.size(), metas_.size() == 1 ? " rank" : " ranks",
            "): the checkpoint is incomplete; a rank's files are missing or the "
            "save did not finish"));
      }
      std::vector<int64_t> owners;
      for (const Described& described : param.pieces) owners.push_back(described.dist_id);
      RETURN_IF_ERROR(CheckChunkTiling(param.shape, boxes),
                      absl::StrCat(where, " (its boxes, in order, are dist ids ",
                                   absl::StrJoin(owners, ", "), ")"));
      CatalogTensor tensor;
      tensor.name = param.name;
      tensor.dtype = param.dtype.value_or(DType::kF32);
      tensor.shape = param.shape;
      for (Described& described : param.pieces) tensor.pieces.push_back(std::move(described.piece));
      tensor.replicas = std::move(param.replicas);
      pieces += tensor.pieces.size();
      catalog.tensors.push_back(std::move(tensor));
    }
    for (const WeightFile& weights : files_) {
      for (size_t t = 0; t < weights.catalog.tensors.size(); ++t) {
        if (weights.described[t]) continue;
        catalog.other_entries.push_back(absl::StrCat(
            weights.catalog.tensors[t].name, ": tensor in ", weights.name,
            " that no metadata describes (not read; ColossalAI's loader skips it too)"));
      }
    }
    const bool safetensors =
        !files_.empty() && absl::EndsWith(files_.front().catalog.files[0].path, ".safetensors");
    return ShardedFolderModel(
        ColossalInput::kId, dir_, std::move(catalog),
        absl::StrCat("ColossalAI distributed checkpoint (PR #6181), ", metas_.size(),
                     metas_.size() == 1 ? " rank" : " ranks", " (dist ids 0..", metas_.size() - 1,
                     "), ", files_.size(), safetensors ? " safetensors" : " torch.save",
                     files_.size() == 1 ? " weight file, " : " weight files, ", params_.size(),
                     params_.size() == 1 ? " parameter in " : " parameters in ", pieces,
                     pieces == 1 ? " box" : " boxes"),
        replicated_copies_);
  }

  std::string dir_;
  std::vector<ColossalMeta> metas_;
  std::vector<WeightFile> files_;
  absl::flat_hash_map<std::string, int> file_index_;
  // Weight files read and not yet taken by File, by their name in the folder.
  absl::flat_hash_map<std::string, absl::StatusOr<Catalog>> preloaded_;
  std::vector<Param> params_;
  absl::flat_hash_map<std::string, size_t> param_index_;
  int64_t replicated_copies_ = 0;
};

}  // namespace

absl::StatusOr<bool> ColossalInput::Probe(const std::string& path) const {
  return FolderHoldsFileNamed(path, {".json"}, [](const std::string& name) {
    return ColossalMetaDistId(name).has_value();
  });
}

absl::StatusOr<InputModel> ColossalInput::Read(const std::string& path,
                                               const ReadOptions& /*options*/) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) {
    return absl::NotFoundError(
        absl::StrCat(path, ": not a ColossalAI distributed checkpoint folder"));
  }
  ColossalReader reader(path);
  return reader.Read();
}

namespace {
const InputFormatRegistration<ColossalInput> register_input;
}  // namespace

}  // namespace reshard
