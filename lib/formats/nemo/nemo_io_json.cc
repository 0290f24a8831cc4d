#include "lib/formats/nemo/nemo_io_json.h"

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "nlohmann/json.hpp"

namespace reshard {

namespace {

using Json = nlohmann::json;

// A reference is followed to its object; an object that is itself a reference (fiddle never
// writes one) at most this many times.
constexpr int kMaxReferenceHops = 8;

// The byte offset of the first '[' or '{' nesting deeper than kMaxNemoIoJsonDepth (outside
// strings), or npos.
size_t TooDeepAt(absl::string_view text) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNemoIoJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::string_view::npos;
}

// Whether `value` is {"type": `type`, ...}.
bool HasType(const Json& value, const char* type) {
  if (!value.is_object()) return false;
  const auto found = value.find("type");
  return found != value.end() && found->is_string() && found->get_ref<const std::string&>() == type;
}

// A value of the document and its JSON path, for messages.
struct At {
  const Json* value = nullptr;
  std::string where;
};

class IoJson {
 public:
  IoJson(const Json& objects, absl::string_view path) : objects_(objects), path_(path) {}

  absl::Status Error(const At& at, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(path_, ": ", at.where, ": ", what));
  }

  // `at`, or the object its reference names (followed until it is no reference).
  absl::StatusOr<At> Resolve(At at) const {
    for (int hop = 0; HasType(*at.value, "ref"); ++hop) {
      if (hop == kMaxReferenceHops) {
        return Error(at, absl::StrCat("more than ", kMaxReferenceHops,
                                      " references in a row (a cycle of references?)"));
      }
      const auto key = at.value->find("key");
      if (key == at.value->end() || !key->is_string()) {
        return Error(at, "a reference without a string \"key\"");
      }
      const std::string& name = key->get_ref<const std::string&>();
      const auto object = objects_.find(name);
      if (object == objects_.end()) {
        return Error(at, absl::StrCat("a reference to \"", name, "\", which \"objects\" lacks"));
      }
      at = At{&*object, absl::StrCat("objects[\"", name, "\"]")};
    }
    return at;
  }

  // The "module.name" of pyref `value`; nullopt when `value` is no pyref.
  static std::optional<std::string> Pyref(const Json& value) {
    if (!HasType(value, "pyref")) return std::nullopt;
    const auto module = value.find("module");
    const auto name = value.find("name");
    if (module == value.end() || name == value.end() || !module->is_string() ||
        !name->is_string()) {
      return std::nullopt;
    }
    return absl::StrCat(module->get_ref<const std::string&>(), ".",
                        name->get_ref<const std::string&>());
  }

  // Item `index` of the "items" of `at` (a resolved traversable object): [label, value].
  absl::StatusOr<At> Item(const At& at, size_t index) const {
    const auto items = at.value->is_object() ? at.value->find("items") : at.value->end();
    if (!at.value->is_object() || items == at.value->end() || !items->is_array() ||
        index >= items->size()) {
      return Error(at, absl::StrCat("no item ", index));
    }
    const std::string where = absl::StrCat(at.where, ".items[", index, "]");
    const Json& item = (*items)[index];
    if (!item.is_array() || item.size() != 2) {
      return Error(At{&item, where}, "an item that is not a [path element, value] pair");
    }
    return At{&item[1], absl::StrCat(where, "[1]")};
  }

  // Whether resolved `at` is a fdl.Config: {"type": <pyref of a class named Config>, "items":
  // [...], "metadata": ...}.
  static bool IsConfig(const At& at) {
    const Json& value = *at.value;
    if (!value.is_object()) return false;
    const auto type = value.find("type");
    if (type == value.end()) return false;
    const std::optional<std::string> name = Pyref(*type);
    if (!name.has_value() || (*name != "Config" && !absl::EndsWith(*name, ".Config"))) {
      return false;
    }
    return true;
  }

  // A fdl.Config's callable (metadata's fn_or_cls, "module.name") and arguments (metadata's
  // argument_names with the items' values, in order).
  struct Arguments {
    std::string target;
    std::vector<std::pair<std::string, At>> values;
  };
  absl::StatusOr<Arguments> ConfigArguments(const At& config) const {
    const Json& value = *config.value;
    const auto items = value.find("items");
    if (items == value.end() || !items->is_array()) {
      return Error(config, "a fiddle Config without an \"items\" list");
    }
    const auto metadata_value = value.find("metadata");
    if (metadata_value == value.end()) {
      return Error(config, "a fiddle Config without \"metadata\"");
    }
    ASSIGN_OR_RETURN(const At metadata,
                     Resolve(At{&*metadata_value, absl::StrCat(config.where, ".metadata")}));
    // BuildableTraverserMetadata, a NamedTuple: (fn_or_cls, argument_names, argument_tags,
    // argument_history), its items in that order.
    const auto fields = metadata.value->find("items");
    if (!metadata.value->is_object() || fields == metadata.value->end() || !fields->is_array() ||
        fields->size() < 2) {
      return Error(metadata,
                   "metadata that is not a BuildableTraverserMetadata (fn_or_cls, "
                   "argument_names, ...)");
    }
    Arguments arguments;
    ASSIGN_OR_RETURN(const At fn_or_cls, Item(metadata, 0));
    arguments.target = Pyref(*fn_or_cls.value).value_or("");
    ASSIGN_OR_RETURN(At names, Item(metadata, 1));
    ASSIGN_OR_RETURN(names, Resolve(names));
    const auto name_items =
        names.value->is_object() ? names.value->find("items") : names.value->end();
    if (!names.value->is_object() || name_items == names.value->end() || !name_items->is_array()) {
      return Error(names, "argument_names that is not a tuple of names");
    }
    if (name_items->size() != items->size()) {
      return Error(config, absl::StrCat(items->size(), " items, but its metadata names ",
                                        name_items->size(), " arguments"));
    }
    std::set<std::string> seen;
    for (size_t i = 0; i < items->size(); ++i) {
      ASSIGN_OR_RETURN(const At name_at, Item(names, i));
      ASSIGN_OR_RETURN(const At name, Leaf(name_at));
      ASSIGN_OR_RETURN(const At argument, Item(config, i));
      // Positional arguments (integer names) are not the config's fields.
      if (!name.value->is_string()) continue;
      const std::string& key = name.value->get_ref<const std::string&>();
      if (!seen.insert(key).second) {
        return Error(name, absl::StrCat("argument \"", key, "\" named twice"));
      }
      arguments.values.emplace_back(key, argument);
    }
    return arguments;
  }

  // A leaf's value ({"type": "leaf", "value": v} -> v); any other value as it is.
  absl::StatusOr<At> Leaf(const At& at) const {
    if (!HasType(*at.value, "leaf")) return at;
    const auto value = at.value->find("value");
    if (value == at.value->end() || value->is_object() || value->is_array()) {
      return Error(at, "a leaf without a JSON primitive \"value\"");
    }
    return At{&*value, absl::StrCat(at.where, ".value")};
  }

  // The Config argument `name` of `arguments`, resolved; nullopt when absent or not a Config.
  absl::StatusOr<std::optional<At>> ConfigArgument(const Arguments& arguments,
                                                   absl::string_view name) const {
    for (const auto& [key, value] : arguments.values) {
      if (key != name) continue;
      ASSIGN_OR_RETURN(const At resolved, Resolve(value));
      if (!IsConfig(resolved)) return std::nullopt;
      return resolved;
    }
    return std::nullopt;
  }

 private:
  const Json& objects_;
  std::string path_;
};

YamlNode Scalar(std::string text) {
  YamlNode node;
  node.kind = YamlNode::Kind::kScalar;
  node.scalar = std::move(text);
  return node;
}

}  // namespace

absl::StatusOr<std::optional<YamlNode>> NemoIoJsonModelConfig(absl::string_view text,
                                                              absl::string_view path) {
  if (text.size() > kMaxNemoIoJsonBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path, ": ", text.size(), " bytes, more than the ", kMaxNemoIoJsonBytes, " read"));
  }
  if (const size_t deep = TooDeepAt(text); deep != absl::string_view::npos) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": arrays and objects nested more than ",
                                                     kMaxNemoIoJsonDepth, " deep at byte offset ",
                                                     deep));
  }
  // Every object's "paths" (debugging aid, the bulk of the file) and the refcounts are dropped
  // while parsing.
  const Json::parser_callback_t drop = [](int depth, Json::parse_event_t event, Json& parsed) {
    if (event != Json::parse_event_t::key) return true;
    const std::string& key = parsed.get_ref<const std::string&>();
    return !((depth >= 3 && key == "paths") || (depth == 1 && key == "refcounts"));
  };
  Json doc;
  try {
    doc = Json::parse(text, drop);
  } catch (const Json::parse_error& error) {
    return absl::DataLossError(absl::StrCat(path, ": not valid JSON at byte offset ",
                                            error.byte > 0 ? error.byte - 1 : 0, " (", error.what(),
                                            ")"));
  }
  const auto root = doc.is_object() ? doc.find("root") : doc.end();
  const auto objects = doc.is_object() ? doc.find("objects") : doc.end();
  if (!doc.is_object() || root == doc.end() || objects == doc.end() || !objects->is_object()) {
    return absl::DataLossError(
        absl::StrCat(path,
                     ": not fiddle's serialization (a JSON object with \"root\" and an \"objects\" "
                     "object)"));
  }
  const IoJson io(*objects, path);
  ASSIGN_OR_RETURN(const At context, io.Resolve(At{&*root, "root"}));
  if (!IoJson::IsConfig(context)) return std::nullopt;
  ASSIGN_OR_RETURN(const IoJson::Arguments context_arguments, io.ConfigArguments(context));
  ASSIGN_OR_RETURN(const std::optional<At> model, io.ConfigArgument(context_arguments, "model"));
  if (!model.has_value()) return std::nullopt;
  ASSIGN_OR_RETURN(const IoJson::Arguments model_arguments, io.ConfigArguments(*model));
  ASSIGN_OR_RETURN(const std::optional<At> config, io.ConfigArgument(model_arguments, "config"));
  if (!config.has_value()) return std::nullopt;
  ASSIGN_OR_RETURN(const IoJson::Arguments arguments, io.ConfigArguments(*config));

  YamlNode out;
  out.kind = YamlNode::Kind::kMap;
  if (!arguments.target.empty()) out.map.emplace_back("_target_", Scalar(arguments.target));
  for (const auto& [name, argument] : arguments.values) {
    ASSIGN_OR_RETURN(const At value, io.Leaf(argument));
    const Json& json = *value.value;
    if (json.is_null()) {
      out.map.emplace_back(name, YamlNode());
    } else if (json.is_string()) {
      out.map.emplace_back(name, Scalar(json.get<std::string>()));
    } else if (json.is_boolean() || json.is_number()) {
      out.map.emplace_back(name, Scalar(json.dump()));
    } else if (std::optional<std::string> target = IoJson::Pyref(json)) {
      YamlNode node;
      node.kind = YamlNode::Kind::kMap;
      node.map.emplace_back("_target_", Scalar(*target));
      out.map.emplace_back(name, std::move(node));
    }
  }
  return out;
}

}  // namespace reshard
