#include "lib/formats/deepspeed/universal_patterns.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/dtype.h"
#include "lib/core/status.h"
#include "re2/re2.h"

namespace reshard {
namespace {

using Node = StructureNode;

// parameter_with_sub_params[index] as a UcpSubParamShape, or InvalidArgument naming the entry.
absl::StatusOr<UcpSubParamShape> ParseSubParamShape(const Node& entry, size_t index) {
  const std::string where =
      absl::StrCat("universal_checkpoint_info.parameter_with_sub_params[", index, "]");
  const Node* fields = entry.Attributes();
  if (fields == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is no SubparamShape (a dict of patterns, shape, partition_dim)"));
  }
  const Node* shape = FindKey(fields, "shape");
  const Node* dim = FindKey(fields, "partition_dim");
  auto is_sequence = [](const Node* node) {
    return node != nullptr && (node->kind == Node::Kind::kTuple || node->kind == Node::Kind::kList);
  };
  if (!is_sequence(shape) || dim == nullptr || dim->kind != Node::Kind::kInt) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " has no shape (a tuple) and partition_dim (an int)"));
  }
  UcpSubParamShape out;
  if (dim->integer < 0 || dim->integer >= static_cast<int64_t>(shape->items.size())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": partition_dim ", dim->integer,
                                                   " is not a dimension of its ",
                                                   shape->items.size(), "-d shape"));
  }
  out.partition_dim = static_cast<int>(dim->integer);
  for (size_t d = 0; d < shape->items.size(); ++d) {
    const Node& size = shape->items[d];
    // A dimension is an int, or a tuple of sub-param sizes (summed: the tensor's dimension).
    std::vector<int64_t> sizes;
    if (size.kind == Node::Kind::kInt) {
      sizes.push_back(size.integer);
    } else if (is_sequence(&size)) {
      for (const Node& item : size.items) {
        if (item.kind != Node::Kind::kInt) sizes.clear();
        if (item.kind != Node::Kind::kInt) break;
        sizes.push_back(item.integer);
      }
    }
    int64_t total = 0;
    for (int64_t part : sizes) total = part > 0 ? total + part : -1;
    if (sizes.empty() || total <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": dimension ", d, " of its shape is not a positive int or tuple of them"));
    }
    out.shape.push_back(total);
    if (static_cast<int>(d) == out.partition_dim) out.sizes = std::move(sizes);
  }
  if (entry.kind == Node::Kind::kObject) {
    out.saved = entry;
  } else {
    // What SubparamShape(**entry) pickles as (protocol 2): cls.__new__(cls), then its fields.
    out.saved.kind = Node::Kind::kObject;
    out.saved.module = "deepspeed.checkpoint.universal_checkpoint";
    out.saved.name = "SubparamShape";
    out.saved.construction = Node::Construction::kNewObj;
    Node state = Node::Dict();
    for (const char* key : {"patterns", "shape", "partition_dim"}) {
      const Node* value = FindKey(fields, key);
      if (value != nullptr) state.Add(Node::String(key), *value);
    }
    out.saved.state.push_back(std::move(state));
  }
  return out;
}

// The part of `piece` within rows [from, to) along `dim` (keeping the piece's coordinates), or
// nullopt when they do not meet.
std::optional<SourcePiece> CutRows(const SourcePiece& piece, int dim, int64_t from, int64_t to,
                                   DType dtype) {
  const int64_t begin = piece.box.origin[dim];
  const int64_t end = begin + piece.box.extent[dim];
  from = std::max(from, begin);
  to = std::min(to, end);
  if (from >= to) return std::nullopt;
  SourcePiece sub = piece;
  sub.box.origin[dim] = from;
  sub.box.extent[dim] = to - from;
  sub.byte_offset += static_cast<uint64_t>((from - begin) * piece.strides[dim]) * DTypeSize(dtype);
  return sub;
}

}  // namespace

UniversalPatterns::UniversalPatterns() = default;
UniversalPatterns::UniversalPatterns(UniversalPatterns&&) noexcept = default;
UniversalPatterns& UniversalPatterns::operator=(UniversalPatterns&&) noexcept = default;
UniversalPatterns::~UniversalPatterns() = default;

bool UniversalPatterns::List::Matches(absl::string_view name) const {
  for (const auto& re : compiled) {
    if (RE2::PartialMatch(re2::StringPiece(name.data(), name.size()), *re)) return true;
  }
  return false;
}

absl::Status UniversalPatterns::AddList(const Node* node, absl::string_view key, List& list) {
  if (node == nullptr || (node->kind != Node::Kind::kList && node->kind != Node::Kind::kTuple)) {
    return absl::OkStatus();
  }
  for (const Node& item : node->items) {
    if (item.kind != Node::Kind::kString) continue;
    RE2::Options options;
    options.set_log_errors(false);
    auto compiled = std::make_unique<RE2>(absl::StrCat("^(?:", item.text, ")"), options);
    if (!compiled->ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("universal_checkpoint_info.", key, ": \"", item.text,
                       "\" is not a regular expression reshard can use: ", compiled->error()));
    }
    list.patterns.push_back(item.text);
    list.compiled.push_back(std::move(compiled));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniversalPatterns> UniversalPatterns::FromInfo(const Node* info) {
  UniversalPatterns out;
  if (info == nullptr || info->kind != Node::Kind::kDict) return out;
  if (const Node* size = FindKey(info, "original_vocab_size");
      size != nullptr && size->kind == Node::Kind::kInt) {
    out.original_vocab_size_ = size->integer;
  }
  for (auto [key, list] :
       {std::pair<const char*, List*>{"tp_replicated_parameter_patterns", &out.replicated_},
        {"parameter_to_average_patterns", &out.average_},
        {"parameter_with_2_sub_params_cat_dim_0", &out.two_sub_},
        {"parameter_with_row_parallelism_patterns", &out.row_},
        {"vocabulary_parameter_patterns", &out.vocab_},
        {"pipeline_replicated_parameter_patterns", &out.pipeline_}}) {
    RETURN_IF_ERROR(AddList(FindKey(info, key), key, *list));
  }
  // parameter_with_sub_params: a list of SubparamShape dicts {patterns, shape, partition_dim}.
  if (const Node* shapes = FindKey(info, "parameter_with_sub_params"); shapes != nullptr) {
    for (size_t i = 0; i < shapes->items.size(); ++i) {
      SubParams entry;
      ASSIGN_OR_RETURN(entry.shape, ParseSubParamShape(shapes->items[i], i));
      RETURN_IF_ERROR(AddList(FindKey(shapes->items[i].Attributes(), "patterns"),
                              "parameter_with_sub_params", entry.list));
      out.sub_params_.push_back(std::move(entry));
    }
  }
  return out;
}

UcpParamRule UniversalPatterns::Classify(absl::string_view name) const {
  UcpParamRule rule;
  if (replicated_.Matches(name)) {
    rule.merge = UcpMerge::kReplicated;
  } else if (average_.Matches(name)) {
    rule.merge = UcpMerge::kAverage;
  } else if (two_sub_.Matches(name)) {
    rule.merge = UcpMerge::kTwoSubParams;
  } else if (SubParamShape(name) != nullptr) {
    rule.merge = UcpMerge::kSubParams;
  } else if (row_.Matches(name)) {
    rule.merge = UcpMerge::kRowParallel;
  }
  rule.vocab = vocab_.Matches(name);
  return rule;
}

const UcpSubParamShape* UniversalPatterns::SubParamShape(absl::string_view name) const {
  for (const SubParams& entry : sub_params_) {
    if (entry.list.Matches(name)) return &entry.shape;
  }
  return nullptr;
}

bool UniversalPatterns::PipelineReplicated(absl::string_view name) const {
  return pipeline_.Matches(name);
}

std::vector<PartitionRule> UniversalPatterns::MergeRules() const {
  std::vector<PartitionRule> rules;
  auto add = [&](const List& list, auto set) {
    for (const std::string& pattern : list.patterns) {
      PartitionRule rule;
      rule.pattern = absl::StrCat("^(?:", pattern, ")");
      set(rule);
      rules.push_back(std::move(rule));
    }
  };
  add(replicated_, [](PartitionRule& r) { r.replicate = true; });
  // Averaged params: the merged Catalog holds TP rank 0's slice (what a reader of the weights
  // gets); the universal output averages the slices the reader keeps in its training state.
  add(average_, [](PartitionRule& r) { r.replicate = true; });
  add(two_sub_, [](PartitionRule& r) { r.fused = 2; });
  for (const SubParams& entry : sub_params_) {
    add(entry.list, [&](PartitionRule& r) { r.split_dim = entry.shape.partition_dim; });
  }
  add(row_, [](PartitionRule& r) { r.split_dim = 1; });
  PartitionRule rest;
  rest.pattern = ".*";
  rules.push_back(std::move(rest));
  return rules;
}

absl::string_view UcpMergeName(UcpMerge merge) {
  switch (merge) {
    case UcpMerge::kReplicated:
      return "tp_replicated_parameter_patterns";
    case UcpMerge::kAverage:
      return "parameter_to_average_patterns";
    case UcpMerge::kTwoSubParams:
      return "parameter_with_2_sub_params_cat_dim_0";
    case UcpMerge::kSubParams:
      return "parameter_with_sub_params";
    case UcpMerge::kRowParallel:
      return "parameter_with_row_parallelism_patterns";
    case UcpMerge::kColumnParallel:
      break;
  }
  return "(no pattern: concatenated on dim 0)";
}

absl::Status RegroupSubParams(std::vector<Catalog>& parts, const std::string& name,
                              const UcpSubParamShape& shape) {
  const int64_t tp = static_cast<int64_t>(parts.size());
  const int dim = shape.partition_dim;
  Shape slice_shape = shape.shape;
  slice_shape[dim] /= tp;
  for (int64_t size : shape.sizes) {
    if (size % tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", name,
                       "\": universal_checkpoint_info.parameter_with_sub_params gives "
                       "it a sub-param of ",
                       size, " rows along dimension ", dim, ", which TP ", tp, " does not divide"));
    }
  }
  // Every piece of the merged tensor, with the part whose files it points into.
  std::vector<std::pair<size_t, SourcePiece>> merged;
  DType dtype = DType::kF32;
  for (size_t p = 0; p < parts.size(); ++p) {
    const int index = parts[p].Find(name);
    if (index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", name, "\" is missing from TP rank ", p));
    }
    const CatalogTensor& slice = parts[p].tensors[index];
    if (slice.shape != slice_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", name, "\": TP rank ", p, " holds ", ShapeToString(slice.shape),
          ", but universal_checkpoint_info.parameter_with_sub_params gives it shape ",
          ShapeToString(shape.shape), ", ", ShapeToString(slice_shape), " per TP rank of ", tp));
    }
    dtype = slice.dtype;
    // Sub-param j: local rows [local, local + rows) go to merged rows tp * local + p * rows on.
    int64_t local = 0;
    for (int64_t size : shape.sizes) {
      const int64_t rows = size / tp;
      const int64_t shift = tp * local + static_cast<int64_t>(p) * rows - local;
      for (const SourcePiece& piece : slice.pieces) {
        if (std::optional<SourcePiece> sub = CutRows(piece, dim, local, local + rows, dtype)) {
          sub->box.origin[dim] += shift;
          merged.emplace_back(p, *std::move(sub));
        }
      }
      local += rows;
    }
  }
  // Part t takes merged rows [t * R, (t + 1) * R), in its own coordinates and file indices.
  const int64_t rows = slice_shape[dim];
  for (size_t t = 0; t < parts.size(); ++t) {
    Catalog& part = parts[t];
    std::map<std::pair<size_t, int>, int> file_of;  // (source part, file) -> file of `part`
    std::vector<SourcePiece> pieces;
    for (const auto& [p, piece] : merged) {
      std::optional<SourcePiece> sub = CutRows(piece, dim, static_cast<int64_t>(t) * rows,
                                               static_cast<int64_t>(t + 1) * rows, dtype);
      if (!sub.has_value()) continue;
      sub->box.origin[dim] -= static_cast<int64_t>(t) * rows;
      if (p != t) {
        auto [slot, added] = file_of.emplace(std::make_pair(p, sub->file), 0);
        if (added) {
          slot->second = static_cast<int>(part.files.size());
          part.files.push_back(parts[p].files[sub->file]);
        }
        sub->file = slot->second;
      }
      pieces.push_back(*std::move(sub));
    }
    part.tensors[part.Find(name)].pieces = std::move(pieces);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, const UcpSubParamShape*>>> RegroupAllSubParams(
    std::vector<Catalog>& parts, const UniversalPatterns& patterns) {
  std::vector<std::pair<std::string, const UcpSubParamShape*>> regrouped;
  if (parts.empty()) return regrouped;
  for (size_t i = 0; i < parts[0].tensors.size(); ++i) {
    const std::string name = parts[0].tensors[i].name;
    if (patterns.Classify(name).merge != UcpMerge::kSubParams) continue;
    const UcpSubParamShape* shape = patterns.SubParamShape(name);
    RETURN_IF_ERROR(RegroupSubParams(parts, name, *shape));
    regrouped.emplace_back(name, shape);
  }
  return regrouped;
}

}  // namespace reshard
