#include "lib/formats/colossalai/colossalai_meta.h"

#include <algorithm>
#include <functional>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

using Json = nlohmann::json;

// Dimensions a parameter may have, and the largest size a dimension may claim.
constexpr size_t kMaxRank = 64;
constexpr int64_t kMaxDim = int64_t{1} << 48;

absl::StatusOr<std::vector<int64_t>> IntList(const Json& entry, const char* field,
                                             const std::string& where) {
  auto it = entry.find(field);
  if (it == entry.end() || !it->is_array() || it->size() > kMaxRank) {
    return absl::DataLossError(
        absl::StrCat(where, ": \"", field, "\" is missing or not a list of sizes"));
  }
  std::vector<int64_t> values;
  for (const Json& value : *it) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > kMaxDim) {
      return absl::DataLossError(
          absl::StrCat(where, ": \"", field, "\" holds ", value.dump(), ", not a size"));
    }
    values.push_back(value.get<int64_t>());
  }
  return values;
}

}  // namespace

std::optional<int64_t> ColossalMetaDistId(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kColossalMetaPrefix)) return std::nullopt;
  if (!absl::ConsumeSuffix(&name, ".index.json") && !absl::ConsumeSuffix(&name, ".json")) {
    return std::nullopt;
  }
  int64_t id = 0;
  if (name.empty() || !std::all_of(name.begin(), name.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(name, &id)) {
    return std::nullopt;
  }
  return id;
}

absl::StatusOr<ColossalMeta> ParseColossalMeta(absl::string_view json, const std::string& path,
                                               int64_t dist_id) {
  Json doc = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::DataLossError(absl::StrCat(path, ": not valid JSON"));
  auto metadata = doc.is_object() ? doc.find("metadata") : doc.end();
  if (metadata == doc.end() || !metadata->is_object()) {
    return absl::DataLossError(
        absl::StrCat(path,
                     ": no \"metadata\" object (a ColossalAI distributed checkpoint's "
                     "metadata file maps each parameter to its box)"));
  }
  ColossalMeta meta;
  meta.dist_id = dist_id;
  meta.path = path;
  absl::flat_hash_set<std::string> names;
  for (auto it = metadata->begin(); it != metadata->end(); ++it) {
    const std::string where = absl::StrCat(path, ": parameter \"", it.key(), "\"");
    const Json& entry = it.value();
    if (!entry.is_object()) return absl::DataLossError(absl::StrCat(where, ": not an object"));
    if (!names.insert(it.key()).second) {
      return absl::DataLossError(absl::StrCat(where, ": listed twice"));
    }
    ColossalParam param;
    param.name = it.key();
    absl::StatusOr<std::vector<int64_t>> offsets = IntList(entry, "offsets", where);
    if (!offsets.ok()) return offsets.status();
    absl::StatusOr<std::vector<int64_t>> lengths = IntList(entry, "lengths", where);
    if (!lengths.ok()) return lengths.status();
    absl::StatusOr<std::vector<int64_t>> global = IntList(entry, "global_shape", where);
    if (!global.ok()) return global.status();
    if (offsets->size() != global->size() || lengths->size() != global->size()) {
      return absl::DataLossError(absl::StrCat(
          where, ": offsets ", ShapeToString(*offsets), ", lengths ", ShapeToString(*lengths),
          " and global_shape ", ShapeToString(*global), " have different numbers of dimensions"));
    }
    for (size_t d = 0; d < global->size(); ++d) {
      if ((*offsets)[d] + (*lengths)[d] > (*global)[d]) {
        return absl::DataLossError(absl::StrCat(
            where, ": the box at offsets ", ShapeToString(*offsets), " with lengths ",
            ShapeToString(*lengths), " reaches beyond global_shape ", ShapeToString(*global)));
      }
    }
    auto file = entry.find("file");
    if (file == entry.end() || !file->is_string() || file->get<std::string>().empty()) {
      return absl::DataLossError(absl::StrCat(where, ": \"file\" is missing or not a name"));
    }
    auto rank = entry.find("rank");
    if (rank != entry.end() && rank->is_number_integer()) param.rank = rank->get<int64_t>();
    param.box.origin = *std::move(offsets);
    param.box.extent = *std::move(lengths);
    param.global_shape = *std::move(global);
    param.file = file->get<std::string>();
    meta.params.push_back(std::move(param));
  }
  return meta;
}

std::optional<Box> FindUncoveredBox(const Shape& shape, const std::vector<Box>& boxes,
                                    uint64_t max_cells) {
  const size_t rank = shape.size();
  // Every box boundary cuts its dimension; the cells between cuts are covered whole or not at
  // all by each box.
  std::vector<std::vector<int64_t>> cuts(rank);
  uint64_t cells = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (shape[d] == 0) return std::nullopt;  // no elements, no hole
    cuts[d] = {0, shape[d]};
    for (const Box& box : boxes) {
      if (box.rank() != rank) continue;
      cuts[d].push_back(std::clamp<int64_t>(box.origin[d], 0, shape[d]));
      cuts[d].push_back(std::clamp<int64_t>(box.origin[d] + box.extent[d], 0, shape[d]));
    }
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    cells *= cuts[d].size() - 1;
    if (cells > max_cells) return std::nullopt;
  }
  auto covered = [&](const std::vector<size_t>& cell) {
    for (const Box& box : boxes) {
      if (box.rank() != rank) continue;
      bool inside = true;
      for (size_t d = 0; inside && d < rank; ++d) {
        inside = box.origin[d] <= cuts[d][cell[d]] &&
                 cuts[d][cell[d] + 1] <= box.origin[d] + box.extent[d];
      }
      if (inside) return true;
    }
    return false;
  };
  // Whether every cell of [lo, hi) is uncovered.
  std::function<bool(std::vector<size_t>&, size_t, const std::vector<size_t>&,
                     const std::vector<size_t>&)>
      all_uncovered = [&](std::vector<size_t>& cell, size_t d, const std::vector<size_t>& lo,
                          const std::vector<size_t>& hi) {
        if (d == rank) return !covered(cell);
        for (cell[d] = lo[d]; cell[d] < hi[d]; ++cell[d]) {
          if (!all_uncovered(cell, d + 1, lo, hi)) return false;
        }
        return true;
      };
  std::vector<size_t> cell(rank, 0);
  std::vector<size_t> lo;
  bool found = false;
  for (uint64_t i = 0; i < cells && !found; ++i) {
    if (!covered(cell)) {
      lo = cell;
      found = true;
      break;
    }
    for (size_t d = rank; d-- > 0;) {  // row-major increment
      if (++cell[d] < cuts[d].size() - 1) break;
      cell[d] = 0;
    }
  }
  if (!found) return std::nullopt;
  // Grow the hole along each dimension while the next slab of cells is uncovered too.
  std::vector<size_t> hi = lo;
  for (size_t d = 0; d < rank; ++d) hi[d] = lo[d] + 1;
  for (size_t d = 0; d < rank; ++d) {
    while (hi[d] + 1 < cuts[d].size()) {
      std::vector<size_t> slab_lo = lo, slab_hi = hi;
      slab_lo[d] = hi[d];
      slab_hi[d] = hi[d] + 1;
      std::vector<size_t> scratch(rank);
      if (!all_uncovered(scratch, 0, slab_lo, slab_hi)) break;
      ++hi[d];
    }
  }
  Box hole;
  for (size_t d = 0; d < rank; ++d) {
    hole.origin.push_back(cuts[d][lo[d]]);
    hole.extent.push_back(cuts[d][hi[d]] - cuts[d][lo[d]]);
  }
  return hole;
}

std::string BoxRanges(const Box& box) {
  if (box.rank() == 0) return "(all of it)";
  std::vector<std::string> ranges;
  for (size_t d = 0; d < box.rank(); ++d) {
    ranges.push_back(absl::StrCat("[", box.origin[d], ", ", box.origin[d] + box.extent[d], ")"));
  }
  return absl::StrJoin(ranges, " x ");
}

}  // namespace reshard
