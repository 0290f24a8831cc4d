#include "lib/formats/olmo/olmo_format.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/olmo/olmo_keys.h"
#include "lib/formats/safetensors/header.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_structure.h"
#include "lib/formats/torch/torch_output.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"

namespace reshard {
namespace {

using Node = StructureNode::Kind;

constexpr char kSuffix[] = ".safetensors";

// ---- Rebuilding the nested dict from key paths (OLMo's unflatten_dict).

// A dict under construction, its keys indexed.
struct DictTree {
  std::vector<StructureNode> keys;
  // Per key: a nested dict, or a leaf (tensor or unpickled value).
  std::vector<std::unique_ptr<DictTree>> dicts;
  std::vector<std::optional<StructureNode>> leaves;
  absl::flat_hash_map<std::string, size_t> index;  // "s<str>" or "i<int>"

  static std::string IndexKey(const StructureNode& key) {
    return key.kind == Node::kInt ? absl::StrCat("i", key.integer) : absl::StrCat("s", key.text);
  }

  size_t Slot(const StructureNode& key) {
    auto [it, inserted] = index.emplace(IndexKey(key), keys.size());
    if (inserted) {
      keys.push_back(key);
      dicts.emplace_back();
      leaves.emplace_back();
    }
    return it->second;
  }

  // Places `leaf` at `key`'s path; DataLoss when another value has the path or a prefix of it.
  absl::Status Insert(const OlmoKey& key, StructureNode leaf) {
    DictTree* dict = this;
    for (size_t i = 0; i < key.keys.size(); ++i) {
      const size_t slot = dict->Slot(key.keys[i]);
      const bool last = i + 1 == key.keys.size();
      if (dict->leaves[slot].has_value() || (last && dict->dicts[slot] != nullptr)) {
        return absl::DataLossError(absl::StrCat(
            "key path ", OlmoKeyTuple(key),
            last ? " is given twice, or is a prefix of another" : " passes through a value"));
      }
      if (last) {
        dict->leaves[slot] = std::move(leaf);
        return absl::OkStatus();
      }
      if (dict->dicts[slot] == nullptr) dict->dicts[slot] = std::make_unique<DictTree>();
      dict = dict->dicts[slot].get();
    }
    return absl::OkStatus();
  }

  StructureNode Build() {
    StructureNode out = StructureNode::Dict();  // unflatten_dict makes plain dicts
    for (size_t i = 0; i < keys.size(); ++i) {
      out.Add(keys[i], leaves[i].has_value() ? *std::move(leaves[i]) : dicts[i]->Build());
    }
    return out;
  }
};

// "int", "list of 2", "argparse.Namespace object": what a pickled value is, for inspect.
std::string DescribeValue(const StructureNode& node) {
  switch (node.kind) {
    case Node::kNone:
      return "None";
    case Node::kBool:
      return "bool";
    case Node::kInt:
    case Node::kBigInt:
      return "int";
    case Node::kFloat:
      return "float";
    case Node::kString:
      return "str";
    case Node::kBytes:
      return "bytes";
    case Node::kTensor:
      return "tensor";
    case Node::kDict:
      return absl::StrCat("dict of ", node.keys.size());
    case Node::kList:
      return absl::StrCat("list of ", node.items.size());
    case Node::kTuple:
      return absl::StrCat("tuple of ", node.items.size());
    case Node::kGlobal:
      return absl::StrCat(node.module, ".", node.name);
    case Node::kObject:
      return absl::StrCat(node.module, ".", node.name, " object");
  }
  return "value";
}

// One OLMo file: its Catalog (tensors, one source file) and nesting.
struct OlmoFile {
  Catalog catalog;
  std::unique_ptr<DictTree> tree = std::make_unique<DictTree>();
  int values = 0;  // pickled values
};

// The largest pickled value read from a remote file (OLMo pickles small values: step counts,
// config dicts).
constexpr uint64_t kMaxPickledValueBytes = 64 << 20;

absl::StatusOr<OlmoFile> ReadOlmoFile(const std::string& path) {
  uint64_t size = 0;
  std::string version;
  ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(path, &size, &version));
  OlmoFile file;
  file.catalog.format = OlmoSafetensorsInput::kId;
  file.catalog.files.push_back(SourceFile{path, size, {}, version});
  std::optional<MappedFile> mapped;
  // Dotted name -> key path, to refuse two key paths with one name: ("a.b",) and ("a", "b").
  absl::flat_hash_map<std::string, std::string> names;
  for (const SafetensorsTensorEntry& entry : header.tensors) {
    const uint64_t offset = header.data_start + entry.begin;
    absl::StatusOr<OlmoKey> key = DecodeOlmoKey(entry.name);
    if (!key.ok()) {
      return Annotate(key.status(),
                      absl::StrCat(path, ": entry \"", absl::CEscape(entry.name.substr(0, 200)),
                                   "\" of the header (bytes 8 to ", header.data_start,
                                   "), data at byte offset ", offset));
    }
    const std::string name = OlmoDottedName(*key);
    const std::string where =
        absl::StrCat(path, ": ", key->value_is_pickled ? "value " : "tensor ", OlmoKeyTuple(*key),
                     " (\"", name, "\") at byte offset ", offset);
    StructureNode leaf;
    if (!key->value_is_pickled) {
      auto [it, inserted] = names.emplace(name, OlmoKeyTuple(*key));
      if (!inserted) {
        return absl::DataLossError(
            absl::StrCat(where, ": the key path ", it->second, " has the same dotted name"));
      }
      CatalogTensor tensor{name, entry.dtype, entry.shape, {}};
      SourcePiece piece;
      piece.file = 0;
      piece.byte_offset = offset;
      piece.box = Box::Full(entry.shape);
      piece.strides = RowMajorStrides(entry.shape);
      tensor.pieces.push_back(std::move(piece));
      file.catalog.tensors.push_back(std::move(tensor));
      leaf = StructureNode::Tensor(name);
    } else {
      if (entry.dtype != DType::kU8 || entry.shape.size() != 1) {
        return absl::DataLossError(
            absl::StrCat(where, ": a pickled value is a 1-d U8 tensor, this one is ",
                         DTypeName(entry.dtype), " ", ShapeToString(entry.shape)));
      }
      if (!mapped.has_value()) {
        ASSIGN_OR_RETURN(MappedFile opened, MappedFile::Open(path, size, version));
        opened.AdviseRandomAccess();
        mapped.emplace(std::move(opened));
      }
      // A remote file has no mapping: the value's bytes by a range read (the header's sizes
      // were checked against the file's).
      std::string remote_bytes;
      if (!mapped->mapped()) {
        if (entry.end - entry.begin > kMaxPickledValueBytes) {
          return absl::DataLossError(absl::StrCat(where, ": a pickled value of ",
                                                  entry.end - entry.begin, " bytes (at most ",
                                                  kMaxPickledValueBytes, " are read)"));
        }
        remote_bytes.resize(entry.end - entry.begin);
        RETURN_IF_ERROR(mapped->ReadAt(offset, remote_bytes.size(),
                                       reinterpret_cast<std::byte*>(remote_bytes.data())),
                        where);
      }
      const absl::string_view bytes =
          !mapped->mapped()
              ? absl::string_view(remote_bytes)
              : absl::string_view(reinterpret_cast<const char*>(mapped->data()) + offset,
                                  entry.end - entry.begin);
      PickleArena arena;
      absl::StatusOr<PickleValue*> value = ParsePickle(bytes, arena, {});
      if (!value.ok()) return Annotate(value.status(), where);
      absl::StatusOr<StructureNode> node = PickleToStructure(*value);
      if (!node.ok()) return Annotate(node.status(), where);
      leaf = *std::move(node);
      file.catalog.other_entries.push_back(absl::StrCat(name, ": ", DescribeValue(leaf)));
      ++file.values;
    }
    RETURN_IF_ERROR(file.tree->Insert(*key, std::move(leaf)), path);
  }
  if (mapped.has_value()) mapped->Release(0, mapped->size());
  return file;
}

// Whether the safetensors file at `path` names one of its first entries as OLMo does (one: a
// name damaged among OLMo's must reach this reader, which refuses it). Only the file's
// first 64 KiB are read, not parsed: every Hugging Face file is probed too (and a file whose
// header is damaged still reaches this reader, which says what is wrong). An entry is a JSON
// string followed by `:{`; base64 names hold no quote, so the string starts at the quote
// before it.
// False for an absent file; an error when it cannot be read.
absl::StatusOr<bool> IsOlmoFile(const std::string& path) {
  absl::StatusOr<std::string> prefix = ReadFilePrefix(path, 64 << 10);
  if (absl::IsNotFound(prefix.status())) return false;
  if (!prefix.ok()) return prefix.status();
  if (prefix->size() < 9) return false;
  const absl::string_view json = absl::string_view(*prefix).substr(8);
  size_t at = 0;
  for (int entries = 0; entries < 16; ++entries) {
    const size_t colon = json.find("\":{", at);
    if (colon == absl::string_view::npos) return false;
    const size_t quote = json.rfind('"', colon - 1);
    if (quote == absl::string_view::npos) return false;
    const absl::string_view name = json.substr(quote + 1, colon - quote - 1);
    at = colon + 3;
    if (LooksLikeOlmoKey(name)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> OlmoSafetensorsInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return IsOlmoFile(path);
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(path, {kSuffix}));
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(const bool olmo, IsOlmoFile(JoinPath(path, name)));
    if (olmo) return true;
  }
  return false;
}

absl::StatusOr<InputModel> OlmoSafetensorsInput::Read(const std::string& path,
                                                      const ReadOptions& /*options*/) const {
  std::vector<std::string> paths;
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (folder) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(path, {kSuffix}));
    for (const std::string& name : names) paths.push_back(JoinPath(path, name));
  } else {
    paths.push_back(path);
  }
  Catalog catalog;
  catalog.format = kId;
  DictTree tree;
  int values = 0;
  for (const std::string& file_path : paths) {
    ASSIGN_OR_RETURN(OlmoFile file, ReadOlmoFile(file_path));
    for (const CatalogTensor& tensor : file.catalog.tensors) {
      if (catalog.Find(tensor.name) >= 0) {
        return absl::DataLossError(absl::StrCat(file_path, ": tensor \"", tensor.name,
                                                "\" is also in another file of ", path));
      }
    }
    // The files' dicts side by side: OLMo's model.safetensors and optim.safetensors.
    for (size_t i = 0; i < file.tree->keys.size(); ++i) {
      const StructureNode& key = file.tree->keys[i];
      if (tree.index.count(DictTree::IndexKey(key)) > 0) {
        return absl::DataLossError(
            absl::StrCat(file_path, ": top-level key ",
                         key.kind == Node::kInt ? absl::StrCat(key.integer) : key.text,
                         " is also in another file of ", path));
      }
      const size_t slot = tree.Slot(key);
      tree.dicts[slot] = std::move(file.tree->dicts[i]);
      tree.leaves[slot] = std::move(file.tree->leaves[i]);
    }
    values += file.values;
    AppendCatalog(catalog, std::move(file.catalog));
    catalog.Reindex();
  }
  catalog.structure = std::make_shared<const StructureNode>(tree.Build());
  catalog.Reindex();
  InputModel model;
  model.format = kId;
  model.arrangement = paths.size() == 1 ? "single-file" : "sharded";
  const size_t tensors = catalog.tensors.size();
  model.description = absl::StrCat("OLMo safetensors (olmo/safetensors_util.py), ", paths.size(),
                                   paths.size() == 1 ? " file, " : " files, ", tensors,
                                   tensors == 1 ? " tensor, " : " tensors, ", values,
                                   values == 1 ? " pickled value" : " pickled values");
  model.part_names.push_back(path);
  model.parts.push_back(std::move(catalog));
  return model;
}

// ---- Writing.

namespace {

// One entry of an output file: a tensor of the layout, or a pickled value.
struct Entry {
  std::string name;  // the encoded key
  DType dtype = DType::kU8;
  Shape shape;
  int tensor = -1;     // OutputFileLayout::tensors index, or -1 for a pickled value
  std::string pickle;  // a pickled value's bytes
};

class EntryCollector {
 public:
  explicit EntryCollector(const OutputFileLayout& file) : file_(file) {
    for (size_t i = 0; i < file.tensors.size(); ++i) index_[file.tensors[i].name] = i;
  }

  // OLMo's flatten_dict of `dict` below the key path `prefix`.
  absl::Status Flatten(const StructureNode& dict, OlmoKey& prefix) {
    for (size_t i = 0; i < dict.keys.size(); ++i) {
      const StructureNode& key = dict.keys[i];
      const StructureNode& value = dict.values[i];
      prefix.keys.push_back(key);
      if (key.kind != Node::kString && key.kind != Node::kInt) {
        return absl::UnimplementedError(absl::StrCat("key ", OlmoKeyTuple(prefix), " is a ",
                                                     DescribeValue(key),
                                                     "; OLMo's keys are str or int"));
      }
      if (value.kind == Node::kTensor) {
        auto it = index_.find(value.text);
        if (it == index_.end()) {
          return absl::InternalError(
              absl::StrCat("tensor \"", value.text, "\" is not in ", file_.name));
        }
        RETURN_IF_ERROR(AddTensor(prefix, it->second));
      } else if (value.kind == Node::kDict && !value.keys.empty()) {
        // A state dict's OrderedDict attributes (`_metadata`) are not kept, as in OLMo.
        RETURN_IF_ERROR(Flatten(value, prefix));
      } else {
        RETURN_IF_ERROR(AddValue(prefix, value));
      }
      prefix.keys.pop_back();
    }
    return absl::OkStatus();
  }

  // Tensors no key path reached, under (name,).
  absl::Status AddRemaining() {
    for (size_t i = 0; i < file_.tensors.size(); ++i) {
      if (written_[i]) continue;
      OlmoKey key;
      key.keys.push_back(StructureNode::String(file_.tensors[i].name));
      RETURN_IF_ERROR(AddTensor(key, i));
    }
    return absl::OkStatus();
  }

  std::vector<Entry> Take() { return std::move(entries_); }

 private:
  absl::Status AddTensor(const OlmoKey& key, size_t index) {
    const OutputTensor& tensor = file_.tensors[index];
    if (written_[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensor.name, "\" is reached by two key paths"));
    }
    written_[index] = true;
    ASSIGN_OR_RETURN(std::string name, EncodeOlmoKey(key));
    entries_.push_back({std::move(name), tensor.dtype, tensor.shape(), static_cast<int>(index)});
    return absl::OkStatus();
  }

  absl::Status AddValue(const OlmoKey& key, const StructureNode& value) {
    absl::StatusOr<std::string> pickle = PickledValueBytes(value);
    if (!pickle.ok()) {
      return absl::UnimplementedError(absl::StrCat(
          "value ", OlmoKeyTuple(key), " (", DescribeValue(value),
          ") is pickled whole as OLMo's flatten_dict does, but ", pickle.status().message()));
    }
    OlmoKey pickled = key;
    pickled.value_is_pickled = true;
    ASSIGN_OR_RETURN(std::string name, EncodeOlmoKey(pickled));
    const int64_t size = static_cast<int64_t>(pickle->size());
    entries_.push_back({std::move(name), DType::kU8, {size}, -1, *std::move(pickle)});
    return absl::OkStatus();
  }

  const OutputFileLayout& file_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::vector<bool> written_ = std::vector<bool>(file_.tensors.size(), false);
  std::vector<Entry> entries_;
};

}  // namespace

// Safetensors' own names: model.safetensors, model_part-{rank}.safetensors.
OutputNaming OlmoSafetensorsOutput::naming() const { return SafetensorsOutput().naming(); }

absl::StatusOr<ArrangedOutput> OlmoSafetensorsOutput::Arrange(TargetLayout engine_layout,
                                                              const ArrangeRequest& request) const {
  ArrangedOutput arranged;
  TargetLayout& layout = arranged.layout;
  if (request.consolidate && engine_layout.files.size() > 1) {
    OutputFileLayout one;
    one.name = naming().shard_file(0, 1);
    one.structure = request.catalog.structure;
    for (OutputFileLayout& file : engine_layout.files) {
      const int base = static_cast<int>(one.tensors.size());
      for (OutputTensor& tensor : file.tensors) {
        if (tensor.alias_of >= 0) tensor.alias_of += base;
        one.tensors.push_back(std::move(tensor));
      }
    }
    layout.kind = engine_layout.kind;
    layout.files.push_back(std::move(one));
  } else {
    layout = std::move(engine_layout);
  }
  for (OutputFileLayout& file : layout.files) {
    for (OutputTensor& tensor : file.tensors) tensor.alias_of = -1;
  }
  return arranged;
}

absl::StatusOr<FileFraming> OlmoSafetensorsOutput::Frame(const OutputFileLayout& file) const {
  EntryCollector collector(file);
  if (file.structure != nullptr) {
    if (file.structure->kind != Node::kDict) {
      return absl::UnimplementedError(absl::StrCat("the input's state is a ",
                                                   DescribeValue(*file.structure),
                                                   ", but OLMo's safetensors files hold a dict"));
    }
    OlmoKey prefix;
    RETURN_IF_ERROR(collector.Flatten(*file.structure, prefix));
  }
  RETURN_IF_ERROR(collector.AddRemaining());
  std::vector<Entry> entries = collector.Take();
  std::sort(entries.begin(), entries.end(), [](const Entry& x, const Entry& y) {
    if (x.dtype != y.dtype) return DTypeSortRank(x.dtype) > DTypeSortRank(y.dtype);
    return x.name < y.name;
  });
  std::vector<SafetensorsTensorEntry> header_entries;
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& entry = entries[i];
    if (i > 0 && entries[i - 1].name == entry.name) {
      return absl::InvalidArgumentError(absl::StrCat("two values have the key ", entry.name));
    }
    const uint64_t bytes =
        entry.tensor >= 0 ? file.tensors[entry.tensor].bytes() : entry.pickle.size();
    header_entries.push_back({entry.name, entry.dtype, entry.shape, offset, offset + bytes});
    offset += bytes;
  }
  ASSIGN_OR_RETURN(std::string header, EncodeSafetensorsHeader(header_entries, {}));
  FileFraming framing;
  framing.segments.push_back({FramingSegment::Kind::kBytes, std::move(header), -1});
  for (Entry& entry : entries) {
    if (entry.tensor >= 0) {
      framing.segments.push_back({FramingSegment::Kind::kTensor, "", entry.tensor});
    } else if (!entry.pickle.empty()) {
      framing.segments.push_back({FramingSegment::Kind::kBytes, std::move(entry.pickle), -1});
    }
  }
  return framing;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
OlmoSafetensorsOutput::CompanionFiles(const TargetLayout& /*layout*/) const {
  return std::vector<std::pair<std::string, std::string>>{};
}

namespace {
const InputFormatRegistration<OlmoSafetensorsInput> register_input;
const OutputFormatRegistration<OlmoSafetensorsOutput> register_output;
}  // namespace

}  // namespace reshard
