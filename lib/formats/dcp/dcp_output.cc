#include "lib/formats/dcp/dcp_output.h"

#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/dcp/dcp_format.h"
#include "lib/formats/dcp/dcp_metadata.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_archive_writer.h"

namespace reshard {
namespace {

constexpr char kMetadataModule[] = "torch.distributed.checkpoint.metadata";
constexpr char kFilesystemModule[] = "torch.distributed.checkpoint.filesystem";
// What torch.save onto a stream names the archive's top folder.
constexpr char kArchiveTop[] = "archive";

// ---- torch's flatten_state_dict on the input's nesting.

// A leaf of the flattened state dict: a tensor (kTensor, naming a Catalog tensor) or a value.
struct FlatLeaf {
  std::vector<DcpPathItem> path;
  std::string fqn;  // the path joined by "."
  const StructureNode* node = nullptr;
};

// str(key) of a dict key, as torch's traversal turns every key into a path string.
absl::StatusOr<std::string> KeyText(const StructureNode& key) {
  using Kind = StructureNode::Kind;
  switch (key.kind) {
    case Kind::kString:
      return key.text;
    case Kind::kInt:
      return absl::StrCat(key.integer);
    case Kind::kBool:
      return std::string(key.boolean ? "True" : "False");
    case Kind::kNone:
      return std::string("None");
    default:
      return absl::UnimplementedError(
          "a dict key that is not a str, int, bool or None cannot be written as a DCP key path");
  }
}

// torch's _is_terminal: dicts never are; lists are unless they hold a tensor, a dict or a
// non-terminal list; everything else (tuples included) is.
bool IsTerminal(const StructureNode& node) {
  using Kind = StructureNode::Kind;
  if (node.kind == Kind::kDict) return false;
  if (node.kind != Kind::kList) return true;
  for (const StructureNode& item : node.items) {
    if (item.kind == Kind::kTensor || item.kind == Kind::kDict) return false;
    if (item.kind == Kind::kList && !IsTerminal(item)) return false;
  }
  return true;
}

std::string JoinKeyPath(const std::vector<DcpPathItem>& path) {
  return absl::StrJoin(path, ".", [](std::string* out, const DcpPathItem& item) {
    absl::StrAppend(out, item.is_index ? absl::StrCat(item.index) : item.key);
  });
}

absl::Status FlattenInto(const StructureNode& node, std::vector<DcpPathItem>& path,
                         std::vector<FlatLeaf>& leaves) {
  if (node.kind == StructureNode::Kind::kDict) {
    for (size_t i = 0; i < node.keys.size() && i < node.values.size(); ++i) {
      absl::StatusOr<std::string> key = KeyText(node.keys[i]);
      if (!key.ok())
        return Annotate(key.status(), absl::StrCat("under \"", JoinKeyPath(path), "\""));
      path.push_back(DcpPathItem{false, *std::move(key), 0});
      RETURN_IF_ERROR(FlattenInto(node.values[i], path, leaves));
      path.pop_back();
    }
    return absl::OkStatus();
  }
  if (IsTerminal(node)) {
    leaves.push_back(FlatLeaf{path, JoinKeyPath(path), &node});
    return absl::OkStatus();
  }
  for (size_t i = 0; i < node.items.size(); ++i) {
    path.push_back(DcpPathItem{true, "", static_cast<int64_t>(i)});
    RETURN_IF_ERROR(FlattenInto(node.items[i], path, leaves));
    path.pop_back();
  }
  return absl::OkStatus();
}

// The leaves of `structure` in torch's order; none when it is not a dict (DCP saves dicts).
absl::StatusOr<std::vector<FlatLeaf>> Flatten(const StructureNode* structure) {
  std::vector<FlatLeaf> leaves;
  if (structure == nullptr || structure->kind != StructureNode::Kind::kDict) return leaves;
  std::vector<DcpPathItem> path;
  RETURN_IF_ERROR(FlattenInto(*structure, path, leaves));
  return leaves;
}

// Adds the names of the tensors inside `node` to `names`.
void TensorsInside(const StructureNode& node, absl::flat_hash_set<std::string>& names) {
  if (node.kind == StructureNode::Kind::kTensor) names.insert(node.text);
  for (const std::vector<StructureNode>* children :
       {&node.keys, &node.values, &node.items, &node.args, &node.state}) {
    for (const StructureNode& child : *children) TensorsInside(child, names);
  }
}

// The tensors that values hold (a tuple of tensors is one leaf of torch's flattening): torch
// pickles them inside the value's item, not as chunks of their own.
absl::flat_hash_set<std::string> TensorsInValues(const std::vector<FlatLeaf>& leaves) {
  absl::flat_hash_set<std::string> names;
  for (const FlatLeaf& leaf : leaves) {
    if (leaf.node->kind != StructureNode::Kind::kTensor) TensorsInside(*leaf.node, names);
  }
  return names;
}

// ---- The data files.

// One write item of a `.distcp` file: a tensor chunk (file tensor `tensor`) or a value.
struct DcpItem {
  std::string fqn;
  int tensor = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct LaidOutFile {
  FileFraming framing;
  std::vector<DcpItem> items;
};

// Values first (only the file carrying the nesting has any), each with the tensors it holds as
// the storages of its archive; then the chunks in file order.
absl::StatusOr<LaidOutFile> LayOutFile(const OutputFileLayout& file) {
  TorchArchiveFramer framer;
  LaidOutFile out;
  ASSIGN_OR_RETURN(std::vector<FlatLeaf> leaves, Flatten(file.structure.get()));
  // By name; a tensor both a chunk and held by a value has its value's copy last (Arrange).
  absl::flat_hash_map<std::string, int> tensor_index;
  for (size_t i = 0; i < file.tensors.size(); ++i) tensor_index[file.tensors[i].name] = i;
  std::vector<bool> in_value(file.tensors.size(), false);
  for (const FlatLeaf& leaf : leaves) {
    if (leaf.node->kind == StructureNode::Kind::kTensor) continue;
    // Storages "0", "1", ... in first-use order; a tensor named twice shares its storage.
    std::vector<int> storages;
    std::vector<uint64_t> storage_bytes;
    absl::flat_hash_map<int, std::string> keys;
    PickleWriter pickle;
    auto write_tensor = [&](int index) -> absl::Status {
      const OutputTensor& tensor = file.tensors[index];
      auto [key, added] = keys.emplace(index, absl::StrCat(storages.size()));
      if (added) {
        storages.push_back(index);
        storage_bytes.push_back(tensor.bytes());
        in_value[index] = true;
      }
      ASSIGN_OR_RETURN(std::string storage_class, TorchStorageClass(tensor.dtype, tensor.name));
      pickle.Tensor(storage_class, key->second, NumElementsUnchecked(tensor.shape()),
                    tensor.shape(), RowMajorStrides(tensor.shape()));
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(PickleStructure(*leaf.node, tensor_index, write_tensor, pickle),
                    absl::StrCat("value \"", leaf.fqn, "\""));
    const uint64_t offset = framer.Add(kArchiveTop, pickle.Finish(), storages, storage_bytes);
    out.items.push_back({leaf.fqn, -1, offset, framer.size() - offset});
  }
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    if (in_value[i]) continue;
    const OutputTensor& tensor = file.tensors[i];
    ASSIGN_OR_RETURN(std::string storage_class, TorchStorageClass(tensor.dtype, tensor.name));
    PickleWriter pickle;  // the chunk as one bare tensor, as DCP's torch.save(chunk) writes it
    pickle.Tensor(storage_class, "0", NumElementsUnchecked(tensor.shape()), tensor.shape(),
                  RowMajorStrides(tensor.shape()));
    const uint64_t offset =
        framer.Add(kArchiveTop, pickle.Finish(), {static_cast<int>(i)}, {tensor.bytes()});
    out.items.push_back({tensor.name, static_cast<int>(i), offset, framer.size() - offset});
  }
  out.framing = framer.Finish();
  return out;
}

// ---- `.metadata`.

struct MetadataChunk {
  Box box;
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct MetadataEntry {
  bool is_tensor = false;
  DType dtype = DType::kF32;
  Shape size;
  std::vector<MetadataChunk> chunks;  // a value: its one item (box unused)
  std::vector<DcpPathItem> path;
};

// Pickles the `.metadata` objects (protocol 2: pickle.load reads any protocol).
class MetadataPickler {
 public:
  // cls.__new__(cls), as the default reduce of a dataclass starts.
  void New(absl::string_view module, absl::string_view name) {
    p_.Global(module, name);
    p_.BeginTuple();
    p_.EndTuple();
    p_.NewObj();
  }
  void Size(const Shape& dims) {
    p_.Global("torch", "Size");
    p_.BeginTuple();
    p_.BeginTuple();
    for (int64_t d : dims) p_.Int(d);
    p_.EndTuple();
    p_.EndTuple();
    p_.Reduce();
  }
  // TensorProperties' __getstate__: (dtype, layout, requires_grad, memory format, pin_memory).
  void Properties(absl::string_view dtype) {
    New(kMetadataModule, "TensorProperties");
    p_.BeginTuple();
    p_.Global("torch", dtype);
    p_.Global("torch.serialization", "_get_layout");
    p_.BeginTuple();
    p_.String("torch.strided");
    p_.EndTuple();
    p_.Reduce();
    p_.Bool(false);
    p_.Global(kMetadataModule, "_MEM_FORMAT_ENCODING");  // TORCH_CONTIGUOUS_FORMAT
    p_.BeginTuple();
    p_.Int(0);
    p_.EndTuple();
    p_.Reduce();
    p_.Bool(false);
    p_.EndTuple();
    p_.Build();
  }
  void Path(const std::vector<DcpPathItem>& path) {
    p_.BeginTuple();
    for (const DcpPathItem& item : path) {
      item.is_index ? p_.Int(item.index) : p_.String(item.key);
    }
    p_.EndTuple();
  }
  // MetadataIndex as torch constructs it: `offset` only for chunks.
  void Index(const std::string& fqn, const MetadataChunk* chunk, int64_t index) {
    New(kMetadataModule, "MetadataIndex");
    p_.BeginDict(false);
    p_.String("fqn");
    p_.String(fqn);
    p_.String("index");
    chunk == nullptr ? p_.None() : p_.Int(index);
    if (chunk != nullptr) {
      p_.String("offset");
      Size(chunk->box.origin);
    }
    p_.EndDict();
    p_.Build();
  }
  void StorageInfo(const MetadataChunk& chunk) {
    New(kFilesystemModule, "_StorageInfo");
    p_.BeginDict(false);
    p_.String("relative_path");
    p_.String(chunk.file);
    p_.String("offset");
    p_.Int(static_cast<int64_t>(chunk.offset));
    p_.String("length");
    p_.Int(static_cast<int64_t>(chunk.length));
    p_.EndDict();
    p_.Build();
  }

  absl::StatusOr<std::string> Metadata(
      const std::vector<std::pair<std::string, MetadataEntry>>& entries) {
    New(kMetadataModule, "Metadata");
    p_.BeginDict(false);
    p_.String("state_dict_metadata");
    p_.BeginDict(false);
    for (const auto& [fqn, entry] : entries) {
      p_.String(fqn);
      if (!entry.is_tensor) {
        New(kMetadataModule, "BytesStorageMetadata");
        continue;
      }
      ASSIGN_OR_RETURN(std::string dtype, TorchDTypeGlobal(entry.dtype, fqn));
      New(kMetadataModule, "TensorStorageMetadata");
      p_.BeginDict(false);
      p_.String("properties");
      Properties(dtype);
      p_.String("size");
      Size(entry.size);
      p_.String("chunks");
      p_.BeginList();
      for (const MetadataChunk& chunk : entry.chunks) {
        New(kMetadataModule, "ChunkStorageMetadata");
        p_.BeginDict(false);
        p_.String("offsets");
        Size(chunk.box.origin);
        p_.String("sizes");
        Size(chunk.box.extent);
        p_.EndDict();
        p_.Build();
      }
      p_.EndList();
      p_.EndDict();
      p_.Build();
    }
    p_.EndDict();
    p_.String("planner_data");
    p_.BeginDict(false);
    for (const auto& [fqn, entry] : entries) {
      p_.String(fqn);
      Path(entry.path);
    }
    p_.EndDict();
    p_.String("storage_data");
    p_.BeginDict(false);
    for (const auto& [fqn, entry] : entries) {
      for (size_t c = 0; c < entry.chunks.size(); ++c) {
        Index(fqn, entry.is_tensor ? &entry.chunks[c] : nullptr, static_cast<int64_t>(c));
        StorageInfo(entry.chunks[c]);
      }
    }
    p_.EndDict();
    p_.String("storage_meta");
    p_.None();
    p_.String("version");
    p_.String("1.0.0");
    p_.EndDict();
    p_.Build();
    return p_.Finish();
  }

 private:
  PickleWriter p_;
};

// Every entry of the checkpoint, in the order of the flattened nesting (then the tensors it
// does not name, in file order), with its chunks in rank order.
absl::StatusOr<std::vector<std::pair<std::string, MetadataEntry>>> CollectEntries(
    const TargetLayout& layout) {
  const OutputFileLayout* carrier = nullptr;
  for (const OutputFileLayout& file : layout.files) {
    if (file.structure != nullptr && carrier == nullptr) carrier = &file;
  }
  ASSIGN_OR_RETURN(std::vector<FlatLeaf> leaves,
                   Flatten(carrier == nullptr ? nullptr : carrier->structure.get()));
  std::vector<std::pair<std::string, MetadataEntry>> entries;
  absl::flat_hash_map<std::string, size_t> index;
  // Tensors are entered under their names, values under their joined paths.
  absl::flat_hash_map<std::string, std::vector<DcpPathItem>> tensor_paths;
  for (const FlatLeaf& leaf : leaves) {
    if (leaf.node->kind == StructureNode::Kind::kTensor) {
      tensor_paths.emplace(leaf.node->text, leaf.path);
    }
  }
  auto entry_for = [&](const std::string& fqn) -> MetadataEntry& {
    auto [it, inserted] = index.emplace(fqn, entries.size());
    if (inserted) entries.emplace_back(fqn, MetadataEntry{});
    return entries[it->second].second;
  };
  for (const OutputFileLayout& file : layout.files) {
    ASSIGN_OR_RETURN(LaidOutFile laid_out, LayOutFile(file), file.name);
    for (const DcpItem& item : laid_out.items) {
      const bool is_tensor = item.tensor >= 0;
      const bool known = index.contains(item.fqn);
      MetadataEntry& entry = entry_for(item.fqn);
      if (known && (entry.is_tensor != is_tensor || !is_tensor)) {
        return absl::InvalidArgumentError(
            absl::StrCat(file.name, ": \"", item.fqn,
                         "\" names two entries of the checkpoint (a tensor and a value, or "
                         "two values whose key paths join to the same name)"));
      }
      MetadataChunk chunk{Box{}, file.name, item.offset, item.length};
      if (!is_tensor) {
        entry.chunks.push_back(std::move(chunk));
        continue;
      }
      const OutputTensor& tensor = file.tensors[item.tensor];
      if (tensor.global_shape.empty() && !tensor.region.extent.empty()) {
        return absl::InternalError(
            absl::StrCat(file.name, ": \"", tensor.name, "\" has no global shape (not arranged)"));
      }
      const Shape& size = tensor.global_shape;
      if (known && (entry.dtype != tensor.dtype || entry.size != size)) {
        return absl::InternalError(
            absl::StrCat("tensor \"", tensor.name, "\": chunks disagree on dtype or global shape"));
      }
      entry.is_tensor = true;
      entry.dtype = tensor.dtype;
      entry.size = size;
      chunk.box = tensor.region;
      entry.chunks.push_back(std::move(chunk));
    }
  }
  // Paths: values have theirs; tensors the nesting's, or their name as a flat key.
  for (const FlatLeaf& leaf : leaves) {
    if (leaf.node->kind != StructureNode::Kind::kTensor && index.contains(leaf.fqn)) {
      entries[index.at(leaf.fqn)].second.path = leaf.path;
    }
  }
  for (auto& [fqn, entry] : entries) {
    if (!entry.is_tensor) continue;
    auto path = tensor_paths.find(fqn);
    entry.path =
        path != tensor_paths.end() ? path->second : std::vector<DcpPathItem>{{false, fqn, 0}};
    std::vector<Box> boxes;
    for (const MetadataChunk& chunk : entry.chunks) boxes.push_back(chunk.box);
    RETURN_IF_ERROR(CheckChunkTiling(entry.size, boxes),
                    absl::StrCat("tensor \"", fqn, "\": the chunks written"));
  }
  // The nesting's order first, as torch's planner lists the flattened state dict.
  std::vector<std::pair<std::string, MetadataEntry>> ordered;
  std::vector<bool> placed(entries.size(), false);
  for (const FlatLeaf& leaf : leaves) {
    const std::string& fqn =
        leaf.node->kind == StructureNode::Kind::kTensor ? leaf.node->text : leaf.fqn;
    auto it = index.find(fqn);
    if (it == index.end() || placed[it->second]) continue;
    placed[it->second] = true;
    ordered.push_back(std::move(entries[it->second]));
  }
  for (size_t e = 0; e < entries.size(); ++e) {
    if (!placed[e]) ordered.push_back(std::move(entries[e]));
  }
  return ordered;
}

}  // namespace

OutputNaming DcpOutput::naming() const {
  OutputNaming naming;
  // One rank's buckets (FileSystemWriter's thread buckets) when consolidating.
  naming.shard_file = [](int index, int) { return absl::StrCat("__0_", index, ".distcp"); };
  naming.part_file = [](int rank, int) { return absl::StrCat("__", rank, "_0.distcp"); };
  return naming;
}

absl::StatusOr<ArrangedOutput> DcpOutput::Arrange(TargetLayout engine_layout,
                                                  const ArrangeRequest& request) const {
  const Catalog& catalog = request.catalog;
  ASSIGN_OR_RETURN(std::vector<FlatLeaf> leaves, Flatten(catalog.structure.get()));
  const absl::flat_hash_set<std::string> in_values = TensorsInValues(leaves);
  absl::flat_hash_set<std::string> leaf_tensors;
  for (const FlatLeaf& leaf : leaves) {
    if (leaf.node->kind == StructureNode::Kind::kTensor) leaf_tensors.insert(leaf.node->text);
  }
  // Tensors held by values, whole, for rank 0's value items.
  std::vector<OutputTensor> value_tensors;
  absl::flat_hash_set<std::string> value_tensor_names;
  // Boxes already stored by a lower rank: a replicated tensor is stored once.
  absl::flat_hash_set<std::string> stored;
  for (size_t f = 0; f < engine_layout.files.size(); ++f) {
    OutputFileLayout& file = engine_layout.files[f];
    file.structure = f == 0 ? catalog.structure : nullptr;  // values go to rank 0
    file.metadata.clear();
    std::vector<OutputTensor> kept;
    for (OutputTensor& tensor : file.tensors) {
      tensor.global_shape = catalog.tensors[tensor.source].shape;
      if (!tensor.written_shape.empty()) {
        return absl::UnimplementedError(absl::StrCat(
            "tensor \"", tensor.name,
            "\": its partition rule splits fused blocks, so a part holds several boxes of it; "
            "a DCP chunk is one box (use a rule without \"fused\", or another --format)"));
      }
      if (in_values.contains(tensor.name)) {
        if (!(tensor.region == Box::Full(catalog.tensors[tensor.source].shape))) {
          return absl::UnimplementedError(absl::StrCat(
              "tensor \"", tensor.name,
              "\" is held by a value (a tuple or an object, which torch pickles whole with its "
              "tensors) but the partition rules split it; replicate it"));
        }
        tensor.alias_of = -1;
        if (value_tensor_names.insert(tensor.name).second) value_tensors.push_back(tensor);
        // A tensor that is also a leaf of its own is a chunk too (torch writes both).
        if (!leaf_tensors.contains(tensor.name)) continue;
      }
      if (!stored.insert(absl::StrCat(tensor.source, " ", BoxToString(tensor.region))).second) {
        continue;
      }
      tensor.alias_of = -1;  // DCP stores every name's data
      kept.push_back(std::move(tensor));
    }
    file.tensors = std::move(kept);
  }
  if (!value_tensors.empty()) {
    if (engine_layout.files.empty()) return absl::InternalError("no output file");
    std::vector<OutputTensor>& first = engine_layout.files[0].tensors;
    first.insert(first.end(), std::make_move_iterator(value_tensors.begin()),
                 std::make_move_iterator(value_tensors.end()));
  }
  ArrangedOutput arranged;
  arranged.layout = std::move(engine_layout);
  // The values' and key paths' flattening must work before anything is written.
  RETURN_IF_ERROR(CollectEntries(arranged.layout).status());
  return arranged;
}

absl::StatusOr<FileFraming> DcpOutput::Frame(const OutputFileLayout& file) const {
  ASSIGN_OR_RETURN(LaidOutFile laid_out, LayOutFile(file));
  return std::move(laid_out.framing);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> DcpOutput::CompanionFiles(
    const TargetLayout& layout) const {
  ASSIGN_OR_RETURN(auto entries, CollectEntries(layout));
  MetadataPickler pickler;
  ASSIGN_OR_RETURN(std::string metadata, pickler.Metadata(entries));
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back(kDcpMetadataName, std::move(metadata));
  return files;
}

namespace {
const OutputFormatRegistration<DcpOutput> register_output;
}  // namespace

}  // namespace reshard
