#include "lib/formats/dcp/dcp_format.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/dcp/dcp_metadata.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/formats/torch/torch_format.h"
#include "lib/io/byte_source.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

// A `.metadata` larger than this is refused before it is read (the pickle reader's own caps
// would stop it later, after far more memory).
constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;
constexpr char kDataSuffix[] = ".distcp";

// What a remote data file's items are parsed from: each item's first and last bytes (the local
// headers with data.pkl, and the end records with the central directory of a torch.save of one
// tensor), prefetched together for kItemsPerBatch items, so that neighbouring items share a
// request and the bytes held stay bounded (2 x 8 KiB per item).
constexpr uint64_t kItemHeadBytes = 8 << 10;
constexpr uint64_t kItemTailBytes = 8 << 10;
constexpr size_t kItemsPerBatch = 4096;

// The rank of a FileSystemWriter data file name `__R_N.distcp`, or nullopt.
std::optional<int64_t> RankOfFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "__") || !absl::ConsumeSuffix(&name, kDataSuffix)) {
    return std::nullopt;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(name, '_');
  int64_t rank = 0, bucket = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &rank) ||
      !absl::SimpleAtoi(parts[1], &bucket) || rank < 0 || bucket < 0) {
    return std::nullopt;
  }
  return rank;
}

std::string BoxName(const DcpEntry& entry, size_t chunk) {
  return absl::StrCat("tensor \"", entry.fqn, "\", chunk ", chunk, " ",
                      BoxToString(entry.chunks[chunk]));
}

std::string DescribeStorage(const DcpEntry& entry, size_t chunk) {
  return entry.is_tensor ? BoxName(entry, chunk) : absl::StrCat("value \"", entry.fqn, "\"");
}

// ---- Rebuilding the nested state dict from planner_data key paths.

// A container under construction: dicts index their keys, lists grow to the largest position
// seen (holes stay None, as in torch's unflattening).
struct TreeNode {
  enum class Kind { kLeaf, kDict, kList };
  Kind kind = Kind::kLeaf;
  StructureNode leaf;                               // kLeaf
  std::vector<StructureNode> keys;                  // kDict, parallel to children
  std::vector<std::unique_ptr<TreeNode>> children;  // kDict; kList (null: None)
  absl::flat_hash_map<std::string, size_t> index;   // kDict: "s<key>" or "i<position>"
};

std::string PathToString(const std::vector<DcpPathItem>& path) {
  std::string out = "(";
  for (size_t i = 0; i < path.size(); ++i) {
    if (i > 0) absl::StrAppend(&out, ", ");
    if (path[i].is_index) {
      absl::StrAppend(&out, path[i].index);
    } else {
      absl::StrAppend(&out, "'", path[i].key, "'");
    }
  }
  return absl::StrCat(out, path.size() == 1 ? ",)" : ")");
}

class TreeBuilder {
 public:
  // `max_list_length`: list positions beyond it are refused (every position of a real
  // checkpoint's list is one of its entries).
  explicit TreeBuilder(size_t max_list_length) : max_list_length_(max_list_length) {
    root_.kind = TreeNode::Kind::kDict;
  }

  absl::Status Insert(const std::vector<DcpPathItem>& path, StructureNode leaf) {
    auto conflict = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat("planner_data path ", PathToString(path), ": ", why));
    };
    TreeNode* node = &root_;
    for (size_t i = 0; i < path.size(); ++i) {
      const DcpPathItem& item = path[i];
      std::unique_ptr<TreeNode>* slot = nullptr;
      if (node->kind == TreeNode::Kind::kDict) {
        const std::string key =
            item.is_index ? absl::StrCat("i", item.index) : absl::StrCat("s", item.key);
        auto [it, inserted] = node->index.emplace(key, node->children.size());
        if (inserted) {
          StructureNode key_node;
          if (item.is_index) {
            key_node.kind = StructureNode::Kind::kInt;
            key_node.integer = item.index;
          } else {
            key_node.kind = StructureNode::Kind::kString;
            key_node.text = item.key;
          }
          node->keys.push_back(std::move(key_node));
          node->children.emplace_back();
        }
        slot = &node->children[it->second];
      } else if (node->kind == TreeNode::Kind::kList) {
        if (!item.is_index) return conflict(absl::StrCat("key '", item.key, "' inside a list"));
        if (static_cast<uint64_t>(item.index) >= max_list_length_) {
          return conflict(absl::StrCat("list position ", item.index, " is beyond the ",
                                       max_list_length_, " entries of the checkpoint"));
        }
        if (static_cast<size_t>(item.index) >= node->children.size()) {
          node->children.resize(item.index + 1);
        }
        slot = &node->children[item.index];
      } else {
        return conflict("passes through a value that is not a container");
      }
      if (i + 1 == path.size()) {
        if (*slot != nullptr) return conflict("two values have this path");
        *slot = std::make_unique<TreeNode>();
        (*slot)->leaf = std::move(leaf);
        return absl::OkStatus();
      }
      if (*slot == nullptr) {
        *slot = std::make_unique<TreeNode>();
        (*slot)->kind = path[i + 1].is_index ? TreeNode::Kind::kList : TreeNode::Kind::kDict;
      } else if ((*slot)->kind == TreeNode::Kind::kLeaf) {
        return conflict("passes through a value that is not a container");
      }
      node = slot->get();
    }
    return absl::OkStatus();
  }

  StructureNode Build() { return ToStructure(root_); }

 private:
  static StructureNode ToStructure(TreeNode& node) {
    StructureNode out;
    switch (node.kind) {
      case TreeNode::Kind::kLeaf:
        return std::move(node.leaf);
      case TreeNode::Kind::kDict:
        out.kind = StructureNode::Kind::kDict;  // torch rebuilds plain dicts
        out.keys = std::move(node.keys);
        for (auto& child : node.children) out.values.push_back(ToStructure(*child));
        return out;
      case TreeNode::Kind::kList:
        out.kind = StructureNode::Kind::kList;
        for (auto& child : node.children) {
          out.items.push_back(child == nullptr ? StructureNode{} : ToStructure(*child));
        }
        return out;
    }
    return out;
  }

  size_t max_list_length_;
  TreeNode root_;
};

// Renames the kTensor leaves of `node` through `names`.
void RenameTensors(StructureNode& node,
                   const absl::flat_hash_map<std::string, std::string>& names) {
  if (node.kind == StructureNode::Kind::kTensor) {
    auto it = names.find(node.text);
    if (it != names.end()) node.text = it->second;
  }
  for (StructureNode& child : node.values) RenameTensors(child, names);
  for (StructureNode& child : node.items) RenameTensors(child, names);
}

// ---- The reader.

// A value's payload, parsed: its Catalog (tensors inside it, if any, are located relative to
// the payload's first byte) and where the payload starts.
struct Payload {
  Catalog catalog;
  int file = 0;
  uint64_t offset = 0;
};

class DcpReader {
 public:
  explicit DcpReader(std::string dir, DcpMetadataCheck check = nullptr)
      : dir_(std::move(dir)), check_(std::move(check)) {}

  absl::StatusOr<InputModel> Read() {
    RETURN_IF_ERROR(ReadMetadata());
    if (check_ != nullptr) RETURN_IF_ERROR(check_(metadata_, metadata_path_));
    for (const DcpEntry& entry : metadata_.entries) {
      if (!entry.is_tensor) continue;
      RETURN_IF_ERROR(CheckChunkTiling(entry.size, entry.chunks),
                      absl::StrCat(metadata_path_, ": tensor \"", entry.fqn, "\""));
    }
    RETURN_IF_ERROR(ResolveFiles());
    pieces_.resize(metadata_.entries.size());
    payloads_.resize(metadata_.entries.size());
    // The data files opened (from S3: their first items' headers fetched) several at once,
    // their items parsed in file order.
    RETURN_IF_ERROR(ReadInOrder<OpenedFile>(
        static_cast<int>(files_.size()), ParallelReadOptions(),
        [this](int f) { return OpenFile(f); }, [](const OpenedFile& file) { return file.bytes; },
        [this](int f, OpenedFile file) { return ReadFile(f, file); }));
    return Assemble();
  }

 private:
  absl::Status ReadMetadata() {
    metadata_path_ = JoinPath(dir_, kDcpMetadataName);
    ASSIGN_OR_RETURN(const bool has_metadata, CheckInputFile(metadata_path_));
    if (!has_metadata) {
      ASSIGN_OR_RETURN(std::vector<std::string> local, ListFolder(dir_, {".metadata"}));
      for (const std::string& name : local) {
        return absl::UnimplementedError(absl::StrCat(
            dir_, ": rank-local metadata (", name,
            ", written with use_collectives=False) without a global .metadata is not supported"));
      }
      return absl::NotFoundError(
          absl::StrCat(metadata_path_,
                       ": missing; a DCP checkpoint folder needs the .metadata file that "
                       "the coordinator writes when the save finishes"));
    }
    ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(metadata_path_));
    if (file.size() > kMaxMetadataBytes) {
      return absl::DataLossError(absl::StrCat(metadata_path_, ": ", file.size(),
                                              " bytes; reshard reads at most ", kMaxMetadataBytes));
    }
    absl::string_view bytes(reinterpret_cast<const char*>(file.data()), file.size());
    std::string loaded;
    if (!file.mapped()) {
      // The pickle is parsed as a whole: read it whole (range reads, several in flight).
      loaded.resize(file.size());
      RETURN_IF_ERROR(file.ReadAt(0, loaded.size(), reinterpret_cast<std::byte*>(loaded.data())),
                      metadata_path_);
      bytes = loaded;
    }
    ASSIGN_OR_RETURN(metadata_, ParseDcpMetadata(bytes, metadata_path_));
    return absl::OkStatus();
  }

  // Maps every relative_path to a checked file, in natural name order, and checks each item's
  // byte range against its file.
  absl::Status ResolveFiles() {
    std::vector<std::string> names;
    // The first item stored in each file, to name in errors about the file.
    absl::flat_hash_map<std::string, std::string> first_use;
    for (const DcpEntry& entry : metadata_.entries) {
      for (size_t c = 0; c < entry.storage.size(); ++c) {
        const std::string& name = entry.storage[c].relative_path;
        if (first_use.emplace(name, DescribeStorage(entry, c)).second) names.push_back(name);
      }
    }
    std::sort(names.begin(), names.end(), NaturalLess);
    for (const std::string& name : names) {
      absl::StatusOr<std::string> path = ResolveDcpDataFile(dir_, name);
      if (!path.ok()) {
        return Annotate(path.status(), absl::StrCat(metadata_path_, ": ", first_use.at(name)));
      }
      absl::StatusOr<InputFileInfo> info = StatInputFile(*path);
      if (!info.ok()) {
        return absl::NotFoundError(absl::StrCat(*path, ": cannot stat: ", info.status().message()));
      }
      file_index_[name] = static_cast<int>(files_.size());
      files_.push_back(SourceFile{*std::move(path), info->size, {}, std::move(info->version)});
    }
    items_.resize(files_.size());
    for (size_t e = 0; e < metadata_.entries.size(); ++e) {
      const DcpEntry& entry = metadata_.entries[e];
      for (size_t c = 0; c < entry.storage.size(); ++c) {
        const DcpStorage& storage = entry.storage[c];
        const int f = file_index_.at(storage.relative_path);
        const SourceFile& file = files_[f];
        if (!storage.transforms.empty()) {
          return absl::UnimplementedError(absl::StrCat(
              file.path, " at byte offset ", storage.offset, ": ", DescribeStorage(entry, c),
              ": stored through the stream transform \"", storage.transforms.front(),
              "\" (torch.distributed.checkpoint _extensions), which reshard does not undo"));
        }
        if (storage.offset > file.size || storage.length > file.size - storage.offset) {
          return absl::DataLossError(absl::StrCat(
              file.path, ": ", DescribeStorage(entry, c), ": its bytes [", storage.offset, ", ",
              static_cast<unsigned __int128>(storage.offset) + storage.length > UINT64_MAX
                  ? std::string("beyond 2^64")
                  : absl::StrCat(storage.offset + storage.length),
              ") are past the end of the file (", file.size, " bytes): the file is truncated"));
        }
        items_[f].push_back({e, c});
      }
    }
    return absl::OkStatus();
  }

  struct Item {
    size_t entry;
    size_t chunk;
  };
  const DcpStorage& Storage(const Item& item) const {
    return metadata_.entries[item.entry].storage[item.chunk];
  }

  // A data file opened for its items; a remote one with the ranges of its first batch of items
  // (kItemsPerBatch; kItemHeadBytes and kItemTailBytes of each) loaded.
  struct OpenedFile {
    std::unique_ptr<MappedFile> file;  // null when the file holds no item
    std::unique_ptr<ByteSource> first_batch;
    uint64_t bytes = 0;  // loaded
  };

  // Opens data file `f` and sorts its items by offset. Runs on a ReadInOrder worker: touches
  // only items_[f] (nobody else does until ReadFile(f)) and reads files_[f].
  absl::StatusOr<OpenedFile> OpenFile(int f) {
    std::vector<Item>& items = items_[f];
    OpenedFile opened;
    if (items.empty()) return opened;
    const SourceFile& source = files_[f];
    ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(source.path, source.size, source.version));
    opened.file = std::make_unique<MappedFile>(std::move(file));
    opened.file->AdviseRandomAccess();  // one small archive header per item, spread over the file
    std::sort(items.begin(), items.end(),
              [&](const Item& a, const Item& b) { return Storage(a).offset < Storage(b).offset; });
    if (!opened.file->mapped()) {
      opened.first_batch = ByteSourceFor(*opened.file);
      std::vector<ByteRange> ranges = BatchRanges(items, 0);
      for (const ByteRange& range : ranges) opened.bytes += range.length;
      RETURN_IF_ERROR(Annotate(opened.first_batch->Prefetch(std::move(ranges)),
                               "the items' archive headers"));
    }
    return opened;
  }

  // The head and tail ranges of the batch of items starting at `first`.
  std::vector<ByteRange> BatchRanges(const std::vector<Item>& items, size_t first) const {
    std::vector<ByteRange> ranges;
    for (size_t i = first; i < std::min(items.size(), first + kItemsPerBatch); ++i) {
      const DcpStorage& storage = Storage(items[i]);
      const uint64_t tail = std::min(storage.length, kItemTailBytes);
      ranges.push_back({storage.offset, std::min(storage.length, kItemHeadBytes)});
      ranges.push_back({storage.offset + storage.length - tail, tail});
    }
    return ranges;
  }

  // Parses every item stored in file `f` (`opened`) front to back: from one mapping of a local
  // file; a remote one by range reads, each batch of items from a source of its own whose ranges
  // were prefetched together.
  absl::Status ReadFile(int f, OpenedFile& opened) {
    std::vector<Item>& items = items_[f];
    if (items.empty()) return absl::OkStatus();
    const MappedFile& file = *opened.file;
    SourceFile& source = files_[f];
    // A listing without versions: the items below are of the version opened now.
    if (source.version.empty()) source.version = file.version();
    absl::Status status;
    for (size_t first = 0; first < items.size() && status.ok(); first += kItemsPerBatch) {
      const size_t last =
          !file.mapped() ? std::min(items.size(), first + kItemsPerBatch) : items.size();
      std::unique_ptr<ByteSource> bytes =
          first == 0 && opened.first_batch != nullptr ? std::move(opened.first_batch)
                                                      : ByteSourceFor(file);
      if (!file.mapped() && first > 0) {
        status = Annotate(bytes->Prefetch(BatchRanges(items, first)), "the items' archive headers");
      }
      for (size_t i = first; i < last && status.ok(); ++i) {
        status = ReadItem(*bytes, !file.mapped(), f, items[i]);
      }
      if (file.mapped()) break;
    }
    // Only headers and pickles were touched; give the pages back before the conversion runs.
    file.Release(0, file.size());
    return status;
  }

  absl::Status ReadItem(ByteSource& file, bool remote, int f, const Item& item) {
    const DcpEntry& entry = metadata_.entries[item.entry];
    const DcpStorage& storage = Storage(item);
    const std::string label = absl::StrCat(file.path(), " at byte offset ", storage.offset);
    SliceByteSource bytes(file, storage.offset, storage.length, label);
    // A remote item's end was prefetched: its end records are in the last kItemTailBytes.
    absl::StatusOr<std::unique_ptr<TorchArchive>> archive =
        TorchArchive::Parse(bytes, remote ? kItemTailBytes : ZipArchive::kTailBytes);
    if (!archive.ok()) return Annotate(archive.status(), DescribeStorage(entry, item.chunk));
    // The chunk's storage records keep their CRC-32s, placed in the .distcp file.
    std::vector<ChecksummedRange> ranges = (*archive)->ChecksummedRanges(storage.offset);
    std::vector<ChecksummedRange>& checksummed = files_[f].checksummed;
    checksummed.insert(checksummed.end(), std::make_move_iterator(ranges.begin()),
                       std::make_move_iterator(ranges.end()));
    if (!entry.is_tensor) {
      absl::StatusOr<Catalog> catalog = CatalogFromArchive(**archive);
      if (!catalog.ok()) return Annotate(catalog.status(), DescribeStorage(entry, item.chunk));
      payloads_[item.entry] = Payload{*std::move(catalog), f, storage.offset};
      return absl::OkStatus();
    }
    auto error = [&](absl::string_view message) {
      return absl::DataLossError(
          absl::StrCat(label, ": ", BoxName(entry, item.chunk), ": ", message));
    };
    const Box& chunk = entry.chunks[item.chunk];
    absl::StatusOr<std::optional<TensorLocation>> location =
        (*archive)->Tensor((*archive)->root(), entry.fqn);
    if (!location.ok()) return Annotate(location.status(), BoxName(entry, item.chunk));
    if (!location->has_value()) {
      return error(absl::StrCat("the archive holds ", DescribePickleValue((*archive)->root()),
                                ", not a tensor"));
    }
    TensorLocation& tensor = **location;
    if (tensor.shape != chunk.extent) {
      return error(absl::StrCat("the archive's tensor has shape ", ShapeToString(tensor.shape),
                                " but the metadata gives the chunk sizes ",
                                ShapeToString(chunk.extent)));
    }
    if (tensor.dtype != entry.dtype) {
      return error(absl::StrCat("the archive's tensor is ", DTypeName(tensor.dtype),
                                " but the metadata says ", DTypeName(entry.dtype)));
    }
    SourcePiece piece;
    piece.file = f;
    piece.byte_offset = storage.offset + tensor.byte_offset;
    piece.box = chunk;
    piece.strides = std::move(tensor.strides);
    pieces_[item.entry].push_back(std::move(piece));
    return absl::OkStatus();
  }

  absl::StatusOr<InputModel> Assemble() {
    Catalog catalog;
    catalog.format = DcpInput::kId;
    catalog.files = files_;
    TreeBuilder tree(metadata_.entries.size());
    absl::flat_hash_set<std::string> names;
    int values = 0;
    for (size_t e = 0; e < metadata_.entries.size(); ++e) {
      const DcpEntry& entry = metadata_.entries[e];
      StructureNode leaf;
      if (entry.is_tensor) {
        names.insert(entry.fqn);
        CatalogTensor tensor{entry.fqn, entry.dtype, entry.size, std::move(pieces_[e])};
        catalog.tensors.push_back(std::move(tensor));
        leaf.kind = StructureNode::Kind::kTensor;
        leaf.text = entry.fqn;
      } else {
        ++values;
        if (!payloads_[e].has_value()) {
          return absl::InternalError(absl::StrCat("value \"", entry.fqn, "\" was not read"));
        }
        ASSIGN_OR_RETURN(leaf, TakePayload(entry, *std::move(payloads_[e]), catalog, names));
      }
      std::vector<DcpPathItem> path = entry.path;
      if (path.empty()) path.push_back(DcpPathItem{false, entry.fqn, 0});
      RETURN_IF_ERROR(tree.Insert(path, std::move(leaf)),
                      absl::StrCat(metadata_path_, ": \"", entry.fqn, "\""));
    }
    catalog.structure = std::make_shared<const StructureNode>(tree.Build());
    catalog.Reindex();

    InputModel model;
    model.format = DcpInput::kId;
    model.arrangement = files_.size() == 1 ? "single-file" : "sharded";
    model.description = Describe(catalog, values);
    model.part_names.push_back(dir_);
    model.parts.push_back(std::move(catalog));
    return model;
  }

  // The structure of value `entry`, its tensors (if any) added to `catalog` under
  // "<fqn>.<key path>" and its entries listed in other_entries under its fqn.
  absl::StatusOr<StructureNode> TakePayload(const DcpEntry& entry, Payload payload,
                                            Catalog& catalog,
                                            absl::flat_hash_set<std::string>& names) {
    absl::flat_hash_map<std::string, std::string> renames;
    for (CatalogTensor& tensor : payload.catalog.tensors) {
      std::string name =
          tensor.name == "tensor" ? entry.fqn : absl::StrCat(entry.fqn, ".", tensor.name);
      if (!names.insert(name).second) {
        return absl::DataLossError(absl::StrCat(
            files_[payload.file].path, " at byte offset ", payload.offset, ": value \"", entry.fqn,
            "\" holds a tensor named \"", name, "\", a name another tensor has"));
      }
      renames[tensor.name] = name;
      tensor.name = std::move(name);
      for (SourcePiece& piece : tensor.pieces) {
        piece.file = payload.file;
        piece.byte_offset += payload.offset;
      }
      catalog.tensors.push_back(std::move(tensor));
    }
    for (const std::string& note : payload.catalog.other_entries) {
      absl::string_view rest = note;
      if (absl::ConsumePrefix(&rest, "(root)")) {
        catalog.other_entries.push_back(absl::StrCat(entry.fqn, rest));
      } else {
        catalog.other_entries.push_back(absl::StrCat(entry.fqn, ".", note));
      }
    }
    StructureNode node =
        payload.catalog.structure != nullptr ? *payload.catalog.structure : StructureNode{};
    RenameTensors(node, renames);
    return node;
  }

  // "PyTorch DCP, 4 ranks (__0_0 .. __3_0.distcp), 12 tensors in 20 chunks, 3 other values".
  std::string Describe(const Catalog& catalog, int values) const {
    // Ranks from the folder's data files: a rank that wrote nothing still has an empty one.
    // The folder was listed moments ago to read it: a listing that fails now only shortens the
    // description.
    std::vector<std::string> data_files =
        ListFolder(dir_, {kDataSuffix}).value_or(std::vector<std::string>());
    absl::flat_hash_set<int64_t> ranks;
    bool named_by_rank = !data_files.empty();
    for (const std::string& name : data_files) {
      std::optional<int64_t> rank = RankOfFileName(name);
      if (!rank.has_value()) named_by_rank = false;
      if (rank.has_value()) ranks.insert(*rank);
    }
    std::string where;
    auto stem = [](const std::string& name) {
      return name.substr(0, name.size() - (sizeof(kDataSuffix) - 1));
    };
    if (named_by_rank) {
      where = absl::StrCat(ranks.size(), ranks.size() == 1 ? " rank" : " ranks");
      if (data_files.size() != ranks.size()) {
        absl::StrAppend(&where, " in ", data_files.size(), " files");
      }
      absl::StrAppend(&where, " (",
                      data_files.size() == 1
                          ? data_files.front()
                          : absl::StrCat(stem(data_files.front()), " .. ", data_files.back()),
                      ")");
    } else {
      where = absl::StrCat(files_.size(), files_.size() == 1 ? " data file" : " data files");
    }
    const size_t tensors = catalog.tensors.size();
    std::string out = absl::StrCat(
        "PyTorch DCP, ", where, ", ", tensors, tensors == 1 ? " tensor" : " tensors", " in ",
        metadata_.chunk_count, metadata_.chunk_count == 1 ? " chunk" : " chunks", ", ", values,
        values == 1 ? " other value" : " other values");
    if (!metadata_.has_planner_data && values + tensors > 0) {
      absl::StrAppend(&out, ", flat (no planner_data)");
    }
    return out;
  }

  std::string dir_;
  DcpMetadataCheck check_;
  std::string metadata_path_;
  DcpMetadata metadata_;
  std::vector<SourceFile> files_;
  absl::flat_hash_map<std::string, int> file_index_;
  std::vector<std::vector<Item>> items_;          // per file
  std::vector<std::vector<SourcePiece>> pieces_;  // per entry
  std::vector<std::optional<Payload>> payloads_;  // per entry
};

// The checkpoint folder `path` stands for: itself, or the folder of a `.metadata` file.
absl::StatusOr<std::string> CheckpointDir(const std::string& path) {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder && fs::path(path).filename() == kDcpMetadataName) {
    std::string parent = fs::path(path).parent_path().string();
    return parent.empty() ? "." : parent;
  }
  return path;
}

}  // namespace

absl::StatusOr<std::string> ResolveDcpDataFile(const std::string& dir,
                                               absl::string_view relative_path) {
  auto refuse = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("data file \"", relative_path, "\" ", why));
  };
  if (relative_path.empty()) return refuse("is an empty path");
  if (relative_path.find('\0') != absl::string_view::npos) return refuse("contains a NUL byte");
  if (relative_path.front() == '/') {
    return refuse("is an absolute path, outside the checkpoint folder");
  }
  for (absl::string_view part : absl::StrSplit(relative_path, '/')) {
    if (part == "..") return refuse("leaves the checkpoint folder (\"..\")");
  }
  const std::string path = JoinPath(dir, relative_path);
  if (!InputHasFolders(path)) {
    // Folders are key prefixes: no symlinks; "." and empty segments would name another key.
    for (absl::string_view part : absl::StrSplit(relative_path, '/')) {
      if (part.empty() || part == ".") return refuse("has an empty or \".\" component");
    }
    ASSIGN_OR_RETURN(const bool file, CheckInputFile(path));
    if (file) return path;
    ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
    if (folder) return refuse(absl::StrCat("(", path, ") is a folder, not a file"));
    return absl::NotFoundError(
        absl::StrCat(path, ": data file \"", relative_path, "\" is missing"));
  }
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (!fs::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": data file \"", relative_path, "\" is missing"));
  }
  if (!fs::is_regular_file(status))
    return refuse(absl::StrCat("(", path, ") is not a regular file"));
  // Symlinks inside the folder may not lead out of it.
  const fs::path real_dir = fs::canonical(dir, error);
  if (error) return refuse(absl::StrCat("(", path, "): ", error.message()));
  const fs::path real_file = fs::canonical(path, error);
  if (error) return refuse(absl::StrCat("(", path, "): ", error.message()));
  const fs::path inside = real_file.lexically_relative(real_dir);
  if (inside.empty() || *inside.begin() == "..") {
    return refuse(absl::StrCat("(", path, ") resolves to ", real_file.string(),
                               ", outside the checkpoint folder"));
  }
  return path;
}

absl::StatusOr<bool> DcpInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const std::string dir, CheckpointDir(path));
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(dir));
  if (!folder) return false;
  ASSIGN_OR_RETURN(const bool has_metadata, CheckInputFile(JoinPath(dir, kDcpMetadataName)));
  if (has_metadata) return true;
  ASSIGN_OR_RETURN(std::vector<std::string> data_files, ListFolder(dir, {kDataSuffix}));
  for (const std::string& name : data_files) {
    if (RankOfFileName(name).has_value()) return true;
  }
  return false;
}

absl::StatusOr<InputModel> ReadDcpCheckpoint(const std::string& dir,
                                             const DcpMetadataCheck& check) {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(dir));
  if (!folder) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a DCP checkpoint folder"));
  }
  DcpReader reader(dir, check);
  return reader.Read();
}

absl::StatusOr<InputModel> DcpInput::Read(const std::string& path,
                                          const ReadOptions& /*options*/) const {
  ASSIGN_OR_RETURN(const std::string dir, CheckpointDir(path));
  return ReadDcpCheckpoint(dir);
}

namespace {
const InputFormatRegistration<DcpInput> register_input;
}  // namespace

}  // namespace reshard
