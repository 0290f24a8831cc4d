#include "lib/formats/torch/torch_format.h"

#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/zip_archive.h"
#include "lib/io/mapped_file.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

constexpr int kMaxNameDepth = 64;
const std::vector<std::string> kTorchSuffixes = {".pt", ".pth", ".bin", ".ckpt"};

// The first bytes of a pre-1.6 torch.save file: PROTO 2, then LONG1 of the magic number.
constexpr char kLegacyMagic[] = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

// dtype of a typed storage class ("FloatStorage"), or of a torch dtype global ("float32").
std::optional<DType> StorageDType(absl::string_view name) {
  static const auto* const kTable = new absl::flat_hash_map<std::string, DType>{
      {"FloatStorage", DType::kF32},
      {"DoubleStorage", DType::kF64},
      {"HalfStorage", DType::kF16},
      {"BFloat16Storage", DType::kBF16},
      {"LongStorage", DType::kI64},
      {"IntStorage", DType::kI32},
      {"ShortStorage", DType::kI16},
      {"CharStorage", DType::kI8},
      {"ByteStorage", DType::kU8},
      {"BoolStorage", DType::kBool},
      {"float32", DType::kF32},
      {"float", DType::kF32},
      {"float64", DType::kF64},
      {"double", DType::kF64},
      {"float16", DType::kF16},
      {"half", DType::kF16},
      {"bfloat16", DType::kBF16},
      {"int64", DType::kI64},
      {"long", DType::kI64},
      {"int32", DType::kI32},
      {"int", DType::kI32},
      {"int16", DType::kI16},
      {"short", DType::kI16},
      {"int8", DType::kI8},
      {"uint8", DType::kU8},
      {"bool", DType::kBool},
      {"uint16", DType::kU16},
      {"uint32", DType::kU32},
      {"uint64", DType::kU64},
      {"float8_e4m3fn", DType::kF8E4M3},
      {"float8_e5m2", DType::kF8E5M2},
      {"float8_e8m0fnu", DType::kF8E8M0},
  };
  auto it = kTable->find(name);
  if (it == kTable->end()) return std::nullopt;
  return it->second;
}

// A storage named by a persistent id: ('storage', class, key, location, numel).
struct Storage {
  std::string key;
  std::optional<DType> dtype;  // none for UntypedStorage (bytes; the tensor gives its dtype)
  int64_t numel = 0;           // elements of dtype, or bytes when untyped
  const ZipEntry* entry = nullptr;
};

class TorchFileReader {
 public:
  TorchFileReader(const ZipArchive& archive, const std::string& path)
      : archive_(archive), path_(path) {}

  absl::StatusOr<Catalog> Read(absl::string_view data) {
    const ZipEntry* pickle = archive_.Find("data.pkl");
    if (pickle == nullptr) {
      return absl::DataLossError(absl::StrCat(path_, ": zip archive has no ", archive_.top(),
                                              "/data.pkl; not a torch.save file"));
    }
    if (archive_.Find("constants.pkl") != nullptr) {
      return absl::UnimplementedError(
          absl::StrCat(path_, ": a TorchScript archive (torch.jit.save), not a state dict"));
    }
    if (const ZipEntry* order = archive_.Find("byteorder"); order != nullptr && order->size <= 16) {
      if (data.substr(order->data_offset, order->size) == "big") {
        return absl::UnimplementedError(
            absl::StrCat(path_, ": saved on a big-endian machine (byteorder \"big\")"));
      }
    }
    if (pickle->method != 0) {
      return absl::UnimplementedError(absl::StrCat(path_, ": data.pkl is compressed"));
    }
    PersistentLoad load = [this](PickleValue* pid, PickleArena& arena) {
      return LoadStorage(pid, arena);
    };
    auto root = ParsePickle(data.substr(pickle->data_offset, pickle->size), arena_, load);
    if (!root.ok()) return Annotate(root.status(), absl::StrCat(path_, ": data.pkl"));
    catalog_.format = TorchInput::kId;
    catalog_.files.push_back(SourceFile{path_, data.size()});
    ASSIGN_OR_RETURN(StructureNode structure, Walk(*root, "", 0));
    catalog_.structure = std::make_shared<const StructureNode>(std::move(structure));
    catalog_.Reindex();
    return std::move(catalog_);
  }

 private:
  absl::Status Error(absl::string_view name, absl::string_view message) const {
    return absl::DataLossError(absl::StrCat(path_, ": \"", name, "\": ", message));
  }

  absl::StatusOr<PickleValue*> LoadStorage(PickleValue* pid, PickleArena& arena) {
    if (pid->kind != Kind::kTuple || pid->items.size() != 5 ||
        pid->items[0]->kind != Kind::kString || pid->items[0]->text != "storage" ||
        pid->items[1]->kind != Kind::kGlobal || pid->items[2]->kind != Kind::kString ||
        pid->items[4]->kind != Kind::kInt) {
      return absl::DataLossError(
          absl::StrCat("persistent id is ", DescribePickleValue(pid),
                       ", not ('storage', class, key, location, numel) as torch.save writes"));
    }
    const std::string& key = pid->items[2]->text;
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second.first;
    Storage storage;
    storage.key = key;
    storage.numel = pid->items[4]->integer;
    const PickleValue* cls = pid->items[1];
    if (cls->name != "UntypedStorage") {
      storage.dtype = StorageDType(cls->name);
      if (!storage.dtype.has_value() || !absl::StartsWith(cls->module, "torch")) {
        return absl::UnimplementedError(absl::StrCat("storage ", key, " of class ", cls->module,
                                                     ".", cls->name, " is not supported"));
      }
    }
    storage.entry = archive_.Find(absl::StrCat("data/", key));
    if (storage.entry == nullptr) {
      return absl::DataLossError(absl::StrCat("storage record data/", key, " is missing"));
    }
    if (storage.entry->method != 0) {
      return absl::UnimplementedError(
          absl::StrCat("storage record data/", key,
                       " is compressed; reshard reads storages in place and "
                       "needs them stored, as torch.save writes them"));
    }
    const uint64_t element = storage.dtype.has_value() ? DTypeSize(*storage.dtype) : 1;
    unsigned __int128 bytes = static_cast<unsigned __int128>(storage.numel) * element;
    if (storage.numel < 0 || bytes != storage.entry->size) {
      return absl::DataLossError(
          absl::StrCat("storage data/", key, " should hold ", storage.numel, " elements of ",
                       element, " bytes but its record has ", storage.entry->size,
                       " bytes (at byte offset ", storage.entry->data_offset, ")"));
    }
    PickleValue* handle = arena.New(Kind::kPersistent);
    handle->text = key;
    storages_[key] = {handle, storage};
    return handle;
  }

  absl::StatusOr<std::vector<int64_t>> Ints(const PickleValue* value, absl::string_view name,
                                            absl::string_view what) const {
    if (value->kind != Kind::kTuple && value->kind != Kind::kList &&
        !(value->IsObjectOf("torch", "Size") && value->args->items.size() == 1)) {
      return Error(name, absl::StrCat(what, " is ", DescribePickleValue(value), ", not a tuple"));
    }
    const PickleValue* tuple = value->kind == Kind::kObject ? value->args->items[0] : value;
    std::vector<int64_t> ints;
    for (const PickleValue* item : tuple->items) {
      if (item->kind != Kind::kInt || item->integer < 0) {
        return Error(name, absl::StrCat(what, " holds ", DescribePickleValue(item)));
      }
      ints.push_back(item->integer);
    }
    return ints;
  }

  // A tensor's rebuild call: a torch._utils._rebuild_tensor_v2/_v3 function and its arguments.
  struct Rebuild {
    const PickleValue* function = nullptr;
    const PickleValue* args = nullptr;
  };

  // The rebuild call behind a value, if it is a tensor, a Parameter of one, or a tensor
  // subclass (_rebuild_from_type_v2 wraps the plain rebuild; the subclass is Python-side only).
  static std::optional<Rebuild> TensorCall(const PickleValue* function, const PickleValue* args) {
    if (function == nullptr || function->kind != Kind::kGlobal || args == nullptr ||
        args->kind != Kind::kTuple) {
      return std::nullopt;
    }
    if (function->IsGlobal("torch._utils", "_rebuild_tensor_v2") ||
        function->IsGlobal("torch._utils", "_rebuild_tensor_v3")) {
      return Rebuild{function, args};
    }
    if ((function->IsGlobal("torch._utils", "_rebuild_parameter") ||
         function->IsGlobal("torch._utils", "_rebuild_parameter_with_state")) &&
        !args->items.empty() && args->items[0]->kind == Kind::kObject) {
      return TensorCall(args->items[0]->callable, args->items[0]->args);
    }
    if (function->IsGlobal("torch._tensor", "_rebuild_from_type_v2") && args->items.size() >= 3) {
      return TensorCall(args->items[0], args->items[2]);
    }
    return std::nullopt;
  }
  static std::optional<Rebuild> TensorCall(const PickleValue* value) {
    if (value->kind != Kind::kObject) return std::nullopt;
    return TensorCall(value->callable, value->args);
  }

  // Adds the tensor that `rebuild` describes under `name`.
  absl::Status AddTensor(const Rebuild& rebuild, const std::string& name) {
    const std::string& function = rebuild.function->name;
    const std::vector<PickleValue*>& args = rebuild.args->items;
    const bool v3 = function == "_rebuild_tensor_v3";
    if (args.size() < (v3 ? 7u : 4u) || args[0]->kind != Kind::kPersistent ||
        args[1]->kind != Kind::kInt) {
      return Error(name, absl::StrCat("malformed ", function, " call"));
    }
    const auto& [handle, storage] = storages_.at(args[0]->text);
    ASSIGN_OR_RETURN(std::vector<int64_t> shape, Ints(args[2], name, "size"));
    ASSIGN_OR_RETURN(std::vector<int64_t> strides, Ints(args[3], name, "stride"));
    if (shape.size() != strides.size()) return Error(name, "size and stride differ in length");
    std::optional<DType> dtype = storage.dtype;
    if (v3) {
      const PickleValue* global = args[6];
      if (global->kind != Kind::kGlobal || global->module != "torch" ||
          !StorageDType(global->name).has_value()) {
        return absl::UnimplementedError(absl::StrCat(
            path_, ": \"", name, "\": dtype ", DescribePickleValue(global), " is not supported"));
      }
      dtype = StorageDType(global->name);
    }
    if (!dtype.has_value()) return Error(name, "untyped storage without a dtype");
    const uint64_t element = DTypeSize(*dtype);
    const uint64_t storage_elements = static_cast<uint64_t>(storage.entry->size) / element;
    const int64_t offset = args[1]->integer;
    ASSIGN_OR_RETURN(int64_t count, NumElements(shape));
    // The view must stay inside its storage.
    if (offset < 0 || static_cast<uint64_t>(offset) > storage_elements) {
      return Error(name, absl::StrCat("storage offset ", offset, " is outside storage ",
                                      storage.key, " of ", storage_elements, " elements"));
    }
    if (count > 0) {
      unsigned __int128 last = static_cast<uint64_t>(offset);
      for (size_t d = 0; d < shape.size(); ++d) {
        last += static_cast<unsigned __int128>(shape[d] - 1) * static_cast<uint64_t>(strides[d]);
      }
      if (last >= storage_elements) {
        return Error(name, absl::StrCat("view of shape ", ShapeToString(shape), " strides ",
                                        ShapeToString(strides), " at offset ", offset,
                                        " reaches past storage ", storage.key, " (",
                                        storage_elements, " elements, record at byte offset ",
                                        storage.entry->data_offset, ")"));
      }
    }
    if (catalog_.Find(name) >= 0 || !names_.insert(name).second) {
      return Error(name, "two tensors get this name");
    }
    CatalogTensor tensor{name, *dtype, shape, {}};
    SourcePiece piece;
    piece.file = 0;
    piece.byte_offset = storage.entry->data_offset + static_cast<uint64_t>(offset) * element;
    piece.box = Box::Full(shape);
    piece.strides = strides;
    tensor.pieces.push_back(std::move(piece));
    catalog_.tensors.push_back(std::move(tensor));
    return absl::OkStatus();
  }

  static std::string KeyName(const PickleValue* key) {
    switch (key->kind) {
      case Kind::kString:
        return key->text;
      case Kind::kInt:
        return absl::StrCat(key->integer);
      case Kind::kBool:
        return key->boolean ? "True" : "False";
      case Kind::kNone:
        return "None";
      default:
        return absl::StrCat("<", DescribePickleValue(key), ">");
    }
  }

  static std::string Join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
  }

  // Adds the tensors under `value` (named by their key path) to the Catalog and returns the
  // value's structure. Values that cannot be represented (arbitrary Python objects) are listed
  // in other_entries as not carried, and come back as None.
  absl::StatusOr<StructureNode> Walk(const PickleValue* value, const std::string& name, int depth) {
    using Node = StructureNode::Kind;
    StructureNode node;
    if (depth > kMaxNameDepth) return Error(name, "containers nest too deeply");
    // A container shared through the pickle's memo is walked once per reference; bound the
    // total so that a small pickle of shared containers cannot make the walk exponential.
    if (++visits_ > VisitBudget()) {
      return Error(name, "containers are shared so often that walking them would not end");
    }
    if (std::optional<Rebuild> call = TensorCall(value); call.has_value()) {
      const std::string tensor_name = name.empty() ? "tensor" : name;
      RETURN_IF_ERROR(AddTensor(*call, tensor_name));
      node.kind = Node::kTensor;
      node.text = tensor_name;
      return node;
    }
    if (value->kind == Kind::kObject && value->callable != nullptr &&
        absl::StartsWith(value->callable->module, "torch") &&
        absl::StartsWith(value->callable->name, "_rebuild_")) {
      return absl::UnimplementedError(
          absl::StrCat(path_, ": \"", name, "\": tensors rebuilt by ", value->callable->module, ".",
                       value->callable->name, " (quantized, sparse, nested) are not supported"));
    }
    auto note = [&](absl::string_view what) {
      catalog_.other_entries.push_back(absl::StrCat(name.empty() ? "(root)" : name, ": ", what));
    };
    switch (value->kind) {
      case Kind::kNone:
        note("None");
        return node;
      case Kind::kBool:
        note("bool");
        node.kind = Node::kBool;
        node.boolean = value->boolean;
        return node;
      case Kind::kInt:
        note("int");
        node.kind = Node::kInt;
        node.integer = value->integer;
        return node;
      case Kind::kFloat:
        note("float");
        node.kind = Node::kFloat;
        node.real = value->real;
        return node;
      case Kind::kString:
        note("str");
        node.kind = Node::kString;
        node.text = value->text;
        return node;
      case Kind::kList:
      case Kind::kTuple:
        node.kind = value->kind == Kind::kList ? Node::kList : Node::kTuple;
        if (value->items.empty()) note(value->kind == Kind::kList ? "list" : "tuple");
        for (size_t i = 0; i < value->items.size(); ++i) {
          ASSIGN_OR_RETURN(StructureNode child,
                           Walk(value->items[i], Join(name, absl::StrCat(i)), depth + 1));
          node.items.push_back(std::move(child));
        }
        return node;
      case Kind::kDict:
      case Kind::kObject:
        // Dicts, and dict subclasses (objects holding items), which are kept as OrderedDicts.
        if (value->kind == Kind::kDict || !value->entries.empty()) {
          node.kind = Node::kDict;
          node.ordered = value->kind == Kind::kObject || value->ordered;
          for (const auto& [key, item] : value->entries) {
            ASSIGN_OR_RETURN(StructureNode child, Walk(item, Join(name, KeyName(key)), depth + 1));
            ASSIGN_OR_RETURN(StructureNode key_node, KeyNode(key));
            node.keys.push_back(std::move(key_node));
            node.values.push_back(std::move(child));
          }
          return node;
        }
        if (ContainsTensor(value, 0)) {
          return Error(name, absl::StrCat("tensors inside ", DescribePickleValue(value),
                                          " cannot be located"));
        }
        note(absl::StrCat(DescribePickleValue(value), " (not carried to any output)"));
        return node;
      default:
        note(absl::StrCat(DescribePickleValue(value), " (not carried to any output)"));
        return node;
    }
  }

  // Dict keys are strings or ints in checkpoints (optimizer state uses parameter indices).
  absl::StatusOr<StructureNode> KeyNode(const PickleValue* key) const {
    StructureNode node;
    if (key->kind == Kind::kString) {
      node.kind = StructureNode::Kind::kString;
      node.text = key->text;
    } else if (key->kind == Kind::kInt) {
      node.kind = StructureNode::Kind::kInt;
      node.integer = key->integer;
    } else {
      node.kind = StructureNode::Kind::kString;
      node.text = KeyName(key);
    }
    return node;
  }

  bool ContainsTensor(const PickleValue* value, int depth) const {
    if (depth > kMaxNameDepth || ++visits_ > VisitBudget()) return false;
    if (TensorCall(value).has_value()) return true;
    for (const PickleValue* item : value->items) {
      if (ContainsTensor(item, depth + 1)) return true;
    }
    for (const auto& [key, item] : value->entries) {
      if (ContainsTensor(item, depth + 1)) return true;
    }
    return value->state != nullptr && ContainsTensor(value->state, depth + 1);
  }

  const ZipArchive& archive_;
  const std::string path_;
  PickleArena arena_;
  absl::flat_hash_map<std::string, std::pair<PickleValue*, Storage>> storages_;
  absl::flat_hash_set<std::string> names_;
  Catalog catalog_;
  // Values visited by Walk and ContainsTensor, against VisitBudget().
  mutable uint64_t visits_ = 0;
  uint64_t VisitBudget() const { return 4 * arena_.size() + 4096; }
};

absl::StatusOr<FileCatalog> ReadOneFile(const std::string& dir, const std::string& name) {
  const std::string path = dir.empty() ? name : absl::StrCat(dir, "/", name);
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  absl::string_view data(reinterpret_cast<const char*>(file.data()), file.size());
  FileCatalog result;
  result.name = name;
  ASSIGN_OR_RETURN(result.catalog, ReadTorchFile(data, path));
  // Only metadata pages were touched; give them back before the conversion runs.
  file.Release(0, file.size());
  return result;
}

bool LooksLikeTorchFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[14] = {};
  in.read(head, sizeof(head));
  if (in.gcount() >= 4 && std::string(head, 4) == std::string("PK\x03\x04", 4)) return true;
  return in.gcount() == 14 && std::string(head, 14) == std::string(kLegacyMagic, 14);
}

}  // namespace

absl::StatusOr<Catalog> ReadTorchFile(absl::string_view data, const std::string& path) {
  if (data.size() >= 14 && data.substr(0, 14) == absl::string_view(kLegacyMagic, 14)) {
    return absl::UnimplementedError(absl::StrCat(
        path,
        ": the legacy torch.save format (torch < 1.6, or _use_new_zipfile_serialization="
        "False), whose storages cannot be read in place; load and save it again with a current "
        "torch"));
  }
  ASSIGN_OR_RETURN(ZipArchive archive, ZipArchive::Parse(data, path));
  TorchFileReader reader(archive, path);
  return reader.Read(data);
}

bool TorchInput::Probe(const std::string& path) const {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    if (fs::exists(absl::StrCat(path, "/", kTorchIndexName), error)) return true;
    std::vector<std::string> names = ListFolder(path, kTorchSuffixes);
    return !names.empty() && LooksLikeTorchFile(absl::StrCat(path, "/", names[0]));
  }
  return LooksLikeTorchFile(path);
}

absl::StatusOr<InputModel> TorchInput::Read(const std::string& path) const {
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    ASSIGN_OR_RETURN(FileCatalog file, ReadOneFile("", path));
    InputModel model;
    model.format = kId;
    model.layout = "single-file";
    model.parts.push_back(std::move(file.catalog));
    model.part_names.push_back(path);
    return model;
  }
  const std::string index_path = absl::StrCat(path, "/", kTorchIndexName);
  if (fs::exists(index_path, error)) {
    ASSIGN_OR_RETURN(auto weight_map, ReadWeightMap(index_path));
    std::vector<std::string> names;
    for (const auto& [tensor, file] : weight_map) {
      if (std::find(names.begin(), names.end(), file) == names.end()) names.push_back(file);
    }
    std::sort(names.begin(), names.end(), NaturalLess);
    std::vector<FileCatalog> files;
    for (const std::string& name : names) {
      ASSIGN_OR_RETURN(FileCatalog file, ReadOneFile(path, name));
      files.push_back(std::move(file));
    }
    return AssembleIndexedFolder(kId, path, index_path, weight_map, std::move(files));
  }
  std::vector<FileCatalog> files;
  for (const std::string& name : ListFolder(path, kTorchSuffixes)) {
    ASSIGN_OR_RETURN(FileCatalog file, ReadOneFile(path, name));
    files.push_back(std::move(file));
  }
  return AssembleFolder(kId, path, std::move(files));
}

namespace {
const InputFormatRegistration<TorchInput> register_input;
}  // namespace

}  // namespace reshard
