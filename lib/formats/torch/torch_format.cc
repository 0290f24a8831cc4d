#include "lib/formats/torch/torch_format.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"
#include "lib/io/mapped_file.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;

constexpr int kMaxNameDepth = 64;
const std::vector<std::string> kTorchSuffixes = {".pt", ".pth", ".bin", ".ckpt"};

class TorchFileReader {
 public:
  explicit TorchFileReader(const TorchArchive& archive) : archive_(archive) {}

  absl::StatusOr<Catalog> Read(const PickleValue* value, const std::string& prefix) {
    catalog_.format = TorchInput::kId;
    catalog_.files.push_back(archive_.Source());
    ASSIGN_OR_RETURN(StructureNode structure, Walk(value, prefix, 0));
    catalog_.structure = std::make_shared<const StructureNode>(std::move(structure));
    catalog_.Reindex();
    return std::move(catalog_);
  }

 private:
  absl::Status Error(absl::string_view name, absl::string_view message) const {
    return absl::DataLossError(absl::StrCat(archive_.path(), ": \"", name, "\": ", message));
  }

  // Adds the tensor at `location` under `name`.
  absl::Status AddTensor(TensorLocation location, const std::string& name) {
    if (catalog_.Find(name) >= 0 || !names_.insert(name).second) {
      return Error(name, "two tensors get this name");
    }
    catalog_.tensors.push_back(CatalogTensorAt(name, std::move(location), /*file=*/0));
    return absl::OkStatus();
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
    const std::string tensor_name = name.empty() ? "tensor" : name;
    ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive_.Tensor(value, tensor_name));
    if (location.has_value()) {
      RETURN_IF_ERROR(AddTensor(*std::move(location), tensor_name));
      node.kind = Node::kTensor;
      node.text = tensor_name;
      return node;
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
            ASSIGN_OR_RETURN(StructureNode child,
                             Walk(item, Join(name, PickleKeyName(key)), depth + 1));
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
      node.text = PickleKeyName(key);
    }
    return node;
  }

  bool ContainsTensor(const PickleValue* value, int depth) const {
    if (depth > kMaxNameDepth || ++visits_ > VisitBudget()) return false;
    if (TorchArchive::IsTensor(value)) return true;
    for (const PickleValue* item : value->items) {
      if (ContainsTensor(item, depth + 1)) return true;
    }
    for (const auto& [key, item] : value->entries) {
      if (ContainsTensor(item, depth + 1)) return true;
    }
    return value->state != nullptr && ContainsTensor(value->state, depth + 1);
  }

  const TorchArchive& archive_;
  absl::flat_hash_set<std::string> names_;
  Catalog catalog_;
  // Values visited by Walk and ContainsTensor, against VisitBudget().
  mutable uint64_t visits_ = 0;
  uint64_t VisitBudget() const { return 4 * archive_.pickle_values() + 4096; }
};

absl::StatusOr<FileCatalog> ReadOneFile(const std::string& dir, const std::string& name) {
  const std::string path = dir.empty() ? name : absl::StrCat(dir, "/", name);
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(path));
  FileCatalog result;
  result.name = name;
  ASSIGN_OR_RETURN(result.catalog, CatalogFromArchive(*archive));
  return result;
}

// A file of a checkpoint layout that other formats read (DeepSpeed, DCP, Megatron,
// ColossalAI), among the names in a remote folder; empty when there is none. Those formats do
// not read remote folders, so the torch reader must not take their .pt files for a model.
std::string OtherLayoutFile(const std::vector<std::string>& names) {
  static const char* const kNames[] = {
      "latest",    "latest_universal", "latest_checkpointed_iteration.txt",
      ".metadata", "metadata.json",    "common.pt"};
  static const char* const kSuffixes[] = {".distcp", "_model_states.pt", "_optim_states.pt"};
  for (const std::string& name : names) {
    for (const char* marker : kNames) {
      if (name == marker) return name;
    }
    for (const char* suffix : kSuffixes) {
      if (absl::EndsWith(name, suffix)) return name;
    }
    if (absl::StartsWith(name, "pytorch_model-meta-dist-")) return name;
  }
  return "";
}

// Whether the file at `path` starts as a torch.save file does; false when it is absent, an
// error when it cannot be read.
absl::StatusOr<bool> LooksLikeTorchFile(const std::string& path) {
  absl::StatusOr<std::string> head = ReadFilePrefix(path, 32);
  if (absl::IsNotFound(head.status())) return false;
  if (!head.ok()) return head.status();
  const absl::string_view bytes(*head);
  return absl::StartsWith(bytes, absl::string_view("PK\x03\x04", 4)) || IsLegacyTorchSave(bytes);
}

}  // namespace

absl::StatusOr<Catalog> ReadTorchFile(absl::string_view data, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Parse(data, path));
  return CatalogFromArchive(*archive);
}

absl::StatusOr<Catalog> CatalogFromArchive(const TorchArchive& archive) {
  return CatalogFromValue(archive, archive.root(), "");
}

absl::StatusOr<Catalog> CatalogFromValue(const TorchArchive& archive, const PickleValue* value,
                                         const std::string& prefix) {
  if (value == nullptr) {
    return absl::DataLossError(absl::StrCat(archive.path(), ": no \"", prefix, "\" entry"));
  }
  TorchFileReader reader(archive);
  return reader.Read(value, prefix);
}

absl::StatusOr<bool> TorchInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return LooksLikeTorchFile(path);
  if (!InputHasFolders(path)) {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListInputFolder(path));
    if (!OtherLayoutFile(names).empty()) return false;
  }
  ASSIGN_OR_RETURN(const bool indexed, CheckInputExists(absl::StrCat(path, "/", kTorchIndexName)));
  if (indexed) return true;
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(path, kTorchSuffixes));
  if (names.empty()) return false;
  return LooksLikeTorchFile(absl::StrCat(path, "/", names[0]));
}

namespace {

// The files at `path` as one model or model-parallel parts, without a description.
absl::StatusOr<InputModel> ReadTorchModel(const std::string& path) {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) {
    ASSIGN_OR_RETURN(FileCatalog file, ReadOneFile("", path));
    InputModel model;
    model.format = TorchInput::kId;
    model.arrangement = "single-file";
    model.parts.push_back(std::move(file.catalog));
    model.part_names.push_back(path);
    return model;
  }
  const std::string index_path = absl::StrCat(path, "/", kTorchIndexName);
  ASSIGN_OR_RETURN(const bool indexed, CheckInputExists(index_path));
  if (indexed) return ReadIndexedFolder(TorchInput::kId, path, index_path, ReadOneFile);
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(path, kTorchSuffixes));
  ASSIGN_OR_RETURN(std::vector<FileCatalog> files, ReadFolderFiles(path, names, ReadOneFile));
  return AssembleFolder(TorchInput::kId, path, std::move(files));
}

}  // namespace

absl::StatusOr<InputModel> TorchInput::Read(const std::string& path,
                                            const ReadOptions& /*options*/) const {
  ASSIGN_OR_RETURN(InputModel model, ReadTorchModel(path));
  // metaseq names its parts "<name>-model_part-<rank>.pt".
  const bool metaseq =
      !model.part_names.empty() && absl::StrContains(model.part_names[0], "model_part-");
  model.description = DescribeInputModel(model, "torch.save", metaseq ? "metaseq" : "");
  return model;
}

std::vector<PartitionRule> MetaseqPresetRules() {
  return {
      PartitionRule{"qkv", false, 0, 3},
      PartitionRule{"embed_tokens|ffn_layernorm|fc1|(k|q|v)_proj", false, 0},
      PartitionRule{"(fc2|out_proj)\\.weight", false, 1},
      PartitionRule{"embed_positions|layer_norm|(fc2|out_proj)\\.bias|output_projection|version",
                    true},
  };
}

namespace {
const InputFormatRegistration<TorchInput> register_input;
const PartitionRulePresetRegistration register_preset("metaseq", MetaseqPresetRules());
}  // namespace

}  // namespace reshard
