#include "lib/core/catalog.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "nlohmann/json.hpp"

namespace reshard {

int Catalog::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

void Catalog::Reindex() {
  index_.clear();
  for (size_t i = 0; i < tensors.size(); ++i) index_[tensors[i].name] = static_cast<int>(i);
}

namespace {

// Emits boxes covering flat elements [begin, end) of `shape`, in flat order. `prefix` fixes the
// indices of dimensions < dim; the range lies inside that prefix's sub-block.
template <typename Emit>
void DecomposeFlatRange(const Shape& shape, const std::vector<int64_t>& strides, int64_t begin,
                        int64_t end, size_t dim, std::vector<int64_t>& prefix, Emit& emit) {
  const size_t rank = shape.size();
  int64_t base = 0;
  for (size_t d = 0; d < dim; ++d) base += prefix[d] * strides[d];
  const int64_t block = strides[dim];  // elements per index step of `dim`
  const int64_t first = (begin - base) / block;
  const int64_t last = (end - 1 - base) / block;
  const bool head_partial = (begin - base) % block != 0;
  const bool tail_partial = (end - base) % block != 0;
  auto emit_block = [&](int64_t from, int64_t to) {  // indices [from, to) of `dim`, full below
    std::vector<int64_t> origin = prefix;
    std::vector<int64_t> extent(dim, 1);
    origin.push_back(from);
    extent.push_back(to - from);
    for (size_t d = dim + 1; d < rank; ++d) {
      origin.push_back(0);
      extent.push_back(shape[d]);
    }
    emit(std::move(origin), std::move(extent), base + from * block);
  };
  if (dim + 1 == rank) {  // innermost dimension: one contiguous run
    emit_block(first, last + 1);
    return;
  }
  auto recurse = [&](int64_t sub_begin, int64_t sub_end, int64_t index) {
    prefix.push_back(index);
    DecomposeFlatRange(shape, strides, sub_begin, sub_end, dim + 1, prefix, emit);
    prefix.pop_back();
  };
  if (first == last) {
    if (head_partial || tail_partial) {
      recurse(begin, end, first);
    } else {
      emit_block(first, first + 1);
    }
    return;
  }
  int64_t full_begin = first;
  if (head_partial) {
    recurse(begin, base + (first + 1) * block, first);
    full_begin = first + 1;
  }
  const int64_t full_end = tail_partial ? last : last + 1;
  if (full_end > full_begin) emit_block(full_begin, full_end);
  if (tail_partial) recurse(base + last * block, end, last);
}

}  // namespace

void AddFlatRangePieces(CatalogTensor& tensor, int file, uint64_t byte_offset, int64_t begin,
                        int64_t end) {
  if (begin >= end) return;
  const std::vector<int64_t> strides = RowMajorStrides(tensor.shape);
  const uint64_t element_size = DTypeSize(tensor.dtype);
  auto emit = [&](std::vector<int64_t> origin, std::vector<int64_t> extent, int64_t flat_origin) {
    SourcePiece piece;
    piece.file = file;
    piece.byte_offset = byte_offset + static_cast<uint64_t>(flat_origin - begin) * element_size;
    piece.box = Box{std::move(origin), std::move(extent)};
    piece.strides = strides;
    tensor.pieces.push_back(std::move(piece));
  };
  if (tensor.shape.empty()) {  // a scalar: the only range is [0, 1)
    emit({}, {}, 0);
    return;
  }
  std::vector<int64_t> prefix;
  DecomposeFlatRange(tensor.shape, strides, begin, end, 0, prefix, emit);
}

namespace {

using Json = nlohmann::json;
using Kind = StructureNode::Kind;

constexpr int kMaxJsonDepth = 64;

Json StructureJson(const StructureNode& node);

Json JsonArray(const std::vector<StructureNode>& nodes) {
  Json array = Json::array();
  for (const StructureNode& node : nodes) array.push_back(StructureJson(node));
  return array;
}

// [[key, value], ...] of a dict's or an object's SETITEMs.
Json JsonEntries(const StructureNode& node) {
  Json entries = Json::array();
  for (size_t i = 0; i < node.keys.size(); ++i) {
    entries.push_back(Json::array({StructureJson(node.keys[i]), StructureJson(node.values[i])}));
  }
  return entries;
}

Json StructureJson(const StructureNode& node) {
  switch (node.kind) {
    case Kind::kNone:
      return {{"none", 0}};
    case Kind::kBool:
      return {{"bool", node.boolean}};
    case Kind::kInt:
      return {{"int", node.integer}};
    case Kind::kFloat:
      if (std::isnan(node.real)) return {{"float", "nan"}};
      if (std::isinf(node.real)) return {{"float", node.real > 0 ? "inf" : "-inf"}};
      return {{"float", node.real}};
    case Kind::kString:
      return {{"str", node.text}};
    case Kind::kTensor:
      return {{"tensor", node.text}};
    case Kind::kBytes:
      return {{"bytes", absl::BytesToHexString(node.text)}};
    case Kind::kBigInt:
      return {{"bigint", absl::BytesToHexString(node.text)}};
    case Kind::kGlobal:
      return {{"global", Json::array({node.module, node.name})}};
    case Kind::kDict: {
      Json dict = {{"dict", JsonEntries(node)}, {"ordered", node.ordered}};
      if (!node.state.empty()) dict["state"] = StructureJson(node.state[0]);
      return dict;
    }
    case Kind::kList:
    case Kind::kTuple:
      return {{node.kind == Kind::kList ? "list" : "tuple", JsonArray(node.items)}};
    case Kind::kObject: {
      Json object = {{"callable", Json::array({node.module, node.name})},
                     {"newobj", node.construction == StructureNode::Construction::kNewObj},
                     {"args", JsonArray(node.args)}};
      if (!node.items.empty()) object["items"] = JsonArray(node.items);
      if (!node.keys.empty()) object["dict"] = JsonEntries(node);
      if (!node.state.empty()) object["state"] = StructureJson(node.state[0]);
      return {{"object", std::move(object)}};
    }
  }
  return nullptr;
}

absl::StatusOr<StructureNode> StructureFromJsonValue(const Json& json, int depth);

absl::StatusOr<std::vector<StructureNode>> NodesFromJson(const Json& array, int depth) {
  std::vector<StructureNode> nodes;
  for (const Json& item : array) {
    ASSIGN_OR_RETURN(StructureNode node, StructureFromJsonValue(item, depth));
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// [[key, value], ...] into node.keys and node.values.
absl::Status EntriesFromJson(const Json& entries, int depth, StructureNode& node) {
  for (const Json& entry : entries) {
    if (!entry.is_array() || entry.size() != 2) {
      return absl::InvalidArgumentError("dict entry is not a [key, value] pair");
    }
    ASSIGN_OR_RETURN(StructureNode key, StructureFromJsonValue(entry[0], depth));
    ASSIGN_OR_RETURN(StructureNode value, StructureFromJsonValue(entry[1], depth));
    node.keys.push_back(std::move(key));
    node.values.push_back(std::move(value));
  }
  return absl::OkStatus();
}

// The bytes spelled by `hex` (kBytes, kBigInt).
absl::StatusOr<std::string> HexBytes(const Json& hex) {
  if (!hex.is_string()) return absl::InvalidArgumentError("hex bytes are not a string");
  const std::string& digits = hex.get_ref<const std::string&>();
  if (digits.size() % 2 != 0 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return absl::ascii_isxdigit(c); })) {
    return absl::InvalidArgumentError("hex bytes are not pairs of hex digits");
  }
  return absl::HexStringToBytes(digits);
}

// [module, name] of a global or an object's callable.
absl::Status GlobalFromJson(const Json& json, StructureNode& node) {
  if (!json.is_array() || json.size() != 2 || !json[0].is_string() || !json[1].is_string()) {
    return absl::InvalidArgumentError("global is not [module, name]");
  }
  node.module = json[0].get<std::string>();
  node.name = json[1].get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<StructureNode> ObjectFromJson(const Json& json, int depth) {
  if (!json.is_object() || !json.contains("callable") || !json.contains("args") ||
      !json["args"].is_array()) {
    return absl::InvalidArgumentError("object has no \"callable\" and \"args\"");
  }
  StructureNode node;
  node.kind = Kind::kObject;
  RETURN_IF_ERROR(GlobalFromJson(json["callable"], node), "object callable");
  if (json.value("newobj", false)) node.construction = StructureNode::Construction::kNewObj;
  ASSIGN_OR_RETURN(node.args, NodesFromJson(json["args"], depth));
  if (json.contains("items")) {
    if (!json["items"].is_array()) return absl::InvalidArgumentError("object items not a list");
    ASSIGN_OR_RETURN(node.items, NodesFromJson(json["items"], depth));
  }
  if (json.contains("dict")) {
    if (!json["dict"].is_array()) return absl::InvalidArgumentError("object dict not a list");
    RETURN_IF_ERROR(EntriesFromJson(json["dict"], depth, node));
  }
  if (json.contains("state")) {
    ASSIGN_OR_RETURN(StructureNode state, StructureFromJsonValue(json["state"], depth));
    node.state.push_back(std::move(state));
  }
  return node;
}

absl::StatusOr<StructureNode> StructureFromJsonValue(const Json& json, int depth) {
  if (depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("structure nests deeper than ", kMaxJsonDepth, " levels"));
  }
  if (!json.is_object() || json.empty()) {
    return absl::InvalidArgumentError("structure node is not a tagged object");
  }
  StructureNode node;
  if (json.contains("none")) return node;
  if (json.contains("bool") && json["bool"].is_boolean()) {
    node.kind = Kind::kBool;
    node.boolean = json["bool"].get<bool>();
  } else if (json.contains("int") && json["int"].is_number_integer()) {
    node.kind = Kind::kInt;
    node.integer = json["int"].get<int64_t>();
  } else if (json.contains("float") && json["float"].is_number()) {
    node.kind = Kind::kFloat;
    node.real = json["float"].get<double>();
  } else if (json.contains("float") && json["float"].is_string()) {
    const std::string& special = json["float"].get_ref<const std::string&>();
    node.kind = Kind::kFloat;
    if (special == "nan") {
      node.real = std::numeric_limits<double>::quiet_NaN();
    } else if (special == "inf" || special == "-inf") {
      node.real = (special == "inf" ? 1 : -1) * std::numeric_limits<double>::infinity();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("float \"", special, "\""));
    }
  } else if (json.contains("str") && json["str"].is_string()) {
    node.kind = Kind::kString;
    node.text = json["str"].get<std::string>();
  } else if (json.contains("tensor") && json["tensor"].is_string()) {
    node.kind = Kind::kTensor;
    node.text = json["tensor"].get<std::string>();
  } else if (json.contains("bytes") || json.contains("bigint")) {
    const bool bytes = json.contains("bytes");
    node.kind = bytes ? Kind::kBytes : Kind::kBigInt;
    ASSIGN_OR_RETURN(node.text, HexBytes(json[bytes ? "bytes" : "bigint"]),
                     bytes ? "bytes" : "bigint");
  } else if (json.contains("global")) {
    node.kind = Kind::kGlobal;
    RETURN_IF_ERROR(GlobalFromJson(json["global"], node));
  } else if (json.contains("object")) {
    return ObjectFromJson(json["object"], depth + 1);
  } else if (json.contains("dict") && json["dict"].is_array()) {
    node.kind = Kind::kDict;
    node.ordered = json.value("ordered", false);
    RETURN_IF_ERROR(EntriesFromJson(json["dict"], depth + 1, node));
    if (json.contains("state")) {
      ASSIGN_OR_RETURN(StructureNode state, StructureFromJsonValue(json["state"], depth + 1));
      node.state.push_back(std::move(state));
    }
  } else if ((json.contains("list") && json["list"].is_array()) ||
             (json.contains("tuple") && json["tuple"].is_array())) {
    const bool list = json.contains("list");
    node.kind = list ? Kind::kList : Kind::kTuple;
    ASSIGN_OR_RETURN(node.items, NodesFromJson(json[list ? "list" : "tuple"], depth + 1));
  } else {
    return absl::InvalidArgumentError("unknown structure node");
  }
  return node;
}

}  // namespace

std::optional<int64_t> IntAttribute(const StructureNode* dict, absl::string_view key) {
  const StructureNode* value = FindKey(dict, key);
  if (value == nullptr) return std::nullopt;
  if (value->kind == StructureNode::Kind::kInt) return value->integer;
  if (value->kind == StructureNode::Kind::kBool) return value->boolean ? 1 : 0;
  return std::nullopt;
}

const StructureNode* StructureNode::Find(absl::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (size_t i = 0; i < keys.size() && i < values.size(); ++i) {
    if (keys[i].kind == Kind::kString && keys[i].text == key) return &values[i];
  }
  return nullptr;
}

StructureNode* StructureNode::Find(absl::string_view key) {
  return const_cast<StructureNode*>(static_cast<const StructureNode*>(this)->Find(key));
}

const StructureNode* StructureNode::Attributes() const {
  if (kind == Kind::kDict) return this;
  if (kind == Kind::kObject && state.size() == 1 && state[0].kind == Kind::kDict) {
    return &state[0];
  }
  return nullptr;
}

StructureNode* StructureNode::Attributes() {
  return const_cast<StructureNode*>(static_cast<const StructureNode*>(this)->Attributes());
}

std::string StructureToJson(const StructureNode& node) {
  return StructureJson(node).dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::StatusOr<StructureNode> StructureFromJson(absl::string_view json) {
  Json parsed;
  try {
    parsed = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("structure is not JSON: ", e.what()));
  }
  try {
    return StructureFromJsonValue(parsed, 0);
  } catch (const Json::exception& e) {  // a tag's value of the wrong type ("ordered": 1)
    return absl::InvalidArgumentError(absl::StrCat("structure is malformed: ", e.what()));
  }
}

std::vector<int> FindAliases(const Catalog& catalog) {
  std::vector<int> aliases(catalog.tensors.size(), -1);
  // Keyed by the first piece's location; equal keys are compared in full.
  absl::flat_hash_map<std::pair<int, uint64_t>, std::vector<int>> by_location;
  for (size_t i = 0; i < catalog.tensors.size(); ++i) {
    const CatalogTensor& tensor = catalog.tensors[i];
    if (tensor.pieces.empty() || NumElementsUnchecked(tensor.shape) == 0) continue;
    auto& candidates = by_location[{tensor.pieces[0].file, tensor.pieces[0].byte_offset}];
    for (int j : candidates) {
      const CatalogTensor& other = catalog.tensors[j];
      bool same = other.dtype == tensor.dtype && other.shape == tensor.shape &&
                  other.pieces.size() == tensor.pieces.size();
      for (size_t p = 0; same && p < tensor.pieces.size(); ++p) {
        const SourcePiece& a = tensor.pieces[p];
        const SourcePiece& b = other.pieces[p];
        same = a.file == b.file && a.byte_offset == b.byte_offset && a.box == b.box &&
               a.strides == b.strides;
      }
      if (same) {
        aliases[i] = j;
        break;
      }
    }
    if (aliases[i] < 0) candidates.push_back(static_cast<int>(i));
  }
  return aliases;
}

uint64_t TensorBytes(const CatalogTensor& tensor) {
  return static_cast<uint64_t>(NumElementsUnchecked(tensor.shape)) * DTypeSize(tensor.dtype);
}

absl::Status ValidateCatalog(const Catalog& catalog) {
  for (const SourceFile& file : catalog.files) {
    for (const ChecksummedRange& range : file.checksummed) {
      if (range.offset > file.size || range.length > file.size - range.offset) {
        return absl::DataLossError(
            absl::StrCat(file.path, ": ", range.name, ": ", range.length, " bytes at byte offset ",
                         range.offset, " run past the end of the file (", file.size, " bytes)"));
      }
    }
  }
  for (const CatalogTensor& tensor : catalog.tensors) {
    const Box full = Box::Full(tensor.shape);
    const uint64_t element_size = DTypeSize(tensor.dtype);
    for (const SourcePiece& piece : tensor.pieces) {
      if (piece.file < 0 || piece.file >= static_cast<int>(catalog.files.size())) {
        return absl::InternalError(absl::StrCat("tensor \"", tensor.name,
                                                "\": piece refers to unknown file #", piece.file));
      }
      const SourceFile& file = catalog.files[piece.file];
      if (piece.box.rank() != tensor.shape.size() || piece.strides.size() != tensor.shape.size() ||
          !Contains(full, piece.box)) {
        return absl::DataLossError(absl::StrCat(
            file.path, ": tensor \"", tensor.name, "\": piece ", BoxToString(piece.box),
            " does not lie inside shape ", ShapeToString(tensor.shape)));
      }
      if (NumElementsUnchecked(piece.box.extent) == 0) continue;
      // Last byte touched, computed in unsigned 128-bit to rule out overflow.
      unsigned __int128 last_element = 0;
      for (size_t d = 0; d < piece.strides.size(); ++d) {
        if (piece.strides[d] < 0) {
          return absl::DataLossError(absl::StrCat(file.path, ": tensor \"", tensor.name,
                                                  "\": negative stride ", piece.strides[d]));
        }
        last_element += static_cast<unsigned __int128>(piece.box.extent[d] - 1) *
                        static_cast<uint64_t>(piece.strides[d]);
      }
      unsigned __int128 end_byte =
          piece.byte_offset + (last_element + 1) * static_cast<unsigned __int128>(element_size);
      if (end_byte > file.size) {
        return absl::DataLossError(
            absl::StrCat(file.path, ": tensor \"", tensor.name, "\": data at byte offset ",
                         piece.byte_offset, " extends to byte ", static_cast<uint64_t>(end_byte),
                         ", past the end of the file (", file.size, " bytes)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard
