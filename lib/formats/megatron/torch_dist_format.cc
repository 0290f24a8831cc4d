#include "lib/formats/megatron/torch_dist_format.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/dcp/dcp_format.h"
#include "lib/formats/dcp/dcp_metadata.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/formats/megatron/torch_dist_experts.h"
#include "lib/formats/torch/pickle_structure.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/formats/torch/torch_format.h"
#include "lib/io/file_access.h"
#include "nlohmann/json.hpp"

namespace reshard {
namespace {

constexpr uint64_t kMaxMetadataJsonBytes = 1 << 20;

// ---- Unstacking.

// Index `layer` of the stacked `tensor`'s axis 0 (a layer, or an expert of a layer), read in
// place from the same pieces.
CatalogTensor LayerOf(const CatalogTensor& tensor, const std::string& name, int64_t layer) {
  CatalogTensor out;
  out.name = name;
  out.dtype = tensor.dtype;
  out.shape.assign(tensor.shape.begin() + 1, tensor.shape.end());
  for (const SourcePiece& piece : tensor.pieces) {
    const int64_t first = piece.box.origin[0];
    if (layer < first || layer >= first + piece.box.extent[0]) continue;
    SourcePiece sub;
    sub.file = piece.file;
    sub.byte_offset =
        piece.byte_offset +
        static_cast<uint64_t>((layer - first) * piece.strides[0]) * DTypeSize(tensor.dtype);
    sub.box.origin.assign(piece.box.origin.begin() + 1, piece.box.origin.end());
    sub.box.extent.assign(piece.box.extent.begin() + 1, piece.box.extent.end());
    sub.strides.assign(piece.strides.begin() + 1, piece.strides.end());
    out.pieces.push_back(std::move(sub));
  }
  return out;
}

// Replaces every leaf naming a stacked tensor by its layers' leaves: in a dict, the entry
// becomes one entry per layer (keyed by the layer's name when the key was the tensor's name,
// as in Megatron-Core's flat state dict); elsewhere, a list of them.
void RenameStackedLeaves(
    StructureNode& node,
    const absl::flat_hash_map<std::string, std::vector<std::string>>& layers_of) {
  using Kind = StructureNode::Kind;
  auto layer_leaves = [&](const StructureNode& leaf) -> const std::vector<std::string>* {
    if (leaf.kind != Kind::kTensor) return nullptr;
    auto it = layers_of.find(leaf.text);
    return it == layers_of.end() ? nullptr : &it->second;
  };
  if (node.kind == Kind::kDict) {
    std::vector<StructureNode> keys, values;
    for (size_t i = 0; i < node.keys.size() && i < node.values.size(); ++i) {
      const std::vector<std::string>* names = layer_leaves(node.values[i]);
      if (names == nullptr) {
        RenameStackedLeaves(node.values[i], layers_of);
        keys.push_back(std::move(node.keys[i]));
        values.push_back(std::move(node.values[i]));
        continue;
      }
      for (const std::string& name : *names) {
        keys.push_back(StructureNode::String(name));
        values.push_back(StructureNode::Tensor(name));
      }
    }
    node.keys = std::move(keys);
    node.values = std::move(values);
  } else if (const std::vector<std::string>* names = layer_leaves(node)) {
    node = StructureNode{};
    node.kind = Kind::kList;
    for (const std::string& name : *names) node.items.push_back(StructureNode::Tensor(name));
    return;
  }
  for (std::vector<StructureNode>* children : {&node.items, &node.args, &node.state}) {
    for (StructureNode& child : *children) RenameStackedLeaves(child, layers_of);
  }
  if (node.kind != Kind::kDict) {
    for (StructureNode& child : node.values) RenameStackedLeaves(child, layers_of);
  }
}

// Completes an unstacking whose tensors `catalog` now holds: indexes them, refuses a name held
// twice (InvalidArgument: an unstacked tensor, `what`, and a tensor of its own), and renames
// the structure's leaves through `unstacked` (old name -> new names).
absl::Status FinishUnstacking(
    Catalog& catalog, const absl::flat_hash_map<std::string, std::vector<std::string>>& unstacked,
    absl::string_view what) {
  catalog.Reindex();
  absl::flat_hash_map<std::string, int> seen;
  for (const CatalogTensor& tensor : catalog.tensors) {
    if (!seen.emplace(tensor.name, 0).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensor.name, "\" is both ", what, " and a tensor of its own"));
    }
  }
  if (catalog.structure != nullptr) {
    StructureNode structure = *catalog.structure;
    RenameStackedLeaves(structure, unstacked);
    catalog.structure = std::make_shared<const StructureNode>(std::move(structure));
  }
  return absl::OkStatus();
}

// What UnstackExperts found.
struct UnstackedExperts {
  int64_t experts = 0;  // per layer; 0: no experts
  int64_t stacked = 0;  // expert-stacked keys of the checkpoint (each over all layers or one)
  int64_t singletons = 0;  // per-expert keys (singleton_local_shards)
  // The expert-parallel ranks the files show: experts grouped by the set of data files holding
  // them (one set per EP rank).
  int64_t file_groups = 0;
};

// Splits every expert-stacked tensor (`<experts>.experts.<rest>` [E, ...] once the layers are
// unstacked) into its E experts `<experts>.local_experts.<e>.<rest>`, read in place, and renames
// the singleton form's `<experts>.experts.<g>.<rest>` likewise. DataLoss naming the tensors when
// two disagree on the number of experts or `args_experts` (args.num_experts, when > 0) differs;
// InvalidArgument when a new name is taken by another tensor.
absl::StatusOr<UnstackedExperts> UnstackExperts(Catalog& catalog,
                                                std::optional<int64_t> args_experts) {
  UnstackedExperts result;
  std::vector<CatalogTensor> out;
  absl::flat_hash_map<std::string, std::vector<std::string>> experts_of;
  std::string first;
  std::set<std::string> keys;        // the expert-stacked tensors' names without their layer
  std::set<std::string> singletons;  // likewise, the per-expert keys
  std::map<int64_t, std::set<int>> files_of;  // expert -> the data files holding it
  for (CatalogTensor& tensor : catalog.tensors) {
    const std::optional<TorchDistExpertKey> key = ParseTorchDistExpertKey(tensor.name);
    if (!key.has_value()) {
      out.push_back(std::move(tensor));
      continue;
    }
    if (key->expert >= 0) {
      singletons.insert(WithoutLayerIndex(tensor.name));
      for (const SourcePiece& piece : tensor.pieces) files_of[key->expert].insert(piece.file);
      std::string name = TorchDistExpertName(*key, key->expert);
      experts_of[tensor.name] = {name};
      tensor.name = std::move(name);
      out.push_back(std::move(tensor));
      continue;
    }
    if (tensor.shape.empty()) {
      return absl::DataLossError(
          absl::StrCat("tensor \"", tensor.name, "\" is named as expert-stacked but is 0-d"));
    }
    const int64_t experts = tensor.shape[0];
    if (!keys.empty() && experts != result.experts) {
      return absl::DataLossError(absl::StrCat(
          "expert-stacked tensors disagree on the number of experts: \"", first, "\" has ",
          result.experts, " along its expert axis, \"", tensor.name, "\" has ", experts));
    }
    if (keys.empty()) {
      first = tensor.name;
      result.experts = experts;
      for (const SourcePiece& piece : tensor.pieces) {
        for (int64_t e = piece.box.origin[0]; e < piece.box.origin[0] + piece.box.extent[0]; ++e) {
          files_of[e].insert(piece.file);
        }
      }
    }
    keys.insert(WithoutLayerIndex(tensor.name));
    std::vector<std::string>& names = experts_of[tensor.name];
    for (int64_t e = 0; e < experts; ++e) {
      names.push_back(TorchDistExpertName(*key, e));
      out.push_back(LayerOf(tensor, names.back(), e));
    }
  }
  result.stacked = static_cast<int64_t>(keys.size());
  result.singletons = static_cast<int64_t>(singletons.size());
  if (keys.empty() && !files_of.empty()) result.experts = files_of.rbegin()->first + 1;
  // One set of files per expert-parallel rank: its ranks store its experts.
  std::set<std::set<int>> groups;
  for (const auto& [expert, files] : files_of) groups.insert(files);
  result.file_groups = static_cast<int64_t>(groups.size());
  if (keys.empty()) {
    for (int64_t e = 0; e < result.experts; ++e) {
      if (files_of.count(e) > 0) continue;
      return absl::DataLossError(absl::StrCat(
          "expert ", e, " of ", result.experts, " (the per-expert keys name experts 0 to ",
          result.experts - 1, ") is missing: no key `...mlp.experts.experts.", e, ".*` holds it"));
    }
  }
  if (args_experts.has_value() && *args_experts > 0 && result.experts > 0 &&
      *args_experts != result.experts) {
    return absl::DataLossError(absl::StrCat(
        "the checkpoint holds ", result.experts, " experts per layer",
        first.empty() ? std::string() : absl::StrCat(" (\"", first, "\")"),
        " but args.num_experts is ", *args_experts));
  }
  catalog.tensors = std::move(out);
  if (experts_of.empty()) return result;
  RETURN_IF_ERROR(FinishUnstacking(catalog, experts_of, "an expert of an expert-stacked tensor"));
  return result;
}

// ---- The checkpoint folder.

bool IsIterationFolderName(absl::string_view name) {
  return name == "release" || (absl::ConsumePrefix(&name, "iter_") && !name.empty() &&
                               std::all_of(name.begin(), name.end(), absl::ascii_isdigit));
}

// Whether `dir` is a torch_dist checkpoint folder: it has metadata.json, or it is an iteration
// folder holding DCP files or common.pt (an unfinished save, refused by Read with a reason).
// Errors: the folder cannot be looked at.
absl::StatusOr<bool> IsTorchDistFolder(const std::string& dir) {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(dir));
  if (!folder) return false;
  ASSIGN_OR_RETURN(const bool metadata_json,
                   CheckInputExists(JoinPath(dir, kTorchDistMetadataName)));
  if (metadata_json) return true;
  if (!IsIterationFolderName(BaseName(dir))) return false;
  for (const char* name : {kDcpMetadataName, kTorchDistCommonName}) {
    ASSIGN_OR_RETURN(const bool exists, CheckInputExists(JoinPath(dir, name)));
    if (exists) return true;
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> data_files, ListFolder(dir, {".distcp"}));
  return !data_files.empty();
}

// The iteration folder inside save folder `path` that --tag or its tracker names, or nullopt
// when `path` is no save folder.
absl::StatusOr<std::optional<std::string>> NamedIterationFolder(const std::string& path,
                                                                const std::string& tag) {
  std::string name;
  if (!tag.empty()) {
    RETURN_IF_ERROR(CheckTag(tag, "from --tag"));
    name = tag;
  } else {
    const std::string tracker = JoinPath(path, kMegatronTrackerName);
    ASSIGN_OR_RETURN(std::optional<std::string> text, ReadTrackerFile(tracker));
    if (!text.has_value()) return std::optional<std::string>();
    std::optional<std::string> folder = IterationFolderFromTracker(*text);
    if (!folder.has_value()) {
      return absl::DataLossError(
          absl::StrCat(tracker, ": \"", *text, "\" is neither an iteration number nor release"));
    }
    name = *std::move(folder);
  }
  return std::optional<std::string>(JoinPath(path, name));
}

// How inspect notes a value of common.pt no output carries (torch_format.cc), and what the
// args are carried to instead.
constexpr absl::string_view kNotCarried = " (not carried to any output)";
constexpr absl::string_view kArgsCarried =
    " (carried: --format hf writes config.json from them, --format megatron and "
    "megatron-torch-dist write them with the output's TP and PP)";

// Checks metadata.json: present, JSON, and the torch_dist backend. Returns its backend line for
// the description.
absl::Status CheckMetadataJson(const std::string& dir) {
  const std::string path = JoinPath(dir, kTorchDistMetadataName);
  ASSIGN_OR_RETURN(const bool exists, CheckInputExists(path));
  if (!exists) {
    return absl::DataLossError(absl::StrCat(
        path,
        ": missing. Megatron-Core writes metadata.json last, after every rank's .distcp file "
        "and the .metadata of the DCP checkpoint, so a folder without it is an unfinished or "
        "incomplete save; reshard does not guess what it holds"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, kMaxMetadataJsonBytes), path);
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  }
  auto backend = json.find("sharded_backend");
  if (backend == json.end() || !backend->is_string()) {
    return absl::DataLossError(absl::StrCat(path, ": no \"sharded_backend\" string"));
  }
  if (backend->get<std::string>() != "torch_dist") {
    return absl::UnimplementedError(
        absl::StrCat(path, ": sharded_backend \"", backend->get<std::string>(),
                     "\"; reshard reads Megatron-Core checkpoints of the torch_dist backend only"));
  }
  return absl::OkStatus();
}

// common.pt's contents under "common": its tensors as "common.<key path>", its values in the
// structure.
absl::Status AddCommonState(const std::string& dir, InputModel& model) {
  const std::string path = JoinPath(dir, kTorchDistCommonName);
  ASSIGN_OR_RETURN(const bool exists, CheckInputExists(path));
  if (!exists) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(path));
  ASSIGN_OR_RETURN(Catalog common, CatalogFromValue(*archive, archive->root(), "common"), path);
  // The args Namespace, as the Megatron-LM reader carries it (training_state "megatron.args"),
  // for outputs that read the model's sizes from it (--format hf's config.json). Args that
  // PickleToStructure refuses are left out; such outputs then say which sizes they lack.
  if (const PickleValue* args = PickleField(archive->root(), "args");
      args != nullptr && args->kind != PickleValue::Kind::kNone) {
    if (absl::StatusOr<StructureNode> node = PickleToStructure(args); node.ok()) {
      model.training_state.values["megatron.args"] = *std::move(node);
      // inspect lists common.pt's entries: say where the args go.
      for (std::string& entry : common.other_entries) {
        if (absl::StartsWith(entry, "common.args: ") && absl::EndsWith(entry, kNotCarried)) {
          entry.resize(entry.size() - kNotCarried.size());
          absl::StrAppend(&entry, kArgsCarried);
        }
      }
    }
  }
  // The iteration and checkpoint version, for outputs that write checkpoints to resume from.
  for (const auto& [field, value_name] :
       {std::pair<const char*, const char*>{"iteration", "megatron.iteration"},
        {"checkpoint_version", "megatron.checkpoint_version"}}) {
    const PickleValue* value = PickleField(archive->root(), field);
    if (value == nullptr) continue;
    if (absl::StatusOr<StructureNode> node = PickleToStructure(value);
        node.ok() && (node->kind == StructureNode::Kind::kInt ||
                      node->kind == StructureNode::Kind::kFloat)) {
      model.training_state.values[value_name] = *std::move(node);
    }
  }
  Catalog& catalog = model.parts.front();
  for (const CatalogTensor& tensor : common.tensors) {
    if (catalog.Find(tensor.name) >= 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": tensor \"", tensor.name, "\" is also in the DCP checkpoint"));
    }
  }
  StructureNode root = catalog.structure != nullptr ? *catalog.structure : StructureNode::Dict();
  if (root.kind != StructureNode::Kind::kDict) {
    return absl::InternalError("the DCP checkpoint's nesting is not a dict");
  }
  root.Add(StructureNode::String("common"),
           common.structure != nullptr ? *common.structure : StructureNode::Dict());
  common.structure = nullptr;
  AppendCatalog(catalog, std::move(common));
  catalog.structure = std::make_shared<const StructureNode>(std::move(root));
  catalog.Reindex();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> UnstackLayers(Catalog& catalog, int64_t* stacked_tensors) {
  int64_t layers = -1;
  const CatalogTensor* first_stacked = nullptr;
  std::vector<CatalogTensor> out;
  std::vector<CatalogTensor> stacked;
  std::vector<std::pair<std::string, std::string>> splits;
  size_t insert_at = 0;
  for (CatalogTensor& tensor : catalog.tensors) {
    std::optional<std::pair<std::string, std::string>> split = SplitLayerStacked(tensor.name);
    if (!split.has_value()) {
      out.push_back(std::move(tensor));
      continue;
    }
    if (tensor.shape.empty()) {
      return absl::DataLossError(
          absl::StrCat("tensor \"", tensor.name, "\" is named as layer-stacked but is 0-d"));
    }
    if (layers >= 0 && tensor.shape[0] != layers) {
      return absl::DataLossError(absl::StrCat(
          "layer-stacked tensors disagree on the number of layers: \"", first_stacked->name,
          "\" has ", layers, " along its layer axis, \"", tensor.name, "\" has ", tensor.shape[0]));
    }
    if (stacked.empty()) insert_at = out.size();
    layers = tensor.shape[0];
    stacked.push_back(std::move(tensor));
    first_stacked = &stacked.front();
    splits.push_back(*std::move(split));
  }
  if (stacked_tensors != nullptr) *stacked_tensors = static_cast<int64_t>(stacked.size());
  if (stacked.empty()) {
    catalog.tensors = std::move(out);
    return 0;
  }
  // Layer by layer, each layer's tensors in the checkpoint's order.
  std::vector<CatalogTensor> unstacked;
  absl::flat_hash_map<std::string, std::vector<std::string>> layers_of;
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (size_t i = 0; i < stacked.size(); ++i) {
      const std::string name = absl::StrCat(splits[i].first, layer, ".", splits[i].second);
      layers_of[stacked[i].name].push_back(name);
      unstacked.push_back(LayerOf(stacked[i], name, layer));
    }
  }
  out.insert(out.begin() + insert_at, std::make_move_iterator(unstacked.begin()),
             std::make_move_iterator(unstacked.end()));
  catalog.tensors = std::move(out);
  RETURN_IF_ERROR(FinishUnstacking(catalog, layers_of, "a layer of a layer-stacked tensor"));
  return layers;
}

absl::StatusOr<bool> TorchDistInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool here, IsTorchDistFolder(path));
  if (here) return true;
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return false;
  // A damaged tracker (DataLoss) claims nothing; a tracker that cannot be read is an error.
  absl::StatusOr<std::optional<std::string>> named = NamedIterationFolder(path, "");
  if (!named.ok() && !absl::IsDataLoss(named.status())) return named.status();
  if (named.ok() && named->has_value()) {
    ASSIGN_OR_RETURN(const bool named_here, IsTorchDistFolder(**named));
    if (named_here) return true;
  }
  // A save folder whose tracker is missing or names a folder that is gone, but that holds
  // torch_dist iterations: claimed, so that Read can say what is wrong (or --tag pick one).
  ASSIGN_OR_RETURN(const std::vector<std::string> folders, ListInputSubfolders(path));
  for (const std::string& name : folders) {
    if (!IsIterationFolderName(name)) continue;
    ASSIGN_OR_RETURN(const bool iteration, IsTorchDistFolder(JoinPath(path, name)));
    if (iteration) return true;
  }
  return false;
}

absl::StatusOr<InputModel> TorchDistInput::Read(const std::string& path,
                                                const ReadOptions& options) const {
  std::string dir = path;
  ASSIGN_OR_RETURN(const bool here, IsTorchDistFolder(path));
  if (!options.tag.empty() || !here) {
    ASSIGN_OR_RETURN(std::optional<std::string> named, NamedIterationFolder(path, options.tag));
    if (!named.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          path,
          ": neither a Megatron-Core torch_dist checkpoint folder (metadata.json) nor a "
          "save folder with ",
          kMegatronTrackerName));
    }
    ASSIGN_OR_RETURN(const bool named_folder, CheckInputFolder(*named));
    if (!named_folder) {
      return absl::NotFoundError(
          absl::StrCat(*named, ": the checkpoint folder ",
                       options.tag.empty() ? "the tracker names" : "--tag names", " is missing"));
    }
    dir = *std::move(named);
  }
  const std::string context = absl::StrCat("Megatron-Core torch_dist checkpoint ", dir);
  RETURN_IF_ERROR(CheckMetadataJson(dir), context);
  ASSIGN_OR_RETURN(InputModel model,
                   ReadDcpCheckpoint(dir,
                                     [&dir](const DcpMetadata& metadata, const std::string& path) {
                                       return CheckExpertChunks(dir, metadata, path);
                                     }),
                   context);
  RETURN_IF_ERROR(AddCommonState(dir, model), context);
  // A release/ folder holds a release checkpoint (as Megatron-LM's tracker says "release"),
  // whatever iteration common.pt records. Without an iteration in common.pt (newer saves keep
  // it in the common_state item), an iter_ folder's name says it.
  const std::string base = BaseName(dir);
  absl::string_view name = base;
  int64_t iteration = 0;
  if (name == "release") {
    model.training_state.values["megatron.release"] = StructureNode::Bool(true);
  } else if (model.training_state.Value("megatron.iteration") == nullptr &&
             absl::ConsumePrefix(&name, "iter_") && absl::SimpleAtoi(name, &iteration)) {
    model.training_state.values["megatron.iteration"] = StructureNode::Int(iteration);
  }
  Catalog& catalog = model.parts.front();
  int64_t stacked = 0;
  ASSIGN_OR_RETURN(const int64_t layers, UnstackLayers(catalog, &stacked), context);
  const StructureNode* args = model.training_state.Value("megatron.args");
  const StructureNode* attributes = args != nullptr ? args->Attributes() : nullptr;
  ASSIGN_OR_RETURN(const UnstackedExperts experts,
                   UnstackExperts(catalog, IntAttribute(attributes, "num_experts")), context);
  // Tensor parallelism splits the model as Megatron splits it, on the axes megatron_core_names
  // gives its tensors (the megatron preset covers Megatron-Core's names): the gated fc1 in
  // whole gate and up blocks, QKV in whole query groups (the args' heads, groups, head dim).
  model.default_rules = MegatronPartitionRules(
      SwiGLUFromShapes(catalog).value_or(false),
      QkvUnitRowsOfArgs([&](absl::string_view key) { return IntAttribute(attributes, key); }));
  catalog.format = kId;
  const std::string dcp_description = model.description;
  model.format = kId;
  model.description = absl::StrCat("Megatron-Core torch_dist, ", BaseName(dir));
  if (stacked > 0) {
    absl::StrAppend(&model.description, ", ", layers, layers == 1 ? " layer" : " layers",
                    " unstacked from ", stacked, " layer-stacked tensors");
  }
  if (experts.experts > 0) {
    // The expert-parallel size the run saved with: the args', else the groups of files
    // holding the experts (each EP rank's ranks store its experts).
    const std::optional<int64_t> ep = IntAttribute(attributes, "expert_model_parallel_size");
    absl::StrAppend(&model.description, ", ", experts.experts, " experts per layer (EP ",
                    ep.has_value() ? absl::StrCat(*ep, " from the args")
                                   : absl::StrCat(experts.file_groups, " from the files"),
                    ")");
    if (experts.stacked > 0) {
      absl::StrAppend(&model.description, " unstacked from ", experts.stacked,
                      experts.stacked == 1 ? " expert-stacked key" : " expert-stacked keys");
    }
    if (experts.singletons > 0) {
      absl::StrAppend(&model.description, experts.stacked > 0 ? " and" : "", " named by ",
                      experts.singletons, " per-expert keys");
    }
    // The rest of the topology the run saved with: the args' (the files hold global tensors).
    std::vector<std::string> recorded, missing;
    for (const auto& [label, key] :
         {std::pair<const char*, const char*>{"TP", "tensor_model_parallel_size"},
          {"PP", "pipeline_model_parallel_size"},
          {"world size", "world_size"}}) {
      if (const std::optional<int64_t> value = IntAttribute(attributes, key)) {
        recorded.push_back(absl::StrCat(label, " ", *value));
      } else {
        missing.push_back(label);
      }
    }
    absl::StrAppend(&model.description, ", ", absl::StrJoin(recorded, ", "),
                    recorded.empty() ? "" : " from the args",
                    recorded.empty() || missing.empty() ? "" : "; ", absl::StrJoin(missing, ", "),
                    missing.empty() ? "" : " not recorded");
  }
  ASSIGN_OR_RETURN(const bool common, CheckInputExists(JoinPath(dir, kTorchDistCommonName)));
  if (common) absl::StrAppend(&model.description, ", ", kTorchDistCommonName);
  absl::StrAppend(&model.description, "; ", dcp_description);
  return model;
}

namespace {
const InputFormatRegistration<TorchDistInput> register_input;
}  // namespace

}  // namespace reshard
