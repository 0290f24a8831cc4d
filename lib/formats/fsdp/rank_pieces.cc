#include "lib/formats/fsdp/rank_pieces.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/formats/colossalai/colossalai_meta.h"
#include "lib/formats/dcp/dcp_metadata.h"
#include "lib/formats/parallel_reads.h"

namespace reshard {

absl::StatusOr<RankStateDict> OpenRankStateDict(
    const std::string& path, const std::function<absl::Status(const PickleValue*)>& check_globals) {
  RankStateDict out;
  ASSIGN_OR_RETURN(out.archive, TorchArchive::Open(path));
  const auto* entries = PickleEntries(out.archive->root());
  if (entries == nullptr) {
    return absl::DataLossError(absl::StrCat(
        path, ": holds a ", DescribePickleValue(out.archive->root()), ", not a state dict"));
  }
  RETURN_IF_ERROR(check_globals(out.archive->root()), path);
  for (const auto& [key, value] : *entries) {
    std::optional<std::string> name = PickleString(key);
    if (!name.has_value()) {
      return absl::DataLossError(
          absl::StrCat(path, ": state dict key ", PickleKeyName(key), " is not a string"));
    }
    out.entries.emplace_back(*std::move(name), value);
  }
  return out;
}

absl::Status OpenRankStateDictsInOrder(
    const std::vector<std::string>& paths,
    const std::function<absl::Status(const PickleValue*)>& check_globals,
    absl::FunctionRef<absl::Status(int64_t rank, RankStateDict state)> take) {
  return ReadInOrder<RankStateDict>(
      static_cast<int>(paths.size()), ParallelReadOptions(),
      [&](int rank) { return OpenRankStateDict(paths[rank], check_globals); },
      [](const RankStateDict& state) { return state.archive->metadata_bytes(); },
      [&](int rank, RankStateDict state) { return take(rank, std::move(state)); });
}

SourcePiece PieceAt(const TensorLocation& location, Box box, int file) {
  SourcePiece piece;
  piece.file = file;
  piece.byte_offset = location.byte_offset;
  piece.box = std::move(box);
  piece.strides = location.strides;
  return piece;
}

absl::Status RankPieces::AddRank(const std::string& name, DType dtype, const Shape& global,
                                 int64_t rank, const std::string& where) {
  auto [it, inserted] = index_.emplace(name, params_.size());
  if (inserted) {
    if (rank != 0) {
      return absl::DataLossError(absl::StrCat(where, ": not in rank 0's file ", paths_[0]));
    }
    params_.push_back(Param{name, dtype, global, {}, {}, 0});
  }
  Param& param = params_[it->second];
  if (param.ranks_seen != rank) {
    return absl::DataLossError(absl::StrCat(where, ": the state dict holds it twice"));
  }
  ++param.ranks_seen;
  if (param.dtype != dtype || param.shape != global) {
    return absl::DataLossError(
        absl::StrCat(where, " is ", DTypeName(dtype), " ", ShapeToString(global), ", rank 0's ",
                     DTypeName(param.dtype), " ", ShapeToString(param.shape)));
  }
  return absl::OkStatus();
}

void RankPieces::AddPiece(const std::string& name, SourcePiece piece) {
  for (int64_t extent : piece.box.extent) {
    if (extent == 0) return;  // torch.chunk left this rank nothing
  }
  Param& param = params_[index_.at(name)];
  for (const SourcePiece& seen : param.pieces) {
    if (seen.box == piece.box) {
      param.replicas.push_back(std::move(piece));
      ++replicated_copies_;
      return;
    }
  }
  param.pieces.push_back(std::move(piece));
}

absl::StatusOr<std::vector<CatalogTensor>> RankPieces::Finish(const std::string& dir) {
  std::vector<CatalogTensor> tensors;
  const int64_t world_size = static_cast<int64_t>(paths_.size());
  for (Param& param : params_) {
    const std::string where = absl::StrCat(dir, ": tensor \"", param.name, "\" (global shape ",
                                           ShapeToString(param.shape), ")");
    if (param.ranks_seen != world_size) {
      return absl::DataLossError(absl::StrCat(where, ": not in ", paths_[param.ranks_seen]));
    }
    std::vector<Box> boxes;
    for (const SourcePiece& piece : param.pieces) boxes.push_back(piece.box);
    if (std::optional<Box> hole = FindUncoveredBox(param.shape, boxes); hole.has_value()) {
      return absl::DataLossError(
          absl::StrCat(where, ": no rank's file holds elements ", BoxRanges(*hole)));
    }
    RETURN_IF_ERROR(CheckChunkTiling(param.shape, boxes), where);
    CatalogTensor tensor;
    tensor.name = std::move(param.name);
    tensor.dtype = param.dtype;
    tensor.shape = std::move(param.shape);
    tensor.pieces = std::move(param.pieces);
    tensor.replicas = std::move(param.replicas);
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

}  // namespace reshard
