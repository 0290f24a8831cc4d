#include "lib/formats/torch/torch_file.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/core/status.h"
#include "lib/io/crc32.h"
#include "lib/io/mapped_file.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;

// A tensor's rebuild call: a torch._utils._rebuild_tensor_v2/_v3 function and its arguments.
struct Rebuild {
  const PickleValue* function = nullptr;
  const PickleValue* args = nullptr;
};

// The rebuild call behind a value, if it is a tensor, a Parameter of one, or a tensor subclass
// (_rebuild_from_type_v2 wraps the plain rebuild; the subclass and its Python attributes, such
// as DeepSpeed's ds_id, live on the Python side only).
std::optional<Rebuild> TensorCall(const PickleValue* function, const PickleValue* args,
                                  int depth = 0) {
  if (depth > 8 || function == nullptr || function->kind != Kind::kGlobal || args == nullptr ||
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
    return TensorCall(args->items[0]->callable, args->items[0]->args, depth + 1);
  }
  if (function->IsGlobal("torch._tensor", "_rebuild_from_type_v2") && args->items.size() >= 3) {
    return TensorCall(args->items[0], args->items[2], depth + 1);
  }
  return std::nullopt;
}

std::optional<Rebuild> TensorCall(const PickleValue* value) {
  if (value == nullptr || value->kind != Kind::kObject) return std::nullopt;
  return TensorCall(value->callable, value->args);
}

}  // namespace

std::optional<DType> TorchDType(absl::string_view name) {
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

bool IsLegacyTorchSave(absl::string_view head) {
  // LONG1 of 10 bytes: 0x1950a86a20f9469cfc6c, little-endian.
  const absl::string_view magic(kLegacyTorchMagic + 2, kLegacyTorchMagicSize - 2);
  if (head.size() < 2 || head[0] != '\x80') return false;
  size_t at = 2;                                        // after PROTO n
  if (head.size() > at && head[at] == '\x95') at += 9;  // FRAME with an 8-byte length
  return head.size() >= at + magic.size() && head.substr(at, magic.size()) == magic;
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::Parse(absl::string_view bytes,
                                                                  const std::string& path) {
  ViewByteSource source(bytes, path);
  return Parse(source);
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::Parse(ByteSource& source) {
  return Parse(source, ZipArchive::kTailBytes);
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::Parse(ByteSource& source,
                                                                  uint64_t zip_tail_bytes) {
  const std::string& path = source.path();
  ZipArchive::ParseOptions zip_options;
  zip_options.tail_bytes = zip_tail_bytes;
  zip_options.prefetch_payloads = {"data.pkl", "byteorder"};
  absl::StatusOr<ZipArchive> parsed = ZipArchive::Parse(source, zip_options);
  if (!parsed.ok()) {
    // Not a zip: say so when it is the legacy format (its first bytes, read only now, so that
    // a remote file's metadata starts with the tail).
    auto head = source.Read(0, std::min<uint64_t>(32, source.size()), "first bytes");
    if (head.ok() && IsLegacyTorchSave(*head)) {
      return absl::UnimplementedError(absl::StrCat(
          path,
          ": the legacy torch.save format (torch < 1.6, _use_new_zipfile_serialization=False, "
          "or DeepSpeed's checkpoint_serialization: false), whose storages cannot be read in "
          "place; load and save it again with a current torch"));
    }
    return parsed.status();
  }
  const ZipArchive& archive = *parsed;
  const ZipEntry* pickle = archive.Find("data.pkl");
  if (pickle == nullptr) {
    return absl::DataLossError(absl::StrCat(path, ": zip archive has no ", archive.top(),
                                            "/data.pkl; not a torch.save file"));
  }
  if (archive.Find("constants.pkl") != nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": a TorchScript archive (torch.jit.save), not a state dict"));
  }
  if (const ZipEntry* order = archive.Find("byteorder"); order != nullptr && order->size <= 16) {
    ASSIGN_OR_RETURN(absl::string_view byteorder,
                     source.Read(order->data_offset, order->size, "byteorder"));
    if (byteorder == "big") {
      return absl::UnimplementedError(
          absl::StrCat(path, ": saved on a big-endian machine (byteorder \"big\")"));
    }
  }
  if (pickle->method != 0) {
    return absl::UnimplementedError(absl::StrCat(path, ": data.pkl is compressed"));
  }
  // data.pkl names the tensors and gives their shapes and offsets: a damaged byte there reads as
  // a different model, so its CRC-32 is checked here, when the archive records one (torch.save
  // with set_crc32_options(False) writes 0; storage records are checked when converting).
  ASSIGN_OR_RETURN(const absl::string_view pickle_bytes,
                   source.Read(pickle->data_offset, pickle->size, "data.pkl"));
  if (pickle->crc32 != 0) {
    const uint32_t crc = Crc32(0, pickle_bytes.data(), pickle_bytes.size());
    if (crc != pickle->crc32) {
      return absl::DataLossError(absl::StrFormat(
          "%s: data.pkl fails its CRC-32 (recorded %08x, computed %08x): the file is damaged", path,
          pickle->crc32, crc));
    }
  }
  auto result = std::unique_ptr<TorchArchive>(new TorchArchive);
  result->path_ = path;
  result->size_ = source.size();
  TorchArchive* self = result.get();
  PersistentLoad load = [self, &archive](PickleValue* pid, PickleArena& arena) {
    return self->LoadStorage(pid, arena, archive);
  };
  ASSIGN_OR_RETURN(result->root_, ParsePickle(pickle_bytes, result->arena_, load),
                   absl::StrCat(path, ": data.pkl"));
  return result;
}

absl::StatusOr<std::unique_ptr<TorchArchive>> TorchArchive::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  file.AdviseRandomAccess();  // zip local headers are spread over the whole file
  auto archive = Parse(*ByteSourceFor(file));
  // Only metadata pages were touched; give them back before any conversion runs.
  file.Release(0, file.size());
  if (archive.ok()) (*archive)->version_ = file.version();
  return archive;
}

absl::StatusOr<PickleValue*> TorchArchive::LoadStorage(PickleValue* pid, PickleArena& arena,
                                                       const ZipArchive& archive) {
  if (pid->kind != Kind::kTuple || pid->items.size() != 5 || pid->items[0]->kind != Kind::kString ||
      pid->items[0]->text != "storage" || pid->items[1]->kind != Kind::kGlobal ||
      pid->items[2]->kind != Kind::kString || pid->items[4]->kind != Kind::kInt) {
    return absl::DataLossError(
        absl::StrCat("persistent id is ", DescribePickleValue(pid),
                     ", not ('storage', class, key, location, numel) as torch.save writes"));
  }
  const std::string& key = pid->items[2]->text;
  if (auto known = storages_.find(key); known != storages_.end()) {
    // torch.save names each storage once; a key seen again must describe the same storage.
    const PickleValue* cls = pid->items[1];
    const std::optional<DType> dtype =
        cls->name == "UntypedStorage" ? std::nullopt : TorchDType(cls->name);
    if (dtype != known->second.dtype || pid->items[4]->integer != known->second.numel) {
      return absl::DataLossError(absl::StrCat("storage ", key, " is referenced as ", cls->name,
                                              " of ", pid->items[4]->integer,
                                              " elements after being a different storage"));
    }
  } else {
    Storage storage;
    storage.key = key;
    storage.numel = pid->items[4]->integer;
    const PickleValue* cls = pid->items[1];
    if (cls->name != "UntypedStorage") {
      storage.dtype = TorchDType(cls->name);
      if (!storage.dtype.has_value() || !absl::StartsWith(cls->module, "torch")) {
        return absl::UnimplementedError(absl::StrCat("storage ", key, " of class ", cls->module,
                                                     ".", cls->name, " is not supported"));
      }
    }
    const ZipEntry* entry = archive.Find(absl::StrCat("data/", key));
    if (entry == nullptr) {
      return absl::DataLossError(absl::StrCat("storage record data/", key, " is missing"));
    }
    if (entry->method != 0) {
      return absl::UnimplementedError(
          absl::StrCat("storage record data/", key,
                       " is compressed; reshard reads storages in place and "
                       "needs them stored, as torch.save writes them"));
    }
    const uint64_t element = storage.dtype.has_value() ? DTypeSize(*storage.dtype) : 1;
    unsigned __int128 bytes = static_cast<unsigned __int128>(storage.numel) * element;
    if (storage.numel < 0 || bytes != entry->size) {
      return absl::DataLossError(absl::StrCat("storage data/", key, " should hold ", storage.numel,
                                              " elements of ", element,
                                              " bytes but its record has ", entry->size,
                                              " bytes (at byte offset ", entry->data_offset, ")"));
    }
    storage.data_offset = entry->data_offset;
    storage.size = entry->size;
    storage.crc32 = entry->crc32;
    storage.entry_name = entry->name;
    storages_[key] = std::move(storage);
  }
  PickleValue* handle = arena.New(Kind::kPersistent);
  handle->text = key;
  return handle;
}

bool TorchArchive::IsTensor(const PickleValue* value) { return TensorCall(value).has_value(); }

std::vector<ChecksummedRange> TorchArchive::ChecksummedRanges(uint64_t base) const {
  std::vector<ChecksummedRange> ranges;
  ranges.reserve(storages_.size());
  for (const auto& [key, storage] : storages_) {
    ranges.push_back({base + storage.data_offset, storage.size, storage.crc32,
                      absl::StrCat("zip entry \"", storage.entry_name, "\"")});
  }
  std::sort(ranges.begin(), ranges.end(), [](const ChecksummedRange& a, const ChecksummedRange& b) {
    return a.offset < b.offset;
  });
  return ranges;
}

SourceFile TorchArchive::Source() const {
  return SourceFile{path_, size_, ChecksummedRanges(), version_};
}

absl::StatusOr<std::optional<TensorLocation>> TorchArchive::Tensor(const PickleValue* value,
                                                                   absl::string_view name) const {
  auto error = [&](absl::string_view message) {
    return absl::DataLossError(absl::StrCat(path_, ": \"", name, "\": ", message));
  };
  std::optional<Rebuild> rebuild = TensorCall(value);
  if (!rebuild.has_value()) {
    if (value != nullptr && value->kind == Kind::kObject && value->callable != nullptr &&
        absl::StartsWith(value->callable->module, "torch") &&
        absl::StartsWith(value->callable->name, "_rebuild_")) {
      return absl::UnimplementedError(
          absl::StrCat(path_, ": \"", name, "\": tensors rebuilt by ", value->callable->module, ".",
                       value->callable->name, " (quantized, sparse, nested) are not supported"));
    }
    return std::nullopt;
  }
  const std::string& function = rebuild->function->name;
  const std::vector<PickleValue*>& args = rebuild->args->items;
  const bool v3 = function == "_rebuild_tensor_v3";
  if (args.size() < (v3 ? 7u : 4u) || args[0]->kind != Kind::kPersistent ||
      args[1]->kind != Kind::kInt) {
    return error(absl::StrCat("malformed ", function, " call"));
  }
  const Storage& storage = storages_.at(args[0]->text);
  std::optional<std::vector<int64_t>> shape = PickleShape(args[2]);
  std::optional<std::vector<int64_t>> strides = PickleShape(args[3]);
  if (!shape.has_value()) return error(absl::StrCat("size is ", DescribePickleValue(args[2])));
  if (!strides.has_value()) return error(absl::StrCat("stride is ", DescribePickleValue(args[3])));
  if (shape->size() != strides->size()) return error("size and stride differ in length");
  std::optional<DType> dtype = storage.dtype;
  if (v3) {
    const PickleValue* global = args[6];
    if (global->kind != Kind::kGlobal || global->module != "torch" ||
        !TorchDType(global->name).has_value()) {
      return absl::UnimplementedError(absl::StrCat(
          path_, ": \"", name, "\": dtype ", DescribePickleValue(global), " is not supported"));
    }
    dtype = TorchDType(global->name);
  }
  if (!dtype.has_value()) return error("untyped storage without a dtype");
  const uint64_t element = DTypeSize(*dtype);
  const uint64_t storage_elements = storage.size / element;
  const int64_t offset = args[1]->integer;
  absl::StatusOr<int64_t> elements = NumElements(*shape);
  if (!elements.ok()) return error(elements.status().message());
  const int64_t count = *elements;
  // The view must stay inside its storage.
  if (offset < 0 || static_cast<uint64_t>(offset) > storage_elements) {
    return error(absl::StrCat("storage offset ", offset, " is outside storage ", storage.key,
                              " of ", storage_elements, " elements"));
  }
  if (count > 0) {
    unsigned __int128 last = static_cast<uint64_t>(offset);
    for (size_t d = 0; d < shape->size(); ++d) {
      last +=
          static_cast<unsigned __int128>((*shape)[d] - 1) * static_cast<uint64_t>((*strides)[d]);
    }
    if (last >= storage_elements) {
      return error(absl::StrCat("view of shape ", ShapeToString(*shape), " strides ",
                                ShapeToString(*strides), " at offset ", offset,
                                " reaches past storage ", storage.key, " (", storage_elements,
                                " elements, record at byte offset ", storage.data_offset, ")"));
    }
  }
  TensorLocation location;
  location.dtype = *dtype;
  location.shape = *std::move(shape);
  location.strides = *std::move(strides);
  location.byte_offset = storage.data_offset + static_cast<uint64_t>(offset) * element;
  location.storage_key = storage.key;
  return location;
}

CatalogTensor CatalogTensorAt(std::string name, TensorLocation location, int file) {
  CatalogTensor tensor{std::move(name), location.dtype, location.shape, {}};
  SourcePiece piece;
  piece.file = file;
  piece.byte_offset = location.byte_offset;
  piece.box = Box::Full(location.shape);
  piece.strides = std::move(location.strides);
  tensor.pieces.push_back(std::move(piece));
  return tensor;
}

const std::vector<std::pair<PickleValue*, PickleValue*>>* PickleEntries(const PickleValue* value) {
  if (value == nullptr) return nullptr;
  if (value->kind == Kind::kDict) return &value->entries;
  if (value->kind == Kind::kObject && !value->entries.empty()) return &value->entries;
  return nullptr;
}

const std::vector<PickleValue*>* PickleItems(const PickleValue* value) {
  if (value == nullptr) return nullptr;
  if (value->kind == Kind::kList || value->kind == Kind::kTuple) return &value->items;
  return nullptr;
}

const PickleValue* PickleField(const PickleValue* value, absl::string_view key) {
  if (value == nullptr) return nullptr;
  auto find = [&](const PickleValue* dict) -> const PickleValue* {
    const auto* entries = PickleEntries(dict);
    if (entries == nullptr) return nullptr;
    for (const auto& [k, v] : *entries) {
      if (k->kind == Kind::kString && k->text == key) return v;
    }
    return nullptr;
  };
  if (const PickleValue* found = find(value); found != nullptr) return found;
  if (value->kind == Kind::kObject && value->state != nullptr) {
    if (const PickleValue* found = find(value->state); found != nullptr) return found;
    // Objects with __slots__ pickle their state as (dict or None, slots dict).
    if (value->state->kind == Kind::kTuple && value->state->items.size() == 2) {
      for (const PickleValue* part : value->state->items) {
        if (const PickleValue* found = find(part); found != nullptr) return found;
      }
    }
  }
  return nullptr;
}

std::optional<int64_t> PickleInt(const PickleValue* value) {
  if (value == nullptr) return std::nullopt;
  if (value->kind == Kind::kInt) return value->integer;
  if (value->kind == Kind::kBool) return value->boolean ? 1 : 0;
  // An int Enum member pickles as a call of its class with the value.
  if (value->kind == Kind::kObject && value->args != nullptr && value->args->kind == Kind::kTuple &&
      value->args->items.size() == 1 && value->args->items[0]->kind == Kind::kInt &&
      !TensorCall(value).has_value()) {
    return value->args->items[0]->integer;
  }
  return std::nullopt;
}

std::optional<std::string> PickleString(const PickleValue* value) {
  if (value == nullptr || value->kind != Kind::kString) return std::nullopt;
  return value->text;
}

std::optional<std::vector<int64_t>> PickleShape(const PickleValue* value) {
  if (value == nullptr) return std::nullopt;
  if (value->IsObjectOf("torch", "Size")) {
    if (value->args == nullptr || value->args->items.size() != 1) return std::nullopt;
    value = value->args->items[0];
  }
  if (value->kind != Kind::kTuple && value->kind != Kind::kList) return std::nullopt;
  std::vector<int64_t> ints;
  ints.reserve(value->items.size());
  for (const PickleValue* item : value->items) {
    if (item->kind != Kind::kInt || item->integer < 0) return std::nullopt;
    ints.push_back(item->integer);
  }
  return ints;
}

}  // namespace reshard
