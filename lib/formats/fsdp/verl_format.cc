#include "lib/formats/fsdp/verl_format.h"

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/colossalai/colossalai_meta.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/fsdp/dtensor.h"
#include "lib/formats/fsdp/rank_pieces.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

constexpr char kPrefix[] = "model_world_size_";

class VerlReader {
 public:
  explicit VerlReader(std::string dir) : dir_(std::move(dir)) {}

  absl::StatusOr<InputModel> Read() {
    RETURN_IF_ERROR(ListShards());
    RETURN_IF_ERROR(OpenRankStateDictsInOrder(
        paths_, CheckDTensorStateDictGlobals,
        [this](int64_t rank, RankStateDict state) { return TakeRank(rank, state); }));
    return Assemble();
  }

 private:
  absl::Status ListShards() {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir_, {".pt"}));
    std::map<int64_t, std::string> ranks;
    std::string first;
    for (const std::string& name : names) {
      std::optional<VerlShardName> shard = ParseVerlShardName(name);
      if (!shard.has_value()) continue;
      if (world_size_ == 0) {
        world_size_ = shard->world_size;
        first = name;
      } else if (shard->world_size != world_size_) {
        return absl::DataLossError(absl::StrCat(
            dir_, ": ", name, " and ", first,
            " name different world sizes: shards of two saves are mixed in one folder"));
      }
      ranks.emplace(shard->rank, name);
    }
    if (world_size_ == 0) {
      return absl::NotFoundError(absl::StrCat(
          dir_, ": no ", kPrefix, "{W}_rank_{r}.pt file: not a verl FSDP checkpoint folder"));
    }
    for (int64_t rank = 0; rank < world_size_; ++rank) {
      if (ranks.count(rank) > 0) continue;
      return absl::NotFoundError(absl::StrFormat(
          "%s is missing (%d of the %d ranks' files are there): every rank writes one; a "
          "partial save or copy is the usual cause",
          JoinPath(dir_, absl::StrFormat("%s%d_rank_%d.pt", kPrefix, world_size_, rank)),
          ranks.size(), world_size_));
    }
    for (const auto& [rank, name] : ranks) paths_.push_back(JoinPath(dir_, name));
    pieces_.emplace(paths_);
    return absl::OkStatus();
  }

  // The pieces of rank `rank`'s state dict `state`.
  absl::Status TakeRank(int64_t rank, const RankStateDict& state) {
    const std::string& path = paths_[rank];
    const std::unique_ptr<TorchArchive>& archive = state.archive;
    files_.push_back(archive->Source());
    const int file = static_cast<int>(files_.size()) - 1;
    for (const auto& [name, value] : state.entries) {
      const std::string where = absl::StrCat(path, ": tensor \"", name, "\"");
      absl::StatusOr<std::optional<DTensorValue>> dtensor = ParseDTensor(value);
      if (!dtensor.ok()) return Annotate(dtensor.status(), where);
      const PickleValue* local = dtensor->has_value() ? (*dtensor)->local_tensor : value;
      ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive->Tensor(local, name));
      if (!location.has_value()) {
        if (dtensor->has_value()) {
          return absl::DataLossError(absl::StrCat(where, ": the DTensor's _local_tensor is a ",
                                                  DescribePickleValue(local)));
        }
        if (rank == 0) {
          other_entries_.push_back(absl::StrCat(name, ": ", DescribePickleValue(value)));
        }
        continue;
      }
      Shape global = location->shape;
      DType dtype = location->dtype;
      Box box = Box::Full(global);
      std::string placements = "a plain tensor";
      if (dtensor->has_value()) {
        const DTensorValue& d = **dtensor;
        global = d.global_shape;
        dtype = d.dtype;
        Shape mesh_shape = {world_size_};
        if (d.mesh_tensor != nullptr) {
          ASSIGN_OR_RETURN(std::optional<TensorLocation> mesh,
                           archive->Tensor(d.mesh_tensor, absl::StrCat(name, "._spec.mesh")));
          if (mesh.has_value()) mesh_shape = mesh->shape;
        }
        absl::StatusOr<Box> local_box =
            DTensorLocalBox(global, d.placements, mesh_shape, world_size_, rank);
        if (!local_box.ok()) {
          return absl::DataLossError(absl::StrCat(where, ": ", local_box.status().message()));
        }
        box = *std::move(local_box);
        placements = DescribePlacements(d.placements);
        if (location->dtype != d.dtype) {
          return absl::DataLossError(absl::StrCat(
              where, ": the local tensor at byte offset ", location->byte_offset, " is ",
              DTypeName(location->dtype), ", the DTensor ", DTypeName(d.dtype)));
        }
      }
      if (location->shape != box.extent) {
        return absl::DataLossError(absl::StrCat(
            where, " (global shape ", ShapeToString(global), ", ", placements, "): rank ", rank,
            " of ", world_size_, " holds elements ", BoxRanges(box), " of shape ",
            ShapeToString(box.extent), ", but its local tensor at byte offset ",
            location->byte_offset, " has shape ", ShapeToString(location->shape)));
      }
      RETURN_IF_ERROR(AddPiece(name, dtype, global, box, *location, file, rank, where));
    }
    return absl::OkStatus();
  }

  absl::Status AddPiece(const std::string& name, DType dtype, const Shape& global, Box box,
                        const TensorLocation& location, int file, int64_t rank,
                        const std::string& where) {
    RETURN_IF_ERROR(pieces_->AddRank(name, dtype, global, rank, where));
    pieces_->AddPiece(name, PieceAt(location, std::move(box), file));
    return absl::OkStatus();
  }

  absl::StatusOr<InputModel> Assemble() {
    Catalog catalog;
    catalog.format = VerlFsdpInput::kId;
    catalog.files = std::move(files_);
    ASSIGN_OR_RETURN(catalog.tensors, pieces_->Finish(dir_));
    catalog.other_entries = std::move(other_entries_);
    const size_t tensors = catalog.tensors.size();
    return ShardedFolderModel(VerlFsdpInput::kId, dir_, std::move(catalog),
                              absl::StrCat("verl FSDP, world size ", world_size_, ", ", tensors,
                                           tensors == 1 ? " tensor" : " tensors"),
                              pieces_->replicated_copies());
  }

  std::string dir_;
  int64_t world_size_ = 0;
  std::vector<std::string> paths_;    // by rank
  std::vector<SourceFile> files_;     // by rank
  std::optional<RankPieces> pieces_;  // once the rank files are known
  std::vector<std::string> other_entries_;
};

}  // namespace

std::optional<VerlShardName> ParseVerlShardName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kPrefix) || !absl::ConsumeSuffix(&name, ".pt")) {
    return std::nullopt;
  }
  const size_t sep = name.find("_rank_");
  if (sep == absl::string_view::npos) return std::nullopt;
  const absl::string_view world = name.substr(0, sep);
  const absl::string_view rank = name.substr(sep + 6);
  VerlShardName out;
  auto digits = [](absl::string_view s) {
    return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == s.npos;
  };
  if (!digits(world) || !digits(rank) || !absl::SimpleAtoi(world, &out.world_size) ||
      !absl::SimpleAtoi(rank, &out.rank) || out.world_size < 1 || out.rank >= out.world_size) {
    return std::nullopt;
  }
  return out;
}

absl::StatusOr<bool> VerlFsdpInput::Probe(const std::string& path) const {
  return FolderHoldsFileNamed(
      path, {".pt"}, [](const std::string& name) { return ParseVerlShardName(name).has_value(); });
}

absl::StatusOr<InputModel> VerlFsdpInput::Read(const std::string& path,
                                               const ReadOptions& /*options*/) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) {
    return absl::NotFoundError(absl::StrCat(path, ": not a verl FSDP checkpoint folder"));
  }
  VerlReader reader(path);
  return reader.Read();
}

namespace {
const InputFormatRegistration<VerlFsdpInput> register_input;
}  // namespace

}  // namespace reshard
