#include "lib/formats/torch/pickle_structure.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;
using Node = StructureNode::Kind;

std::string Join(absl::string_view path, absl::string_view part) {
  return path.empty() ? std::string(part) : absl::StrCat(path, ".", part);
}

// Whether `value` is a tensor as torch pickles one: a call of one of torch's _rebuild_*
// functions (torch._utils._rebuild_tensor_v2, _rebuild_parameter, torch._tensor's
// _rebuild_from_type_v2, ...).
bool IsTorchRebuild(const PickleValue* value) {
  return value->kind == Kind::kObject && value->callable != nullptr &&
         (value->callable->module == "torch" ||
          absl::StartsWith(value->callable->module, "torch.")) &&
         absl::StartsWith(value->callable->name, "_rebuild_");
}

class Converter {
 public:
  explicit Converter(const PickleStructureOptions& options) : options_(options) {}

  // The node of `value` at `path`, `depth` levels below the root. Errors name the path.
  absl::StatusOr<StructureNode> Convert(const PickleValue* value, const std::string& path,
                                        int depth);

 private:
  absl::StatusOr<std::vector<StructureNode>> Children(const std::vector<PickleValue*>& values,
                                                      absl::string_view path, int depth) {
    std::vector<StructureNode> nodes;
    nodes.reserve(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      ASSIGN_OR_RETURN(StructureNode node, Convert(values[i], Join(path, absl::StrCat(i)), depth));
      nodes.push_back(std::move(node));
    }
    return nodes;
  }

  // A dict's (or an object's SETITEMs') keys and values; each value's path is its key.
  absl::Status Entries(const PickleValue* value, absl::string_view path, int depth,
                       StructureNode& node) {
    for (const auto& [key, item] : value->entries) {
      const std::string item_path = Join(path, PickleKeyName(key));
      // Keys are not offered to `replace`: the path names the value.
      ++in_key_;
      absl::StatusOr<StructureNode> key_node = Convert(key, item_path, depth);
      --in_key_;
      if (!key_node.ok()) return key_node.status();
      ASSIGN_OR_RETURN(StructureNode item_node, Convert(item, item_path, depth));
      node.keys.push_back(*std::move(key_node));
      node.values.push_back(std::move(item_node));
    }
    return absl::OkStatus();
  }

  // A BUILD state: an object's attributes are named like dict entries ("args.lr"), any other
  // state is "__state__".
  absl::Status State(const PickleValue* value, absl::string_view path, int depth,
                     StructureNode& node) {
    if (value->state == nullptr) return absl::OkStatus();
    const std::string state_path =
        value->state->kind == Kind::kDict ? std::string(path) : Join(path, "__state__");
    ASSIGN_OR_RETURN(StructureNode state, Convert(value->state, state_path, depth));
    node.state.push_back(std::move(state));
    return absl::OkStatus();
  }

  static std::string Where(absl::string_view path) {
    return path.empty() ? "(root)" : std::string(path);
  }
  static absl::Status Error(absl::string_view path, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path), ": ", message));
  }

  const PickleStructureOptions& options_;
  uint64_t nodes_ = 0;
  int in_key_ = 0;  // > 0 while converting a dict key
};

absl::StatusOr<StructureNode> Converter::Convert(const PickleValue* value, const std::string& path,
                                                 int depth) {
  if (value == nullptr) return Error(path, "no value");
  if (depth > options_.max_depth) {
    return Error(path, absl::StrCat("values nest deeper than ", options_.max_depth, " levels"));
  }
  if (++nodes_ > options_.max_nodes) {
    return Error(path, absl::StrCat("more than ", options_.max_nodes,
                                    " values (containers shared through the pickle's memo?)"));
  }
  if (options_.replace && in_key_ == 0) {
    absl::StatusOr<std::optional<StructureNode>> replaced = options_.replace(value, path);
    if (!replaced.ok()) return Annotate(replaced.status(), Where(path));
    if (replaced->has_value()) return **std::move(replaced);
  }
  StructureNode node;
  switch (value->kind) {
    case Kind::kNone:
      return node;
    case Kind::kBool:
      node.kind = Node::kBool;
      node.boolean = value->boolean;
      return node;
    case Kind::kInt:
      node.kind = Node::kInt;
      node.integer = value->integer;
      return node;
    case Kind::kBigInt:
    case Kind::kString:
    case Kind::kBytes:
      node.kind = value->kind == Kind::kBigInt  ? Node::kBigInt
                  : value->kind == Kind::kBytes ? Node::kBytes
                                                : Node::kString;
      node.text = value->text;
      return node;
    case Kind::kFloat:
      node.kind = Node::kFloat;
      node.real = value->real;
      return node;
    case Kind::kTuple:
    case Kind::kList: {
      node.kind = value->kind == Kind::kTuple ? Node::kTuple : Node::kList;
      ASSIGN_OR_RETURN(node.items, Children(value->items, path, depth + 1));
      return node;
    }
    case Kind::kDict:
      node.kind = Node::kDict;
      node.ordered = value->ordered;
      RETURN_IF_ERROR(Entries(value, path, depth + 1, node));
      RETURN_IF_ERROR(State(value, path, depth + 1, node));
      return node;
    case Kind::kSet: {
      // builtins.set([items]), as protocol 2 pickles a set.
      node.kind = Node::kObject;
      node.module = "builtins";
      node.name = "set";
      StructureNode list;
      list.kind = Node::kList;
      ASSIGN_OR_RETURN(list.items, Children(value->items, path, depth + 2));
      node.args.push_back(std::move(list));
      return node;
    }
    case Kind::kGlobal:
      node.kind = Node::kGlobal;
      node.module = value->module;
      node.name = value->name;
      return node;
    case Kind::kObject: {
      if (IsTorchRebuild(value)) {
        return absl::UnimplementedError(absl::StrCat(
            Where(path), ": a tensor (", value->callable->module, ".", value->callable->name,
            "), which is carried only by the caller's replace callback"));
      }
      if (value->callable == nullptr || value->callable->kind != Kind::kGlobal ||
          value->args == nullptr || value->args->kind != Kind::kTuple) {
        return Error(path, "an object that is not a global called with a tuple");
      }
      node.kind = Node::kObject;
      node.module = value->callable->module;
      node.name = value->callable->name;
      node.construction = value->new_object ? StructureNode::Construction::kNewObj
                                            : StructureNode::Construction::kReduce;
      ASSIGN_OR_RETURN(node.args, Children(value->args->items, Join(path, "__args__"), depth + 1));
      ASSIGN_OR_RETURN(node.items, Children(value->items, path, depth + 1));
      RETURN_IF_ERROR(Entries(value, path, depth + 1, node));
      RETURN_IF_ERROR(State(value, path, depth + 1, node));
      return node;
    }
    case Kind::kPersistent:
      return absl::UnimplementedError(
          absl::StrCat(Where(path),
                       ": a persistent id (a torch storage), which is carried only by the "
                       "caller's replace callback"));
  }
  return Error(path, absl::StrCat("unknown value ", DescribePickleValue(value)));
}

}  // namespace

absl::StatusOr<StructureNode> PickleToStructure(const PickleValue* value,
                                                const PickleStructureOptions& options) {
  Converter converter(options);
  return converter.Convert(value, "", 0);
}

}  // namespace reshard
