#include "lib/formats/dcp/dcp_metadata.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;

// Pairwise comparisons the overlap check may make before giving up (a pathological chunking
// whose every chunk spans every other along each dimension).
constexpr uint64_t kMaxOverlapComparisons = uint64_t{1} << 27;

// "module.Class" of an object, for messages.
std::string ClassName(const PickleValue* value) {
  if (value != nullptr && value->kind == Kind::kObject && value->callable != nullptr &&
      value->callable->kind == Kind::kGlobal) {
    return absl::StrCat(value->callable->module, ".", value->callable->name);
  }
  return DescribePickleValue(value);
}

bool IsNone(const PickleValue* value) { return value == nullptr || value->kind == Kind::kNone; }

// The dtype of a TensorProperties: the first item of its 5-tuple state (dtype, layout,
// requires_grad, memory format, pin_memory), or its `dtype` field.
const PickleValue* PropertiesDType(const PickleValue* properties) {
  if (properties == nullptr) return nullptr;
  if (properties->kind == Kind::kObject && properties->state != nullptr &&
      properties->state->kind == Kind::kTuple && properties->state->items.size() == 5) {
    return properties->state->items[0];
  }
  return PickleField(properties, "dtype");
}

// (fqn, whether offsets are given, offsets): how torch matches storage_data to chunks.
using StorageKey = std::tuple<std::string, bool, std::vector<int64_t>>;

class MetadataParser {
 public:
  MetadataParser(const std::string& path, const DcpLimits& limits) : path_(path), limits_(limits) {}

  absl::StatusOr<DcpMetadata> Parse(const PickleValue* root) {
    const PickleValue* sdm = PickleField(root, "state_dict_metadata");
    const auto* entries = PickleEntries(sdm);
    if (entries == nullptr) {
      return Error(absl::StrCat("the pickle holds ", ClassName(root),
                                ", not a DCP Metadata with a state_dict_metadata dict"));
    }
    if (static_cast<int64_t>(entries->size()) > limits_.max_entries) {
      return Error(absl::StrCat("state_dict_metadata has ", entries->size(), " entries; at most ",
                                limits_.max_entries, " are read"));
    }
    RETURN_IF_ERROR(IndexStorage(PickleField(root, "storage_data")));
    ReadPlannerData(PickleField(root, "planner_data"));
    if (std::optional<std::string> version = PickleString(PickleField(root, "version"))) {
      metadata_.version = *version;
    }
    absl::flat_hash_map<std::string, int> seen;
    for (const auto& [key, value] : *entries) {
      std::optional<std::string> fqn = PickleString(key);
      if (!fqn.has_value()) {
        return Error(absl::StrCat("state_dict_metadata key is ", DescribePickleValue(key),
                                  ", not a string"));
      }
      if (!seen.emplace(*fqn, 0).second) return EntryError(*fqn, "appears twice");
      ASSIGN_OR_RETURN(DcpEntry entry, ReadEntry(*fqn, value));
      metadata_.entries.push_back(std::move(entry));
    }
    return std::move(metadata_);
  }

 private:
  absl::Status Error(absl::string_view message) const {
    return absl::DataLossError(absl::StrCat(path_, ": ", message));
  }
  absl::Status EntryError(absl::string_view fqn, absl::string_view message) const {
    return absl::DataLossError(absl::StrCat(path_, ": \"", fqn, "\": ", message));
  }

  // storage_data: MetadataIndex -> _StorageInfo, indexed by (fqn, offsets).
  absl::Status IndexStorage(const PickleValue* storage_data) {
    const auto* entries = PickleEntries(storage_data);
    if (entries == nullptr) {
      return Error(absl::StrCat("storage_data is ", DescribePickleValue(storage_data),
                                ", not a dict of MetadataIndex -> _StorageInfo"));
    }
    storage_.reserve(entries->size());
    for (const auto& [key, value] : *entries) {
      std::optional<std::string> fqn = PickleString(PickleField(key, "fqn"));
      if (!fqn.has_value()) {
        return Error(absl::StrCat("storage_data key is ", ClassName(key),
                                  " without a string fqn, not a MetadataIndex"));
      }
      // A BYTE_IO key has no offset: absent from the state (torch only sets it when given) or
      // None.
      const PickleValue* offset = PickleField(key, "offset");
      StorageKey storage_key{*fqn, !IsNone(offset), {}};
      if (!IsNone(offset)) {
        std::optional<std::vector<int64_t>> offsets = PickleShape(offset);
        if (!offsets.has_value() || static_cast<int>(offsets->size()) > limits_.max_rank) {
          return EntryError(*fqn,
                            absl::StrCat("storage_data offset is ", DescribePickleValue(offset),
                                         ", not a torch.Size of non-negative ints"));
        }
        std::get<2>(storage_key) = *std::move(offsets);
      }
      ASSIGN_OR_RETURN(DcpStorage storage, ReadStorageInfo(*fqn, value));
      if (!storage_.emplace(std::move(storage_key), std::move(storage)).second) {
        return EntryError(*fqn, absl::StrCat("storage_data has two entries for the chunk at "
                                             "offsets ",
                                             offset == nullptr ? "(none)" : ShapeOf(offset)));
      }
    }
    return absl::OkStatus();
  }

  static std::string ShapeOf(const PickleValue* value) {
    std::optional<std::vector<int64_t>> shape = PickleShape(value);
    return shape.has_value() ? ShapeToString(*shape) : DescribePickleValue(value);
  }

  absl::StatusOr<DcpStorage> ReadStorageInfo(absl::string_view fqn, const PickleValue* info) {
    DcpStorage storage;
    std::optional<std::string> relative_path = PickleString(PickleField(info, "relative_path"));
    const PickleValue* offset = PickleField(info, "offset");
    const PickleValue* length = PickleField(info, "length");
    if (!relative_path.has_value() || offset == nullptr || offset->kind != Kind::kInt ||
        length == nullptr || length->kind != Kind::kInt) {
      return EntryError(fqn, absl::StrCat("storage_data value is ", ClassName(info),
                                          ", not a _StorageInfo(relative_path, offset, length)"));
    }
    if (offset->integer < 0 || length->integer < 0) {
      return EntryError(
          fqn, absl::StrCat("storage_data gives a negative byte range (offset ", offset->integer,
                            ", length ", length->integer, ") in ", *relative_path));
    }
    storage.relative_path = *std::move(relative_path);
    storage.offset = static_cast<uint64_t>(offset->integer);
    storage.length = static_cast<uint64_t>(length->integer);
    const PickleValue* transforms = PickleField(info, "transform_descriptors");
    if (!IsNone(transforms)) {
      const auto* items = PickleItems(transforms);
      if (items == nullptr) {
        return EntryError(fqn, absl::StrCat("transform_descriptors is ",
                                            DescribePickleValue(transforms), ", not a list"));
      }
      for (const PickleValue* item : *items) {
        std::optional<std::string> descriptor = PickleString(item);
        if (!descriptor.has_value()) {
          return EntryError(fqn, absl::StrCat("transform descriptor is ", DescribePickleValue(item),
                                              ", not a string"));
        }
        storage.transforms.push_back(*std::move(descriptor));
      }
    }
    return storage;
  }

  // planner_data of DefaultSavePlanner: {fqn: (key, key, ...)}. Anything else (a custom
  // planner's data) is ignored and the values stay flat under their fqns.
  void ReadPlannerData(const PickleValue* planner_data) {
    const auto* entries = PickleEntries(planner_data);
    if (entries == nullptr) return;
    absl::flat_hash_map<std::string, std::vector<DcpPathItem>> paths;
    for (const auto& [key, value] : *entries) {
      std::optional<std::string> fqn = PickleString(key);
      const auto* items = PickleItems(value);
      if (!fqn.has_value() || items == nullptr || items->empty() ||
          static_cast<int>(items->size()) > limits_.max_path_length) {
        return;
      }
      std::vector<DcpPathItem> path;
      for (const PickleValue* item : *items) {
        DcpPathItem element;
        if (item->kind == Kind::kString) {
          element.key = item->text;
        } else if (item->kind == Kind::kInt && item->integer >= 0) {
          element.is_index = true;
          element.index = item->integer;
        } else {
          return;
        }
        path.push_back(std::move(element));
      }
      paths[*fqn] = std::move(path);
    }
    planner_paths_ = std::move(paths);
    metadata_.has_planner_data = true;
  }

  const DcpStorage* FindStorage(const std::string& fqn, bool has_offsets,
                                const std::vector<int64_t>& offsets) const {
    auto it = storage_.find(StorageKey{fqn, has_offsets, offsets});
    return it == storage_.end() ? nullptr : &it->second;
  }

  absl::StatusOr<DcpEntry> ReadEntry(const std::string& fqn, const PickleValue* value) {
    DcpEntry entry;
    entry.fqn = fqn;
    if (auto it = planner_paths_.find(fqn); it != planner_paths_.end()) entry.path = it->second;
    const PickleValue* chunks_value = PickleField(value, "chunks");
    if (chunks_value == nullptr) {
      if (value == nullptr || value->kind != Kind::kObject ||
          !absl::EndsWith(ClassName(value), "BytesStorageMetadata")) {
        return EntryError(fqn, absl::StrCat("entry is ", ClassName(value),
                                            ", neither TensorStorageMetadata nor "
                                            "BytesStorageMetadata"));
      }
      const DcpStorage* storage = FindStorage(fqn, false, {});
      if (storage == nullptr) {
        return EntryError(fqn, "value (BytesStorageMetadata) has no storage_data entry");
      }
      entry.storage.push_back(*storage);
      return entry;
    }
    entry.is_tensor = true;
    const PickleValue* dtype = PropertiesDType(PickleField(value, "properties"));
    if (dtype == nullptr || dtype->kind != Kind::kGlobal) {
      return EntryError(fqn, absl::StrCat("TensorProperties without a torch dtype (",
                                          DescribePickleValue(dtype), ")"));
    }
    std::optional<DType> parsed = dtype->module == "torch" ? TorchDType(dtype->name) : std::nullopt;
    if (!parsed.has_value()) {
      return absl::UnimplementedError(absl::StrCat(path_, ": \"", fqn, "\": dtype ", dtype->module,
                                                   ".", dtype->name, " is not supported"));
    }
    entry.dtype = *parsed;
    const PickleValue* size_value = PickleField(value, "size");
    std::optional<std::vector<int64_t>> size = PickleShape(size_value);
    if (!size.has_value() || static_cast<int>(size->size()) > limits_.max_rank) {
      return EntryError(fqn, absl::StrCat("size is ", DescribePickleValue(size_value),
                                          ", not a torch.Size of at most ", limits_.max_rank,
                                          " non-negative ints"));
    }
    absl::StatusOr<int64_t> count = NumElements(*size);
    if (!count.ok()) return EntryError(fqn, count.status().message());
    entry.size = *std::move(size);
    const auto* chunks = PickleItems(chunks_value);
    if (chunks == nullptr) {
      return EntryError(
          fqn, absl::StrCat("chunks is ", DescribePickleValue(chunks_value), ", not a list"));
    }
    metadata_.chunk_count += static_cast<int64_t>(chunks->size());
    if (metadata_.chunk_count > limits_.max_chunks) {
      return EntryError(
          fqn, absl::StrCat("the checkpoint declares more than ", limits_.max_chunks, " chunks"));
    }
    for (size_t i = 0; i < chunks->size(); ++i) {
      const PickleValue* chunk = (*chunks)[i];
      std::optional<std::vector<int64_t>> offsets = PickleShape(PickleField(chunk, "offsets"));
      std::optional<std::vector<int64_t>> sizes = PickleShape(PickleField(chunk, "sizes"));
      if (!offsets.has_value() || !sizes.has_value()) {
        return EntryError(fqn, absl::StrCat("chunk ", i, " is ", ClassName(chunk),
                                            ", not a ChunkStorageMetadata(offsets, sizes) of "
                                            "non-negative ints"));
      }
      if (offsets->size() != entry.size.size() || sizes->size() != entry.size.size()) {
        return EntryError(fqn, absl::StrCat("chunk ", i, " has offsets ", ShapeToString(*offsets),
                                            " and sizes ", ShapeToString(*sizes),
                                            " for a tensor of size ", ShapeToString(entry.size)));
      }
      const DcpStorage* storage = FindStorage(fqn, true, *offsets);
      if (storage == nullptr) {
        return EntryError(fqn, absl::StrCat("chunk ", i, " at offsets ", ShapeToString(*offsets),
                                            " has no storage_data entry"));
      }
      entry.storage.push_back(*storage);
      entry.chunks.push_back(Box{*std::move(offsets), *std::move(sizes)});
    }
    return entry;
  }

  const std::string& path_;
  const DcpLimits& limits_;
  DcpMetadata metadata_;
  absl::flat_hash_map<StorageKey, DcpStorage> storage_;
  absl::flat_hash_map<std::string, std::vector<DcpPathItem>> planner_paths_;
};

}  // namespace

absl::StatusOr<DcpMetadata> ParseDcpMetadata(absl::string_view bytes, const std::string& path,
                                             const DcpLimits& limits) {
  PickleArena arena;
  ASSIGN_OR_RETURN(PickleValue* const root, ParsePickle(bytes, arena, /*persistent_load=*/{}),
                   path);
  MetadataParser parser(path, limits);
  return parser.Parse(root);
}

absl::Status CheckChunkTiling(const Shape& size, const std::vector<Box>& chunks) {
  const Box full = Box::Full(size);
  ASSIGN_OR_RETURN(const int64_t total, NumElements(size));
  // Inside the tensor; the covered volume, in 128 bits (a hostile chunk list may sum past 2^63).
  unsigned __int128 covered = 0;
  std::vector<size_t> filled;  // chunks with at least one element
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Box& chunk = chunks[i];
    bool inside = chunk.rank() == size.size();
    for (size_t d = 0; inside && d < chunk.rank(); ++d) {
      inside = chunk.origin[d] >= 0 && chunk.extent[d] >= 0 && chunk.origin[d] <= size[d] &&
               chunk.extent[d] <= size[d] - chunk.origin[d];
    }
    if (!inside) {
      return absl::DataLossError(absl::StrCat("chunk ", i, " ", BoxToString(chunk),
                                              " does not lie inside the tensor's size ",
                                              ShapeToString(size)));
    }
    const int64_t volume = NumElementsUnchecked(chunk.extent);  // <= total: inside the tensor
    covered += static_cast<uint64_t>(volume);
    if (volume > 0) filled.push_back(i);
  }
  // No two chunks overlap. Sweep along the dimension whose chunk origins are most varied, so
  // that row- or column-sharded tensors compare only neighbours.
  if (!size.empty() && filled.size() > 1) {
    size_t sweep = 0;
    size_t best = 0;
    for (size_t d = 0; d < size.size(); ++d) {
      std::vector<int64_t> origins;
      origins.reserve(filled.size());
      for (size_t i : filled) origins.push_back(chunks[i].origin[d]);
      std::sort(origins.begin(), origins.end());
      const size_t distinct = std::unique(origins.begin(), origins.end()) - origins.begin();
      if (distinct > best) {
        best = distinct;
        sweep = d;
      }
    }
    std::sort(filled.begin(), filled.end(), [&](size_t a, size_t b) {
      return std::make_pair(chunks[a].origin[sweep], a) <
             std::make_pair(chunks[b].origin[sweep], b);
    });
    uint64_t comparisons = 0;
    for (size_t x = 0; x < filled.size(); ++x) {
      const Box& a = chunks[filled[x]];
      const int64_t end = a.origin[sweep] + a.extent[sweep];
      for (size_t y = x + 1; y < filled.size() && chunks[filled[y]].origin[sweep] < end; ++y) {
        if (++comparisons > kMaxOverlapComparisons) {
          return absl::UnimplementedError(absl::StrCat(
              chunks.size(), " chunks overlap along every dimension too often to be checked"));
        }
        const Box& b = chunks[filled[y]];
        if (Intersect(a, b).has_value()) {
          const size_t i = std::min(filled[x], filled[y]);
          const size_t j = std::max(filled[x], filled[y]);
          return absl::DataLossError(absl::StrCat("chunks ", i, " ", BoxToString(chunks[i]),
                                                  " and ", j, " ", BoxToString(chunks[j]),
                                                  " overlap"));
        }
      }
    }
  }
  if (covered > static_cast<uint64_t>(total)) {  // only 0-d tensors get here without overlap
    return absl::DataLossError(absl::StrCat(
        "its ", chunks.size(), " chunks hold ", static_cast<uint64_t>(covered),
        " elements, more than its ", total, " (size ", ShapeToString(size), "): they overlap"));
  }
  if (covered != static_cast<uint64_t>(total)) {
    return absl::DataLossError(absl::StrCat(
        "its ", chunks.size(), chunks.size() == 1 ? " chunk covers " : " chunks cover ",
        static_cast<uint64_t>(covered), " of its ", total, " elements (size ", ShapeToString(size),
        "): the checkpoint lacks data for ",
        static_cast<uint64_t>(total - static_cast<int64_t>(covered)), " of them"));
  }
  return absl::OkStatus();
}

}  // namespace reshard
