#include "lib/core/catalog.h"

#include <algorithm>

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

Json StructureJson(const StructureNode& node) {
  using Kind = StructureNode::Kind;
  switch (node.kind) {
    case Kind::kNone:
      return {{"none", 0}};
    case Kind::kBool:
      return {{"bool", node.boolean}};
    case Kind::kInt:
      return {{"int", node.integer}};
    case Kind::kFloat:
      return {{"float", node.real}};
    case Kind::kString:
      return {{"str", node.text}};
    case Kind::kTensor:
      return {{"tensor", node.text}};
    case Kind::kDict: {
      Json entries = Json::array();
      for (size_t i = 0; i < node.keys.size(); ++i) {
        entries.push_back(
            Json::array({StructureJson(node.keys[i]), StructureJson(node.values[i])}));
      }
      return {{"dict", std::move(entries)}, {"ordered", node.ordered}};
    }
    case Kind::kList:
    case Kind::kTuple: {
      Json items = Json::array();
      for (const StructureNode& item : node.items) items.push_back(StructureJson(item));
      return {{node.kind == Kind::kList ? "list" : "tuple", std::move(items)}};
    }
  }
  return nullptr;
}

absl::StatusOr<StructureNode> StructureFromJsonValue(const Json& json, int depth) {
  using Kind = StructureNode::Kind;
  if (depth > 64) return absl::InvalidArgumentError("structure nests deeper than 64 levels");
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
  } else if (json.contains("str") && json["str"].is_string()) {
    node.kind = Kind::kString;
    node.text = json["str"].get<std::string>();
  } else if (json.contains("tensor") && json["tensor"].is_string()) {
    node.kind = Kind::kTensor;
    node.text = json["tensor"].get<std::string>();
  } else if (json.contains("dict") && json["dict"].is_array()) {
    node.kind = Kind::kDict;
    node.ordered = json.value("ordered", false);
    for (const Json& entry : json["dict"]) {
      if (!entry.is_array() || entry.size() != 2) {
        return absl::InvalidArgumentError("dict entry is not a [key, value] pair");
      }
      ASSIGN_OR_RETURN(StructureNode key, StructureFromJsonValue(entry[0], depth + 1));
      ASSIGN_OR_RETURN(StructureNode value, StructureFromJsonValue(entry[1], depth + 1));
      node.keys.push_back(std::move(key));
      node.values.push_back(std::move(value));
    }
  } else if ((json.contains("list") && json["list"].is_array()) ||
             (json.contains("tuple") && json["tuple"].is_array())) {
    const bool list = json.contains("list");
    node.kind = list ? Kind::kList : Kind::kTuple;
    for (const Json& item : json[list ? "list" : "tuple"]) {
      ASSIGN_OR_RETURN(StructureNode child, StructureFromJsonValue(item, depth + 1));
      node.items.push_back(std::move(child));
    }
  } else {
    return absl::InvalidArgumentError("unknown structure node");
  }
  return node;
}

}  // namespace

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
  return StructureFromJsonValue(parsed, 0);
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
        return absl::DataLossError(absl::StrCat(
            file.path, ": ", range.name, ": ", range.length, " bytes at byte offset ",
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
