// The tensors of a save whose every rank file holds boxes of each tensor (verl's DTensors,
// FSDP1's ShardedTensors): pieces gathered rank by rank, checked, and turned into Catalog
// tensors.
//
// Every rank holds every tensor, under the same dtype and global shape, in rank 0's order of
// names. A box held by several ranks (a replicated placement, or a plain tensor every rank
// saves) is read once; its other copies are kept as replicas for `verify` to compare. The boxes
// read must tile each tensor exactly.

#ifndef RESHARD_LIB_FORMATS_FSDP_RANK_PIECES_H_
#define RESHARD_LIB_FORMATS_FSDP_RANK_PIECES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {

// One rank's torch.save state dict, opened for its metadata.
struct RankStateDict {
  std::unique_ptr<TorchArchive> archive;
  // Its entries under their keys, in the pickle's order.
  std::vector<std::pair<std::string, const PickleValue*>> entries;
};

// Opens the rank file `path` and checks every global of its pickle with `check_globals` (whose
// error is prefixed with the path). DataLoss naming the path for a pickle that is no dict, or a
// key that is no string.
absl::StatusOr<RankStateDict> OpenRankStateDict(
    const std::string& path, const std::function<absl::Status(const PickleValue*)>& check_globals);

// Opens the rank files `paths` (by rank) with OpenRankStateDict, several at once once reads are
// slow (ReadInOrder: a save's many rank files on S3 cost round trips in parallel, not in
// sequence), and hands each to `take(rank, state)` on the calling thread, in rank order. The
// first error in rank order is returned; files after it are not opened.
absl::Status OpenRankStateDictsInOrder(
    const std::vector<std::string>& paths,
    const std::function<absl::Status(const PickleValue*)>& check_globals,
    absl::FunctionRef<absl::Status(int64_t rank, RankStateDict state)> take);

// The piece of box `box` whose elements are at `location` of source file `file`.
SourcePiece PieceAt(const TensorLocation& location, Box box, int file);

class RankPieces {
 public:
  // `paths` names the file of each rank (by rank), for messages.
  explicit RankPieces(std::vector<std::string> paths) : paths_(std::move(paths)) {}

  // Rank `rank` holds tensor `name` of `dtype` and global shape `global` (its pieces follow
  // with AddPiece). Ranks come in order, rank 0 first. DataLoss prefixed with `where` (the
  // file and tensor) for a name rank 0 does not hold, a name given twice by one rank, or a
  // dtype or shape other than rank 0's.
  absl::Status AddRank(const std::string& name, DType dtype, const Shape& global, int64_t rank,
                       const std::string& where);
  // A piece of tensor `name` of the rank last added (AddRank). A piece without elements
  // (torch.chunk left its rank nothing) is dropped; one whose box an earlier piece has is kept
  // as a replica.
  void AddPiece(const std::string& name, SourcePiece piece);

  // The Catalog tensors, in rank 0's order. DataLoss naming `dir` and the tensor for a tensor
  // some rank lacks, elements no rank holds, or boxes that overlap.
  absl::StatusOr<std::vector<CatalogTensor>> Finish(const std::string& dir);
  int64_t replicated_copies() const { return replicated_copies_; }

 private:
  struct Param {
    std::string name;
    DType dtype = DType::kF32;
    Shape shape;
    std::vector<SourcePiece> pieces;
    std::vector<SourcePiece> replicas;
    int64_t ranks_seen = 0;
  };

  std::vector<std::string> paths_;
  std::vector<Param> params_;
  absl::flat_hash_map<std::string, size_t> index_;
  int64_t replicated_copies_ = 0;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_RANK_PIECES_H_
