#include "lib/formats/fsdp/olmo_sharded_format.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/fsdp/dtensor.h"
#include "lib/formats/fsdp/flat_param.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

constexpr char kModelFolder[] = "model";
constexpr char kMetadataName[] = "metadata.yaml";
constexpr uint64_t kMaxMetadataBytes = 64 << 10;

// The rank of a model file name "rank{N}.pt"; nullopt for any other name.
std::optional<int64_t> RankOfName(absl::string_view name) {
  int64_t rank = 0;
  if (!absl::ConsumePrefix(&name, "rank") || !absl::ConsumeSuffix(&name, ".pt") || name.empty() ||
      name.size() > 9 || name.find_first_not_of("0123456789") != name.npos ||
      !absl::SimpleAtoi(name, &rank)) {
    return std::nullopt;
  }
  return rank;
}

struct Param {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t first_rank = 0;
  std::vector<FlatRange> ranges;
};

class OlmoShardedReader {
 public:
  explicit OlmoShardedReader(std::string dir) : dir_(std::move(dir)) {}

  absl::StatusOr<InputModel> Read() {
    RETURN_IF_ERROR(ListRanks());
    RETURN_IF_ERROR(OpenArchivesInOrder(
        paths_, [this](int rank, const TorchArchive& archive) { return TakeRank(rank, archive); }));
    return Assemble();
  }

 private:
  absl::Status ListRanks() {
    const std::string model = JoinPath(dir_, kModelFolder);
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(model, {".pt"}));
    std::map<int64_t, std::string> ranks;
    for (const std::string& name : names) {
      if (std::optional<int64_t> rank = RankOfName(name); rank.has_value()) {
        ranks.emplace(*rank, name);
      }
    }
    if (ranks.empty()) {
      return absl::NotFoundError(absl::StrCat(model, ": no rank{N}.pt file"));
    }
    int64_t world_size = ranks.rbegin()->first + 1;
    // metadata.yaml: `world_size: N` (_LocalShardedCheckpointerMetadata).
    const std::string metadata_path = JoinPath(dir_, kMetadataName);
    ASSIGN_OR_RETURN(const bool has_metadata, CheckInputFile(metadata_path));
    if (has_metadata) {
      ASSIGN_OR_RETURN(std::string yaml, ReadSmallFile(metadata_path, kMaxMetadataBytes));
      for (absl::string_view line : absl::StrSplit(yaml, '\n')) {
        if (!absl::ConsumePrefix(&line, "world_size:")) continue;
        int64_t n = 0;
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &n) || n < 1) {
          return absl::DataLossError(absl::StrCat(metadata_path, ": world_size \"",
                                                  absl::StripAsciiWhitespace(line),
                                                  "\" is not a positive number"));
        }
        if (n < world_size) {
          return absl::DataLossError(absl::StrCat(metadata_path, ": world_size ", n, ", but ",
                                                  JoinPath(model, ranks.rbegin()->second),
                                                  " is there"));
        }
        world_size = n;
      }
    }
    for (int64_t rank = 0; rank < world_size; ++rank) {
      if (ranks.count(rank) == 0) {
        return absl::NotFoundError(
            absl::StrCat(JoinPath(model, absl::StrCat("rank", rank, ".pt")), " is missing (",
                         ranks.size(), " of the ", world_size,
                         " ranks' model files are there): every rank writes one; a "
                         "partial save or copy is the usual cause"));
      }
      paths_.push_back(JoinPath(model, ranks[rank]));
    }
    return absl::OkStatus();
  }

  // The flat parameters of rank `rank`'s model file, opened as `archive`.
  absl::Status TakeRank(int64_t rank, const TorchArchive& archive) {
    const std::string& path = paths_[rank];
    files_.push_back(archive.Source());
    RETURN_IF_ERROR(CheckPickleGlobals(archive.root(), IsFlatParamGlobal,
                                       "OLMo's flat parameter state (allowed: tensor rebuild "
                                       "functions, torch dtypes and sizes, _ShardParamInfo)"),
                    path);
    const auto* modules = PickleItems(PickleField(archive.root(), "modules"));
    if (modules == nullptr) {
      return absl::DataLossError(
          absl::StrCat(path, ": no \"modules\" list (LocalShardedCheckpointer's model state)"));
    }
    for (size_t m = 0; m < modules->size(); ++m) {
      const PickleValue* module = (*modules)[m];
      std::optional<std::string> name = PickleString(PickleField(module, "name"));
      const auto* handles = PickleItems(PickleField(module, "handles"));
      if (!name.has_value() || handles == nullptr) {
        return absl::DataLossError(
            absl::StrCat(path, ": modules[", m, "] lacks its \"name\" or \"handles\""));
      }
      const std::string prefix = absl::StrReplaceAll(*name, {{"_fsdp_wrapped_module.", ""}});
      for (size_t h = 0; h < handles->size(); ++h) {
        RETURN_IF_ERROR(ReadHandle(archive, rank, prefix, (*handles)[h]),
                        absl::StrCat(path, ": module \"", *name, "\" handle ", h));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadHandle(const TorchArchive& archive, int64_t rank, const std::string& prefix,
                          const PickleValue* handle) {
    ASSIGN_OR_RETURN(std::optional<TensorLocation> data,
                     archive.Tensor(PickleField(handle, "flat_param.data"), "flat_param.data"));
    if (!data.has_value()) return absl::DataLossError("lacks flat_param.data");
    if (data->shape.size() != 1 || data->strides[0] != 1) {
      return absl::DataLossError(absl::StrCat("flat_param.data is not a dense 1-d tensor (shape ",
                                              ShapeToString(data->shape), ")"));
    }
    const uint64_t element = DTypeSize(data->dtype);
    ASSIGN_OR_RETURN(std::vector<FlatParamSlice> slices,
                     ParseFlatParamHandle(handle, data->shape[0]));
    for (FlatParamSlice& slice : slices) {
      const std::string name = prefix.empty() ? slice.fqn : absl::StrCat(prefix, ".", slice.fqn);
      auto [it, inserted] = index_.emplace(name, params_.size());
      if (inserted) params_.push_back(Param{name, data->dtype, slice.shape, rank, {}});
      Param& param = params_[it->second];
      if (param.shape != slice.shape || param.dtype != data->dtype) {
        return absl::DataLossError(
            absl::StrCat("parameter \"", name, "\" is ", DTypeName(data->dtype), " ",
                         ShapeToString(slice.shape), ", ", paths_[param.first_rank], "'s ",
                         DTypeName(param.dtype), " ", ShapeToString(param.shape)));
      }
      param.ranges.push_back(FlatRange{slice.begin, slice.end, rank, slice.offset_in_shard,
                                       data->byte_offset + slice.offset_in_shard * element});
    }
    return absl::OkStatus();
  }

  // Where range `r` of `param` comes from, for messages.
  std::string From(const FlatRange& r) const {
    return absl::StrCat("[", r.begin, ", ", r.end, ") from ", paths_[r.rank], " (offset_in_shard ",
                        r.offset_in_shard, ")");
  }

  absl::StatusOr<InputModel> Assemble() {
    Catalog catalog;
    catalog.format = OlmoShardedInput::kId;
    catalog.files = std::move(files_);
    for (Param& param : params_) {
      ASSIGN_OR_RETURN(const int64_t numel, NumElements(param.shape),
                       absl::StrCat(dir_, ": parameter \"", param.name, "\""));
      const std::string where = absl::StrCat(dir_, ": parameter \"", param.name, "\" (",
                                             ShapeToString(param.shape), ", ", numel, " elements)");
      RETURN_IF_ERROR(
          CheckFlatRangesTile(param.ranges, numel, [this](const FlatRange& r) { return From(r); }),
          where);
      CatalogTensor tensor;
      tensor.name = param.name;
      tensor.dtype = param.dtype;
      tensor.shape = param.shape;
      for (const FlatRange& r : param.ranges) {
        AddFlatRangePieces(tensor, static_cast<int>(r.rank), r.byte_offset, r.begin, r.end);
      }
      catalog.tensors.push_back(std::move(tensor));
    }
    const size_t tensors = catalog.tensors.size();
    return ShardedFolderModel(
        OlmoShardedInput::kId, dir_, std::move(catalog),
        absl::StrCat("OLMo LocalShardedCheckpointer (FSDP flat parameters), world size ",
                     paths_.size(), ", ", tensors, tensors == 1 ? " parameter" : " parameters"),
        0);
  }

  std::string dir_;
  std::vector<std::string> paths_;  // by rank
  std::vector<SourceFile> files_;   // by rank
  std::vector<Param> params_;
  absl::flat_hash_map<std::string, size_t> index_;
};

}  // namespace

absl::StatusOr<bool> OlmoShardedInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return false;
  return FolderHoldsFileNamed(JoinPath(path, kModelFolder), {".pt"},
                              [](const std::string& name) { return RankOfName(name).has_value(); });
}

absl::StatusOr<InputModel> OlmoShardedInput::Read(const std::string& path,
                                                  const ReadOptions& /*options*/) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) {
    return absl::NotFoundError(
        absl::StrCat(path, ": not an OLMo LocalShardedCheckpointer checkpoint folder"));
  }
  OlmoShardedReader reader(path);
  return reader.Read();
}

namespace {
const InputFormatRegistration<OlmoShardedInput> register_input;
}  // namespace

}  // namespace reshard
