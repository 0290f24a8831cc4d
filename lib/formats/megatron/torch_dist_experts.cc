#include "lib/formats/megatron/torch_dist_experts.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/core/shape.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/megatron/megatron_layout.h"

namespace reshard {
namespace {

bool IsIndex(absl::string_view part) {
  return !part.empty() && std::all_of(part.begin(), part.end(), absl::ascii_isdigit);
}

// The axis of a DCP tensor `fqn` that holds its experts: 1 in a layer-stacked key, 0 in a
// per-layer one; nullopt when `fqn` has no expert axis.
std::optional<size_t> ExpertAxis(absl::string_view fqn) {
  const std::optional<TorchDistExpertKey> key = ParseTorchDistExpertKey(fqn);
  if (!key.has_value() || key->expert >= 0) return std::nullopt;
  return SplitLayerStacked(fqn).has_value() ? 1 : 0;
}

// A box without its axis `axis`.
Box DropAxis(const Box& box, size_t axis) {
  Box out = box;
  out.origin.erase(out.origin.begin() + axis);
  out.extent.erase(out.extent.begin() + axis);
  return out;
}

// "expert 3", "experts 2 to 3" (the global ids `chunk` holds along `axis`), or "" when it holds
// none or has no such axis.
std::string ExpertsOf(const Box& chunk, size_t axis) {
  if (axis >= chunk.rank() || chunk.extent[axis] <= 0) return "";
  const int64_t first = chunk.origin[axis];
  if (chunk.extent[axis] == 1) return absl::StrCat("expert ", first);
  return absl::StrCat("experts ", first, " to ", first + (chunk.extent[axis] - 1));
}

// Chunk `c` of `entry` and where it is stored: "chunk [0:2, 1:2] in DIR/FILE at byte offset N".
std::string DescribeChunk(const std::string& dir, const DcpEntry& entry, size_t c) {
  std::string out = absl::StrCat("chunk ", BoxToString(entry.chunks[c]));
  if (c < entry.storage.size()) {
    absl::StrAppend(&out, " in ", JoinPath(dir, entry.storage[c].relative_path), " at byte offset ",
                    entry.storage[c].offset);
  }
  return out;
}

// Why chunk `chunk` cannot be one of a tensor of `size`: it has another rank or lies outside the
// tensor along some axis; nullopt when it lies inside.
std::optional<std::string> OutsideTheTensor(const Box& chunk, const Shape& size) {
  if (chunk.rank() != size.size()) {
    return absl::StrCat("has ", chunk.rank(), chunk.rank() == 1 ? " dimension" : " dimensions",
                        ", the tensor ", size.size());
  }
  for (size_t d = 0; d < chunk.rank(); ++d) {
    if (chunk.origin[d] < 0 || chunk.extent[d] < 0 || chunk.origin[d] > size[d] ||
        chunk.extent[d] > size[d] - chunk.origin[d]) {
      return absl::StrCat("lies outside the tensor along axis ", d);
    }
  }
  return std::nullopt;
}

// Upper bounds of the expert check's work; a `.metadata` beyond them is left to the generic
// chunk tiling check.
constexpr int64_t kMaxExpertHoldings = int64_t{1} << 24;
constexpr int64_t kMaxPairComparisons = int64_t{1} << 22;

}  // namespace

std::optional<std::pair<std::string, std::string>> SplitLayerStacked(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] != "layers") continue;
    if (IsIndex(parts[i + 1])) return std::nullopt;  // per-layer names: not stacked
    return std::make_pair(
        absl::StrCat(absl::StrJoin(parts.begin(), parts.begin() + i + 1, "."), "."),
        std::string(absl::StrJoin(parts.begin() + i + 1, parts.end(), ".")));
  }
  return std::nullopt;
}

std::optional<TorchDistExpertKey> ParseTorchDistExpertKey(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  for (size_t i = 1; i + 2 < parts.size(); ++i) {
    if (parts[i - 1] != "mlp" || parts[i] != "experts") continue;
    const absl::string_view form = parts[i + 1];
    if (form != "experts" && form != "local_experts") return std::nullopt;
    TorchDistExpertKey key;
    key.experts = absl::StrJoin(parts.begin(), parts.begin() + i + 1, ".");
    if (!IsIndex(parts[i + 2])) {
      key.rest = absl::StrJoin(parts.begin() + i + 2, parts.end(), ".");
      return key;
    }
    // local_experts.<l> is already one expert's tensor (a legacy save's name).
    if (form != "experts" || i + 3 >= parts.size()) return std::nullopt;
    const std::optional<int> expert = ParseMegatronIndex(parts[i + 2]);
    if (!expert.has_value()) return std::nullopt;
    key.expert = *expert;
    key.rest = absl::StrJoin(parts.begin() + i + 3, parts.end(), ".");
    return key;
  }
  return std::nullopt;
}

std::string TorchDistExpertName(const TorchDistExpertKey& key, int64_t expert) {
  return absl::StrCat(key.experts, ".local_experts.", expert, ".", key.rest);
}

absl::Status CheckExpertChunks(const std::string& dir, const DcpMetadata& metadata,
                               const std::string& metadata_path) {
  for (const DcpEntry& entry : metadata.entries) {
    if (!entry.is_tensor) continue;
    const std::optional<size_t> axis = ExpertAxis(entry.fqn);
    if (!axis.has_value() || *axis >= entry.size.size()) continue;
    const int64_t experts = entry.size[*axis];
    if (experts > kMaxMegatronIndex) {
      return absl::DataLossError(absl::StrCat(metadata_path, ": tensor \"", entry.fqn, "\" has ",
                                              experts, " experts along its axis ", *axis,
                                              "; reshard reads at most ", kMaxMegatronIndex));
    }
    const std::string where =
        absl::StrCat(metadata_path, ": tensor \"", entry.fqn, "\" ", ShapeToString(entry.size),
                     " (experts along axis ", *axis, "): ");
    int64_t holdings = 0;
    for (size_t c = 0; c < entry.chunks.size(); ++c) {
      const Box& chunk = entry.chunks[c];
      if (std::optional<std::string> outside = OutsideTheTensor(chunk, entry.size)) {
        const std::string held = ExpertsOf(chunk, *axis);
        return absl::DataLossError(
            absl::StrCat(where, held.empty() ? "" : absl::StrCat(held, " of ", experts, ": "),
                         DescribeChunk(dir, entry, c), " ", *outside,
                         *axis < chunk.rank() ? "" : ", and no expert axis"));
      }
      holdings += chunk.extent[*axis];
    }
    if (holdings > kMaxExpertHoldings) continue;
    std::vector<std::vector<size_t>> holders(experts);
    for (size_t c = 0; c < entry.chunks.size(); ++c) {
      const Box& chunk = entry.chunks[c];
      for (int64_t e = chunk.origin[*axis]; e < chunk.origin[*axis] + chunk.extent[*axis]; ++e) {
        holders[e].push_back(c);
      }
    }
    Shape size = entry.size;
    size.erase(size.begin() + *axis);
    const int64_t elements = NumElementsUnchecked(size);
    for (int64_t e = 0; e < experts; ++e) {
      std::vector<Box> boxes;
      for (size_t c : holders[e]) boxes.push_back(DropAxis(entry.chunks[c], *axis));
      if (CheckChunkTiling(size, boxes).ok()) continue;
      // Stored twice: the first two chunks that overlap within the expert.
      int64_t comparisons = 0;
      for (size_t x = 0; x < boxes.size() && comparisons < kMaxPairComparisons; ++x) {
        for (size_t y = x + 1; y < boxes.size() && comparisons < kMaxPairComparisons; ++y) {
          ++comparisons;
          if (NumElementsUnchecked(boxes[x].extent) == 0 ||
              NumElementsUnchecked(boxes[y].extent) == 0 || !Intersect(boxes[x], boxes[y])) {
            continue;
          }
          return absl::DataLossError(absl::StrCat(
              where, "expert ", e, " of ", experts,
              " is stored twice: ", DescribeChunk(dir, entry, holders[e][x]), ", and ",
              DescribeChunk(dir, entry, holders[e][y]),
              "; each expert of a Megatron-Core save is held by one expert-parallel rank"));
        }
      }
      int64_t covered = 0;
      for (const Box& box : boxes) covered += NumElementsUnchecked(box.extent);
      return absl::DataLossError(absl::StrCat(
          where, "expert ", e, " of ", experts, " is missing: ",
          covered == 0
              ? std::string("no chunk holds it")
              : absl::StrCat("its chunks hold ", covered, " of its ", elements, " elements"),
          "; a Megatron-Core save holds every expert once, saved by its expert-parallel rank"));
    }
  }
  return absl::OkStatus();
}

std::string WithoutLayerIndex(absl::string_view name) {
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "layers" && IsIndex(parts[i + 1])) {
      parts.erase(parts.begin() + i + 1);
      break;
    }
  }
  return absl::StrJoin(parts, ".");
}

}  // namespace reshard
