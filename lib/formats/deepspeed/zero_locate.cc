#include "lib/formats/deepspeed/zero_locate.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "lib/core/dtype.h"
#include "lib/core/status.h"
#include "lib/formats/deepspeed/zero_layout.h"

namespace reshard {
namespace zero_internal {
namespace {

std::vector<int64_t> FlatSizes(const std::vector<FlatTensor>& flats) {
  std::vector<int64_t> sizes;
  for (const FlatTensor& flat : flats) sizes.push_back(flat.numel);
  return sizes;
}

// Appends the pieces of `runs` to `tensor`, out of the flat tensors `member` of each rank.
absl::Status AddRuns(const ZeroFlats& in, CatalogTensor& tensor, const std::vector<ZeroRun>& runs,
                     std::vector<FlatTensor> RankFlats::*member, absl::string_view key) {
  for (const ZeroRun& run : runs) {
    const std::vector<FlatTensor>& groups = in.flats[run.rank].*member;
    if (run.group >= static_cast<int>(groups.size()) ||
        run.offset + run.count > groups[run.group].numel) {
      return absl::DataLossError(absl::StrCat(
          in.optimizer_paths[run.rank], ": \"", tensor.name, "\" needs elements [", run.offset,
          ", ", run.offset + run.count, ") of ", key, "[", run.group, "], which ",
          run.group >= static_cast<int>(groups.size())
              ? "does not exist"
              : absl::StrCat("has ", groups[run.group].numel)));
    }
    const FlatTensor& flat = groups[run.group];
    AddFlatRangePieces(tensor, flat.file,
                       flat.byte_offset + static_cast<uint64_t>(run.offset) * sizeof(float),
                       run.begin, run.begin + run.count);
  }
  return absl::OkStatus();
}

// Trainable params (and their moments into `moments`) from the per-rank flat tensors.
absl::Status Locate(const ZeroFlats& in, const std::vector<std::vector<ZeroRun>>& runs,
                    absl::string_view key, std::vector<CatalogTensor>& trainable,
                    std::vector<CatalogTensor>& moments) {
  for (size_t p = 0; p < in.params.size(); ++p) {
    CatalogTensor tensor{in.params[p].name, DType::kF32, in.params[p].shape, {}};
    RETURN_IF_ERROR(AddRuns(in, tensor, runs[p], &RankFlats::fp32, key));
    trainable.push_back(std::move(tensor));
  }
  if (!in.include_optimizer) return absl::OkStatus();
  for (size_t p = 0; p < in.params.size(); ++p) {
    for (auto [suffix, member] : {std::make_pair(".exp_avg", &RankFlats::exp_avg),
                                  std::make_pair(".exp_avg_sq", &RankFlats::exp_avg_sq)}) {
      CatalogTensor tensor{
          absl::StrCat(in.params[p].name, suffix), DType::kF32, in.params[p].shape, {}};
      RETURN_IF_ERROR(AddRuns(in, tensor, runs[p], member, absl::StrCat(key, suffix)));
      moments.push_back(std::move(tensor));
    }
  }
  return absl::OkStatus();
}

// Checks one flat tensor's length against a ZeRO-1/2 group layout.
absl::Status CheckZero12Length(const ZeroFlats& in, const Zero12GroupLayout& layout, int rank,
                               int group, const FlatTensor& flat, absl::string_view what) {
  const int64_t unpadded = layout.UnpaddedLength(rank);
  if (flat.numel == unpadded || flat.numel == layout.partition) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat(in.optimizer_paths[rank], ": ", what, "[", group, "] has ", flat.numel,
                   " elements, but param_shapes[", group, "] (", layout.total, " elements over ",
                   in.world, " ranks: partitions of ", layout.partition, ") puts ", unpadded,
                   " on rank ", rank, " (", layout.partition, " with padding)"));
}

// `group_paddings[g]` of a rank, when recorded, agrees with param_shapes: the padding of
// §1.4 (P_g minus the rank's real elements), or A_g - T_g on the last rank and 0 elsewhere
// (older DeepSpeed and BF16_Optimizer).
absl::Status CheckZero12Padding(const ZeroFlats& in, const Zero12GroupLayout& layout, int rank,
                                int group) {
  const std::optional<int64_t>& recorded = in.flats[rank].paddings[group];
  if (!recorded.has_value()) return absl::OkStatus();
  const int64_t padding = layout.partition - layout.UnpaddedLength(rank);
  const int64_t last_rank_padding = rank == in.world - 1 ? layout.aligned - layout.total : 0;
  if (*recorded == padding || *recorded == last_rank_padding) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(in.optimizer_paths[rank], ": group_paddings[", group,
                                          "] is ", *recorded, ", but param_shapes[", group, "] of ",
                                          in.model_name, " (", layout.total, " elements over ",
                                          in.world, " ranks: partitions of ", layout.partition,
                                          ") leaves ", padding, " padding on rank ", rank));
}

}  // namespace

absl::StatusOr<std::vector<CatalogTensor>> LocateZero12(const ZeroFlats& in,
                                                        std::vector<CatalogTensor>& moments) {
  const std::string model_path = in.model_path;
  for (int rank = 0; rank < in.world; ++rank) {
    if (static_cast<int>(in.flats[rank].fp32.size()) != in.param_groups) {
      return absl::DataLossError(
          absl::StrCat(in.optimizer_paths[rank], ": single_partition_of_fp32_groups has ",
                       in.flats[rank].fp32.size(), " groups, but param_shapes of ", model_path,
                       " has ", in.param_groups));
    }
  }
  std::vector<std::vector<ZeroRun>> runs(in.params.size());
  for (int g = 0; g < in.param_groups; ++g) {
    std::vector<int64_t> numels;
    std::vector<size_t> members;
    for (size_t p = 0; p < in.params.size(); ++p) {
      if (in.params[p].group != g) continue;
      numels.push_back(in.params[p].numel);
      members.push_back(p);
    }
    auto layout = LayoutZero12Group(in.world, g, numels);
    if (!layout.ok()) {
      return Annotate(layout.status(), absl::StrCat(model_path, ": param_shapes[", g, "]"));
    }
    // zero_to_fp32's check: the param total and the saved partitions agree once aligned.
    int64_t available = 0;
    for (int rank = 0; rank < in.world; ++rank) {
      // Each length is bounded by its file; the sum is bounded to stay clear of overflow.
      available = std::min(available + in.flats[rank].fp32[g].numel, kZeroMaxElements);
    }
    if (Zero12Align(layout->total, in.world) != Zero12Align(available, in.world)) {
      return absl::DataLossError(absl::StrCat(
          in.dir, ": ", in.setup, ": param_shapes[", g, "] of ", in.model_name, " lists ",
          numels.size(), " params of ", layout->total, " elements (aligned to ", 2 * in.world, ": ",
          layout->aligned, "), but single_partition_of_fp32_groups[", g,
          "] of the optimizer files hold ", available,
          " (aligned: ", Zero12Align(available, in.world), ")"));
    }
    for (int rank = 0; rank < in.world; ++rank) {
      RETURN_IF_ERROR(CheckZero12Padding(in, *layout, rank, g));
      RETURN_IF_ERROR(CheckZero12Length(in, *layout, rank, g, in.flats[rank].fp32[g],
                                        "single_partition_of_fp32_groups"));
      if (in.include_optimizer) {
        RETURN_IF_ERROR(CheckZero12Length(in, *layout, rank, g, in.flats[rank].exp_avg[g],
                                          "base_optimizer_state exp_avg of group"));
        RETURN_IF_ERROR(CheckZero12Length(in, *layout, rank, g, in.flats[rank].exp_avg_sq[g],
                                          "base_optimizer_state exp_avg_sq of group"));
      }
    }
    for (size_t i = 0; i < members.size(); ++i) runs[members[i]] = std::move(layout->params[i]);
  }
  std::vector<CatalogTensor> trainable;
  RETURN_IF_ERROR(Locate(in, runs, "single_partition_of_fp32_groups", trainable, moments));
  return trainable;
}

absl::StatusOr<std::vector<CatalogTensor>> LocateZero3(const ZeroFlats& in,
                                                       std::vector<CatalogTensor>& moments) {
  // Sub-group sizes: rank 0's, and every rank must have the same.
  std::vector<int64_t> sizes;
  for (const FlatTensor& flat : in.flats[0].fp32) sizes.push_back(flat.numel);
  for (int rank = 0; rank < in.world; ++rank) {
    const RankFlats& flats = in.flats[rank];
    for (size_t s = 0; s < std::max(flats.fp32.size(), sizes.size()); ++s) {
      const int64_t got = s < flats.fp32.size() ? flats.fp32[s].numel : -1;
      const int64_t want = s < sizes.size() ? sizes[s] : -1;
      if (got != want) {
        return absl::DataLossError(
            absl::StrCat(in.optimizer_paths[rank], ": fp32_flat_groups has ", flats.fp32.size(),
                         " sub-groups of sizes [", absl::StrJoin(FlatSizes(flats.fp32), ", "),
                         "], but rank 0's has [", absl::StrJoin(sizes, ", "), "]"));
      }
      if (!in.include_optimizer) continue;
      for (auto [what, flat] : {std::make_pair("exp_avg", flats.exp_avg[s]),
                                std::make_pair("exp_avg_sq", flats.exp_avg_sq[s])}) {
        if (flat.numel != want) {
          return absl::DataLossError(absl::StrCat(
              in.optimizer_paths[rank], ": optimizer_state_dict.optimizer_state_dict.state[", s,
              "].", what, " has ", flat.numel, " elements, but fp32_flat_groups[", s, "] has ",
              want));
        }
      }
    }
  }
  std::vector<int64_t> numels;
  for (const ParamInfo& param : in.params) numels.push_back(param.numel);
  auto layout = LayoutZero3(in.world, numels, sizes);
  if (!layout.ok()) {
    // A mismatch of the totals is corrupt input, like every other disagreement of the files.
    const absl::Status status = layout.status().code() == absl::StatusCode::kFailedPrecondition
                                    ? absl::DataLossError(layout.status().message())
                                    : layout.status();
    return Annotate(status,
                    absl::StrCat(in.dir, ": ", in.setup, ": param_shapes of ", in.model_name,
                                 " against fp32_flat_groups of ", in.optimizer0_name));
  }
  std::vector<CatalogTensor> trainable;
  RETURN_IF_ERROR(Locate(in, layout->params, "fp32_flat_groups", trainable, moments));
  return trainable;
}

}  // namespace zero_internal
}  // namespace reshard
