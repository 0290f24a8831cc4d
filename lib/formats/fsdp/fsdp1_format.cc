#include "lib/formats/fsdp/fsdp1_format.h"

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/colossalai/colossalai_meta.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/fsdp/rank_pieces.h"
#include "lib/formats/fsdp/sharded_tensor.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

// The rank files of one save: `prefix`rank{N}.pt by rank, and the world size its lowest rank's
// first ShardedTensor gives.
struct RankFiles {
  std::string prefix;
  std::map<int64_t, std::string> names;
  int64_t world_size = 0;
};

// The first ShardedTensor among the top-level entries of `root` and its key, or nulls.
std::pair<const PickleValue*, const PickleValue*> FirstShardedTensor(const PickleValue* root) {
  const auto* entries = PickleEntries(root);
  if (entries == nullptr) return {nullptr, nullptr};
  for (const auto& [key, value] : *entries) {
    if (IsShardedTensorPickle(value)) return {key, value};
  }
  return {nullptr, nullptr};
}

// The FSDP1 save in folder `dir`: among its `<prefix>rank{N}.pt` files, the prefix whose lowest
// rank's state dict holds a ShardedTensor; nullopt when none does. FailedPrecondition when two
// prefixes do (two saves in one folder).
absl::StatusOr<std::optional<RankFiles>> FindSave(const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir, {".pt"}));
  std::map<std::string, RankFiles> by_prefix;
  for (const std::string& name : names) {
    std::optional<Fsdp1RankName> parsed = ParseFsdp1RankName(name);
    if (!parsed.has_value()) continue;
    RankFiles& files = by_prefix[parsed->prefix];
    files.prefix = parsed->prefix;
    files.names.emplace(parsed->rank, name);
  }
  std::optional<RankFiles> found;
  for (auto& [prefix, files] : by_prefix) {
    const std::string lowest = JoinPath(dir, files.names.begin()->second);
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(lowest));
    const auto [key, first] = FirstShardedTensor(archive->root());
    if (first == nullptr) continue;
    ASSIGN_OR_RETURN(std::optional<ShardedTensorValue> parsed, ParseShardedTensor(first),
                     absl::StrCat(lowest, ": tensor \"", PickleKeyName(key), "\""));
    files.world_size = parsed->world_size;
    if (found.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir, ": holds two FSDP1 sharded state dicts, ", found->prefix,
                       "rank{N}.pt and ", prefix, "rank{N}.pt: give the folder of one save"));
    }
    found = std::move(files);
  }
  return found;
}

class Fsdp1Reader {
 public:
  Fsdp1Reader(std::string dir, RankFiles files) : dir_(std::move(dir)), files_(std::move(files)) {}

  absl::StatusOr<InputModel> Read() {
    RETURN_IF_ERROR(CheckRankFiles());
    RETURN_IF_ERROR(OpenRankStateDictsInOrder(
        paths_, CheckShardedTensorStateDictGlobals,
        [this](int64_t rank, RankStateDict state) { return TakeRank(rank, state); }));
    return Assemble();
  }

 private:
  std::string RankPath(int64_t rank) const {
    return JoinPath(dir_, absl::StrCat(files_.prefix, "rank", rank, ".pt"));
  }

  absl::Status CheckRankFiles() {
    world_size_ = files_.world_size;
    for (int64_t rank = 0; rank < world_size_; ++rank) {
      if (files_.names.count(rank) > 0) continue;
      return absl::NotFoundError(absl::StrCat(
          RankPath(rank), " is missing (", files_.names.size(), " of the ", world_size_,
          " ranks' files are there): every rank writes one; a partial save or copy is the "
          "usual cause"));
    }
    if (const int64_t last = files_.names.rbegin()->first; last >= world_size_) {
      return absl::DataLossError(absl::StrCat(RankPath(last), " is beside ", RankPath(0),
                                              ", saved by a world size of ", world_size_,
                                              ": files of two different saves are mixed"));
    }
    for (int64_t rank = 0; rank < world_size_; ++rank) paths_.push_back(RankPath(rank));
    pieces_.emplace(paths_);
    return absl::OkStatus();
  }

  // The pieces of rank `rank`'s state dict `state`.
  absl::Status TakeRank(int64_t rank, const RankStateDict& state) {
    const std::string& path = paths_[rank];
    const std::unique_ptr<TorchArchive>& archive = state.archive;
    files_read_.push_back(archive->Source());
    const int file = static_cast<int>(files_read_.size()) - 1;
    for (const auto& [name, value] : state.entries) {
      const std::string where = absl::StrCat(path, ": tensor \"", name, "\"");
      absl::StatusOr<std::optional<ShardedTensorValue>> sharded = ParseShardedTensor(value);
      if (!sharded.ok()) return Annotate(sharded.status(), where);
      if (sharded->has_value()) {
        RETURN_IF_ERROR(AddShardedTensor(*archive, **sharded, name, file, rank, where));
        continue;
      }
      ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive->Tensor(value, name));
      if (!location.has_value()) {
        if (rank == 0) {
          other_entries_.push_back(absl::StrCat(name, ": ", DescribePickleValue(value)));
        }
        continue;
      }
      RETURN_IF_ERROR(pieces_->AddRank(name, location->dtype, location->shape, rank, where));
      pieces_->AddPiece(name, PieceAt(*location, Box::Full(location->shape), file));
    }
    return absl::OkStatus();
  }

  absl::Status AddShardedTensor(const TorchArchive& archive, const ShardedTensorValue& st,
                                const std::string& name, int file, int64_t rank,
                                const std::string& where) {
    if (st.world_size != world_size_ || st.rank != rank) {
      return absl::DataLossError(absl::StrCat(
          archive.path(), ": saved by rank ", st.rank, " of world size ", st.world_size, ", but ",
          RankPath(0), " by rank 0 of ", world_size_, ": files of two different saves are mixed"));
    }
    for (const ShardedTensorShard& shard : st.shards_metadata) {
      if (shard.rank >= world_size_) {
        return absl::DataLossError(absl::StrCat(
            where, ": its ShardedTensorMetadata places elements ", BoxRanges(shard.box),
            " on rank ", shard.rank, " of a world size of ", world_size_));
      }
    }
    auto [it, inserted] = rank0_shards_.emplace(name, std::vector<Box>());
    std::vector<Box> listed;
    for (const ShardedTensorShard& shard : st.shards_metadata) listed.push_back(shard.box);
    if (inserted) {
      if (rank != 0) {
        return absl::DataLossError(absl::StrCat(where, ": not in rank 0's file ", RankPath(0)));
      }
      it->second = listed;
      rank0_descriptions_[name] = DescribeShards(st.shards_metadata);
    } else if (it->second != listed) {
      return absl::DataLossError(absl::StrCat(where, ": its ShardedTensorMetadata lists shards ",
                                              DescribeShards(st.shards_metadata),
                                              ", rank 0's file ", rank0_descriptions_[name],
                                              ": files of two different saves are mixed"));
    }
    int64_t on_rank = 0;
    for (const ShardedTensorShard& shard : st.shards_metadata) on_rank += shard.rank == rank;
    if (on_rank != static_cast<int64_t>(st.local_shards.size())) {
      return absl::DataLossError(absl::StrCat(where, ": its ShardedTensorMetadata lists ", on_rank,
                                              " shards on rank ", rank, ", the file holds ",
                                              st.local_shards.size()));
    }
    RETURN_IF_ERROR(pieces_->AddRank(name, st.dtype, st.global_shape, rank, where));
    for (size_t i = 0; i < st.local_shards.size(); ++i) {
      const ShardedTensorShard& shard = st.local_shards[i];
      ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive.Tensor(shard.tensor, name));
      if (!location.has_value()) {
        return absl::DataLossError(absl::StrCat(where, ": local shard ", i, "'s tensor is a ",
                                                DescribePickleValue(shard.tensor)));
      }
      if (location->dtype != st.dtype || location->shape != shard.box.extent) {
        return absl::DataLossError(absl::StrCat(
            where, " (", DTypeName(st.dtype), ", global shape ", ShapeToString(st.global_shape),
            "): local shard ", i, " holds elements ", BoxRanges(shard.box),
            ", but its tensor at byte offset ", location->byte_offset, " is ",
            DTypeName(location->dtype), " of shape ", ShapeToString(location->shape)));
      }
      pieces_->AddPiece(name, PieceAt(*location, shard.box, file));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<InputModel> Assemble() {
    Catalog catalog;
    catalog.format = Fsdp1ShardedInput::kId;
    catalog.files = std::move(files_read_);
    ASSIGN_OR_RETURN(catalog.tensors, pieces_->Finish(dir_));
    catalog.other_entries = std::move(other_entries_);
    const size_t tensors = catalog.tensors.size();
    return ShardedFolderModel(Fsdp1ShardedInput::kId, dir_, std::move(catalog),
                              absl::StrCat("FSDP1 sharded state dict, world size ", world_size_,
                                           ", ", tensors, tensors == 1 ? " tensor" : " tensors"),
                              pieces_->replicated_copies());
  }

  std::string dir_;
  RankFiles files_;
  int64_t world_size_ = 0;
  std::vector<std::string> paths_;      // by rank
  std::vector<SourceFile> files_read_;  // by rank
  std::optional<RankPieces> pieces_;
  absl::flat_hash_map<std::string, std::vector<Box>> rank0_shards_;
  absl::flat_hash_map<std::string, std::string> rank0_descriptions_;
  std::vector<std::string> other_entries_;
};

}  // namespace

std::optional<Fsdp1RankName> ParseFsdp1RankName(absl::string_view name) {
  if (!absl::ConsumeSuffix(&name, ".pt")) return std::nullopt;
  const size_t digits = name.find_last_not_of("0123456789");
  if (digits == absl::string_view::npos || digits + 1 == name.size() ||
      name.size() - digits - 1 > 9) {
    return std::nullopt;
  }
  absl::string_view prefix = name.substr(0, digits + 1);
  Fsdp1RankName out;
  if (!absl::ConsumeSuffix(&prefix, "rank") ||
      !absl::SimpleAtoi(name.substr(digits + 1), &out.rank)) {
    return std::nullopt;
  }
  out.prefix = std::string(prefix);
  return out;
}

absl::StatusOr<bool> Fsdp1ShardedInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool has_rank_file,
                   FolderHoldsFileNamed(path, {".pt"}, [](const std::string& name) {
                     return ParseFsdp1RankName(name).has_value();
                   }));
  if (!has_rank_file) return false;
  ASSIGN_OR_RETURN(std::optional<RankFiles> save, FindSave(path));
  return save.has_value();
}

absl::StatusOr<InputModel> Fsdp1ShardedInput::Read(const std::string& path,
                                                   const ReadOptions& /*options*/) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) {
    return absl::NotFoundError(absl::StrCat(path, ": not an FSDP1 sharded state dict folder"));
  }
  ASSIGN_OR_RETURN(std::optional<RankFiles> save, FindSave(path));
  if (!save.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        path,
        ": no <prefix>rank{N}.pt file holding ShardedTensors: not an FSDP1 sharded state "
        "dict folder"));
  }
  Fsdp1Reader reader(path, *std::move(save));
  return reader.Read();
}

namespace {
const InputFormatRegistration<Fsdp1ShardedInput> register_input;
}  // namespace

}  // namespace reshard
