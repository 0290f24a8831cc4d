#include "lib/formats/megatron/torch_dist_output.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/hf/hf_import.h"
#include "lib/formats/megatron/megatron_core_names.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/formats/megatron/torch_dist_format.h"

namespace reshard {
namespace {

using Kind = StructureNode::Kind;

constexpr char kFc1Key[] = "decoder.layers.mlp.linear_fc1.weight";
constexpr char kFc1BiasKey[] = "decoder.layers.mlp.linear_fc1.bias";
constexpr char kFc2Key[] = "decoder.layers.mlp.linear_fc2.weight";
constexpr char kExpertFc1Key[] = "decoder.layers.mlp.experts.experts.linear_fc1.weight";
constexpr char kExpertFc1BiasKey[] = "decoder.layers.mlp.experts.experts.linear_fc1.bias";
constexpr char kExpertFc2Key[] = "decoder.layers.mlp.experts.experts.linear_fc2.weight";
constexpr char kSharedFc1Key[] = "decoder.layers.mlp.shared_experts.linear_fc1.weight";
constexpr char kSharedFc1BiasKey[] = "decoder.layers.mlp.shared_experts.linear_fc1.bias";
constexpr char kSharedFc2Key[] = "decoder.layers.mlp.shared_experts.linear_fc2.weight";
constexpr char kWordEmbeddingsKey[] = "embedding.word_embeddings.weight";
constexpr char kOutputLayerKey[] = "output_layer.weight";
// Megatron-Core's CheckpointingConfig as json.dump(asdict(config)) writes it.
constexpr char kMetadataJson[] =
    R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, )"
    R"("common_backend": "torch", "common_backend_version": 1})";

// `tensor` with dimensions `dim` and `dim + 1` merged into one: the inverse of ViewAsBlocks (a
// fused tensor's [K, size / K] view of a split). Every piece is cut into one piece per block.
CatalogTensor MergeDims(const CatalogTensor& tensor, int dim) {
  CatalogTensor out;
  out.name = tensor.name;
  out.dtype = tensor.dtype;
  out.shape = tensor.shape;
  const int64_t inner = tensor.shape[dim + 1];
  out.shape[dim] *= inner;
  out.shape.erase(out.shape.begin() + dim + 1);
  for (const SourcePiece& piece : tensor.pieces) {
    for (int64_t b = 0; b < piece.box.extent[dim]; ++b) {
      SourcePiece sub = piece;
      sub.byte_offset += static_cast<uint64_t>(b * piece.strides[dim]) * DTypeSize(tensor.dtype);
      sub.box.origin[dim] = (piece.box.origin[dim] + b) * inner + piece.box.origin[dim + 1];
      sub.box.extent[dim] = piece.box.extent[dim + 1];
      sub.strides[dim] = piece.strides[dim + 1];
      sub.box.origin.erase(sub.box.origin.begin() + dim + 1);
      sub.box.extent.erase(sub.box.extent.begin() + dim + 1);
      sub.strides.erase(sub.strides.begin() + dim + 1);
      out.pieces.push_back(std::move(sub));
    }
  }
  return out;
}

// One key of the checkpoint and the input tensors it is made of.
struct Entry {
  std::string key;
  int tp_axis = -1;
  bool stacked = false;
  bool experts = false;  // stacked over the layers and the experts: [num_layers, E, ...]
  // stacked: (layer, expert; -1 unless `experts`) -> its tensor
  std::map<std::pair<int64_t, int64_t>, CatalogTensor> layers;
  CatalogTensor whole;                      // not stacked
  int whole_source = -1;                    // not stacked and not rearranged: the catalog's
  std::string first_name;                   // an input name, for messages
};

// The layer tensors of `entry` stacked along a new leading axis of `layers` layers, and for an
// experts' key, each layer's `experts` experts along a second one.
absl::StatusOr<CatalogTensor> Stack(const Entry& entry, int64_t layers, int64_t experts) {
  const CatalogTensor& first = entry.layers.begin()->second;
  CatalogTensor out;
  out.name = entry.key;
  out.dtype = first.dtype;
  out.shape = first.shape;
  if (entry.experts) out.shape.insert(out.shape.begin(), experts);
  out.shape.insert(out.shape.begin(), layers);
  const int64_t cell_elements = std::max<int64_t>(NumElementsUnchecked(first.shape), 1);
  for (int64_t cell = 0; cell < layers * (entry.experts ? experts : 1); ++cell) {
    const int64_t layer = entry.experts ? cell / experts : cell;
    const int64_t expert = entry.experts ? cell % experts : -1;
    const auto it = entry.layers.find({layer, expert});
    if (it == entry.layers.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", entry.key, "\" has no tensor for layer ", layer, " of ", layers,
          entry.experts ? absl::StrCat(", expert ", expert, " of ", experts) : "", " (from \"",
          entry.first_name, "\" and its siblings); Megatron-Core stacks every layer's ",
          entry.experts ? "experts' tensors under one key, so every layer must hold every expert"
                        : "tensors under one key, so every layer must hold them"));
    }
    const CatalogTensor& tensor = it->second;
    if (tensor.shape != first.shape || tensor.dtype != first.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", tensor.name, "\" is ", DTypeName(tensor.dtype), " ",
          ShapeToString(tensor.shape), " but \"", first.name, "\" is ", DTypeName(first.dtype),
          " ", ShapeToString(first.shape), "; Megatron-Core stacks them under \"", entry.key,
          "\", which needs every layer's tensor alike"));
    }
    for (const SourcePiece& piece : tensor.pieces) {
      SourcePiece stacked = piece;
      if (entry.experts) {
        stacked.box.origin.insert(stacked.box.origin.begin(), expert);
        stacked.box.extent.insert(stacked.box.extent.begin(), 1);
        stacked.strides.insert(stacked.strides.begin(), cell_elements);
      }
      stacked.box.origin.insert(stacked.box.origin.begin(), layer);
      stacked.box.extent.insert(stacked.box.extent.begin(), 1);
      stacked.strides.insert(stacked.strides.begin(),
                             cell_elements * (entry.experts ? experts : 1));
      out.pieces.push_back(std::move(stacked));
    }
  }
  return out;
}

// The common state's args: the input's, for a run of TP `ranks` x PP `stages`; with `experts`
// (> 0) experts per layer, num_experts set (added when missing) and the experts over
// `expert_ranks` expert-parallel ranks, as the data files hold them.
StructureNode CommonArgs(const StructureNode& input_args, int ranks, int stages, int64_t experts,
                         int expert_ranks) {
  StructureNode args = input_args;
  StructureNode* attributes = args.Attributes();
  SetMegatronParallelArgs(attributes, ranks, stages);
  if (StructureNode* slot = FindKey(attributes, "ckpt_format"); slot != nullptr) {
    *slot = StructureNode::String("torch_dist");
  }
  if (experts > 0 && attributes != nullptr) {
    if (StructureNode* slot = FindKey(attributes, "num_experts"); slot != nullptr) {
      *slot = StructureNode::Int(experts);
    } else {
      attributes->Add(StructureNode::String("num_experts"), StructureNode::Int(experts));
    }
    if (StructureNode* slot = FindKey(attributes, "expert_model_parallel_size")) {
      *slot = StructureNode::Int(expert_ranks);
    }
    if (StructureNode* slot = FindKey(attributes, "expert_tensor_parallel_size")) {
      *slot = StructureNode::Int(ranks);
    }
  }
  return args;
}

// Megatron keeps whole query groups (attention heads) on every tensor-parallel rank.
absl::Status CheckWholeGroups(const StructureNode* args, int ranks) {
  const bool gqa = IntAttribute(args, "group_query_attention").value_or(0) != 0;
  const char* key = gqa ? "num_query_groups" : "num_attention_heads";
  const std::optional<int64_t> count = IntAttribute(args, key);
  if (count.has_value() && *count > 0 && *count % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "args.", key, " is ", *count, ", which --parts ", ranks,
        " does not divide: every tensor-parallel rank of Megatron-Core holds whole ",
        gqa ? "query groups" : "attention heads"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ArrangedOutput> TorchDistOutput::Arrange(TargetLayout /*engine_layout*/,
                                                        const ArrangeRequest& request) const {
  const InputModel& model = request.model;
  // Megatron input, or a Hugging Face model PresentInput made a Megatron-LM one.
  if (model.format != kMegatronFormatId && model.format != kId &&
      model.training_state.Value(kHfImportFamilyKey) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the megatron-torch-dist output writes Megatron-Core checkpoints from Megatron input "
        "(Megatron-LM, Megatron-DeepSpeed or Megatron-Core torch_dist: its args, iteration "
        "and layers) or from a Hugging Face model (one safetensors model and its config.json), "
        "not from ",
        model.format, " input"));
  }
  RETURN_IF_ERROR(RefuseSubParams(model.training_state.values, request.catalog,
                                  "--format megatron-torch-dist"));
  if (request.dtype != DTypePolicy::kKeep) {
    return absl::InvalidArgumentError(
        "--dtype with --format megatron-torch-dist: the args (params_dtype, fp16, bf16) would "
        "no longer describe the weights; write the checkpoint with --dtype keep");
  }
  const int ranks = request.consolidate ? 1 : request.parts;
  if (ranks < 1) return absl::InvalidArgumentError("--parts must be at least 1");
  // The pipeline stages the args record (Megatron-Core loads the checkpoint at any TP x PP;
  // --use-checkpoint-args with --use-mp-args-from-checkpoint-args starts the run at these).
  const int stages =
      request.consolidate || request.pipeline_parts < 1 ? 1 : request.pipeline_parts;
  const TrainingState& state = model.training_state;
  const StructureNode* saved_args = state.Value("megatron.args");
  if (saved_args != nullptr && saved_args->Attributes() == nullptr) saved_args = nullptr;
  const StructureNode* args = saved_args != nullptr ? saved_args->Attributes() : nullptr;
  RETURN_IF_ERROR(CheckWholeGroups(args, ranks));
  // Megatron-Core's vocabulary rows: args.padded_vocab_size (make_vocab_size_divisible_by x TP)
  // when the input has fewer (an imported Hugging Face model's vocab_size rows), else the
  // input's own, already padded for the TP it was trained at.
  const int64_t padded_vocab = IntAttribute(args, "padded_vocab_size").value_or(0);
  const StructureNode* impl = FindKey(args, "transformer_impl");
  const MegatronCoreSpec spec = impl != nullptr && impl->kind == Kind::kString &&
                                        impl->text == "local"
                                    ? MegatronCoreSpec::kLocal
                                    : MegatronCoreSpec::kTransformerEngine;

  // The iteration folder.
  std::string folder;
  const StructureNode* release = state.Value("megatron.release");
  const StructureNode* iteration = state.Value("megatron.iteration");
  if (release != nullptr && release->kind == Kind::kBool && release->boolean) {
    folder = "release";
  } else if (iteration != nullptr && iteration->kind == Kind::kInt && iteration->integer >= 0) {
    folder = absl::StrFormat("iter_%07d", iteration->integer);
  } else {
    return absl::InvalidArgumentError(
        "the input records no iteration (and is no release checkpoint), so the iteration folder "
        "of the output cannot be named");
  }

  // Every input tensor under its Megatron-Core key, in the input's order of first use.
  const Catalog& catalog = request.catalog;
  std::vector<std::string> names;
  for (const CatalogTensor& tensor : catalog.tensors) names.push_back(tensor.name);
  ASSIGN_OR_RETURN(const auto pipe_names, PipeNamesToMegatronLM(names));
  std::vector<Entry> entries;
  absl::flat_hash_map<std::string, size_t> entry_of;
  for (size_t i = 0; i < catalog.tensors.size(); ++i) {
    const CatalogTensor& tensor = catalog.tensors[i];
    const auto renamed = pipe_names.find(tensor.name);
    const std::string& name = renamed == pipe_names.end() ? tensor.name : renamed->second;
    ASSIGN_OR_RETURN(const MegatronCoreTensor core, MegatronCoreName(name, spec));
    if (core.skipped) continue;
    auto [at, added] = entry_of.emplace(core.key, entries.size());
    if (added) {
      entries.emplace_back();
      entries.back().key = core.key;
      entries.back().tp_axis = core.tp_axis;
      entries.back().stacked = core.layer >= 0;
      entries.back().experts = core.expert >= 0;
      entries.back().first_name = tensor.name;
    }
    Entry& entry = entries[at->second];
    if (entry.stacked != (core.layer >= 0) || entry.experts != (core.expert >= 0) ||
        (!entry.stacked && !added) ||
        (entry.stacked && entry.layers.count({core.layer, core.expert}) > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors \"", entry.first_name, "\" and \"", tensor.name,
          "\" both map to the Megatron-Core tensor \"", core.UnstackedName(), "\""));
    }
    // A fused tensor's [K, size / K] view (reshard's split of gated or grouped rows) is
    // written as the tensor itself.
    const size_t rank = absl::EndsWith(core.key, ".bias") ? 1 : 2;
    const bool viewed = core.tp_axis >= 0 && tensor.shape.size() == rank + 1;
    if (entry.stacked) {
      entry.layers.emplace(std::make_pair(core.layer, core.expert),
                           viewed ? MergeDims(tensor, core.tp_axis) : tensor);
    } else if (viewed) {
      entry.whole = MergeDims(tensor, core.tp_axis);
    } else {
      entry.whole_source = static_cast<int>(i);
    }
  }
  if (entries.empty()) return absl::InvalidArgumentError("the input holds no tensors to write");

  // The layers: every stacked key must hold the same ones.
  int64_t layers = 0;
  int64_t experts = 0;
  for (const Entry& entry : entries) {
    if (entry.stacked) layers = std::max(layers, entry.layers.rbegin()->first.first + 1);
    if (!entry.experts) continue;
    for (const auto& [cell, tensor] : entry.layers) experts = std::max(experts, cell.second + 1);
  }
  if (const std::optional<int64_t> num_experts = IntAttribute(args, "num_experts");
      num_experts.has_value() && *num_experts > 0 && experts > 0 && *num_experts != experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "args.num_experts is ", *num_experts, " but the model's layers hold ", experts,
        " experts (ids 0 to ", experts - 1, ")"));
  }
  if (const std::optional<int64_t> num_layers = IntAttribute(args, "num_layers");
      num_layers.has_value() && layers > 0 && *num_layers != layers) {
    return absl::InvalidArgumentError(absl::StrCat("args.num_layers is ", *num_layers,
                                                   " but the model holds ", layers, " layers"));
  }
  // The expert-parallel ranks: expert g is saved by EP rank g / E_local's ranks.
  const int expert_ranks = std::max(request.consolidate ? 0 : request.expert_parts, 1);
  ASSIGN_OR_RETURN(const int64_t local_experts,
                   LocalExpertsPerRank(request.consolidate ? 0 : request.expert_parts, experts,
                                       IntAttribute(args, "num_experts").has_value()
                                           ? "experts (args.num_experts)"
                                           : "experts per layer"));
  if (layers % stages != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-parts ", stages, " does not divide the ", layers,
        " layers evenly; the args record pipeline_model_parallel_size ", stages,
        " for a run with the layers balanced evenly over its stages"));
  }
  // Gated fc1 ([gate; up]): twice the rows fc2 has columns; the experts' likewise.
  auto gated_pair = [&](const char* fc1_key, const char* fc2_key) {
    if (!entry_of.contains(fc1_key) || !entry_of.contains(fc2_key)) return false;
    const Entry& fc1 = entries[entry_of.at(fc1_key)];
    const Entry& fc2 = entries[entry_of.at(fc2_key)];
    if (!fc1.stacked || !fc2.stacked) return false;
    const Shape& fc1_shape = fc1.layers.begin()->second.shape;
    const Shape& fc2_shape = fc2.layers.begin()->second.shape;
    return fc1_shape.size() == 2 && fc2_shape.size() == 2 && fc1_shape[0] == 2 * fc2_shape[1];
  };
  const bool gated = gated_pair(kFc1Key, kFc2Key);
  const bool experts_gated = gated_pair(kExpertFc1Key, kExpertFc2Key);
  const bool shared_gated = gated_pair(kSharedFc1Key, kSharedFc2Key);

  ArrangedOutput arranged;
  const int base = static_cast<int>(catalog.tensors.size());
  // Rank t + TP x e stores TP rank t's chunks of EP rank e's experts (Megatron's tp-ep rank
  // order); the tensors outside the experts are stored by EP rank 0's ranks.
  std::vector<std::vector<OutputTensor>> rank_tensors(static_cast<size_t>(ranks) * expert_ranks);
  auto rank_of = [&](int tp_rank, const OutputTensor& cell, bool experts_key) {
    const int64_t ep_rank = experts_key ? cell.region.origin[1] / local_experts : 0;
    return static_cast<size_t>(tp_rank + int64_t{ranks} * ep_rank);
  };
  for (Entry& entry : entries) {
    // Stacked and merged tensors are read as extra tensors, the others from the catalog.
    int source = entry.whole_source;
    if (source < 0) {
      if (entry.stacked) {
        ASSIGN_OR_RETURN(CatalogTensor stacked, Stack(entry, layers, experts));
        arranged.extra_tensors.push_back(std::move(stacked));
      } else {
        arranged.extra_tensors.push_back(std::move(entry.whole));
      }
      source = base + static_cast<int>(arranged.extra_tensors.size()) - 1;
    }
    const CatalogTensor& tensor =
        source < base ? catalog.tensors[source] : arranged.extra_tensors[source - base];
    Shape shape = tensor.shape;
    const bool vocabulary = entry.key == kWordEmbeddingsKey || entry.key == kOutputLayerKey;
    if (vocabulary && !shape.empty() && padded_vocab > shape[0]) shape[0] = padded_vocab;
    OutputTensor chunk;
    chunk.name = entry.key;
    chunk.source = source;
    chunk.dtype = tensor.dtype;
    chunk.global_shape = shape;
    chunk.region = Box::Full(shape);
    // The rows past the input's are written as zeros.
    chunk.zero_fill = shape != tensor.shape;
    int axis = -1;  // the TP axis of the stacked tensor
    if (entry.tp_axis >= 0) axis = entry.tp_axis + (entry.experts ? 2 : entry.stacked ? 1 : 0);
    // An experts' key: one chunk per expert (and TP block), as SequentialMLP saves them.
    std::vector<OutputTensor> cells;
    for (int64_t e = 0; e < (entry.experts ? experts : 1); ++e) {
      OutputTensor cell = chunk;
      if (entry.experts) {
        cell.region.origin[1] = e;
        cell.region.extent[1] = 1;
      }
      cells.push_back(std::move(cell));
    }
    if (ranks == 1 || axis < 0 || axis >= static_cast<int>(shape.size())) {
      for (OutputTensor& cell : cells) {
        const size_t rank = rank_of(0, cell, entry.experts);
        rank_tensors[rank].push_back(std::move(cell));
      }
      continue;
    }
    const bool halves =
        (gated && (entry.key == kFc1Key || entry.key == kFc1BiasKey)) ||
        (experts_gated && (entry.key == kExpertFc1Key || entry.key == kExpertFc1BiasKey)) ||
        (shared_gated && (entry.key == kSharedFc1Key || entry.key == kSharedFc1BiasKey));
    const int64_t blocks = halves ? 2 : 1;
    if (shape[axis] % (blocks * ranks) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", entry.key, "\" ", ShapeToString(shape), ": --parts ", ranks,
          " does not divide its axis ", axis, halves ? " into whole gate and up halves" : "",
          "; Megatron-Core splits it evenly over the tensor-parallel ranks"));
    }
    const int64_t block_size = shape[axis] / blocks;
    const int64_t rows = block_size / ranks;
    for (int r = 0; r < ranks; ++r) {
      for (const OutputTensor& cell : cells) {
        for (int64_t b = 0; b < blocks; ++b) {
          OutputTensor part = cell;
          part.region.origin[axis] = b * block_size + r * rows;
          part.region.extent[axis] = rows;
          const size_t rank = rank_of(r, part, entry.experts);
          rank_tensors[rank].push_back(std::move(part));
        }
      }
    }
  }
  if (!arranged.extra_tensors.empty()) arranged.extra_files = catalog.files;

  arranged.layout.kind =
      rank_tensors.size() == 1 ? TargetLayout::Kind::kConsolidated : TargetLayout::Kind::kParts;
  for (size_t r = 0; r < rank_tensors.size(); ++r) {
    if (rank_tensors[r].empty()) continue;
    OutputFileLayout file;
    file.name = absl::StrCat(folder, "/__", r, "_0.distcp");
    file.tensors = std::move(rank_tensors[r]);
    arranged.layout.files.push_back(std::move(file));
  }
  // The common state, as Megatron-LM's save_checkpoint puts it first in its state dict.
  auto common = std::make_shared<StructureNode>(StructureNode::Dict());
  if (saved_args != nullptr) {
    common->Add(StructureNode::String("args"),
                CommonArgs(*saved_args, ranks, stages, experts, expert_ranks));
  }
  StructureNode version;
  version.kind = Kind::kFloat;
  version.real = 3.0;
  if (const StructureNode* saved = state.Value("megatron.checkpoint_version")) {
    if (saved->kind == Kind::kFloat) version.real = saved->real;
    if (saved->kind == Kind::kInt) version.real = static_cast<double>(saved->integer);
  }
  common->Add(StructureNode::String("checkpoint_version"), version);
  common->Add(StructureNode::String("iteration"),
              StructureNode::Int(iteration != nullptr && iteration->kind == Kind::kInt
                                     ? iteration->integer
                                     : 0));
  OutputFileLayout common_file;
  common_file.name = absl::StrCat(folder, "/", kTorchDistCommonName);
  common_file.structure = std::move(common);
  arranged.layout.files.push_back(std::move(common_file));
  return arranged;
}

absl::StatusOr<bool> TorchDistOutput::PresentInput(const std::string& input, int parts,
                                                   int pipeline_parts, const HfExportOptions& hf,
                                                   InputModel& model, Catalog& catalog) const {
  return PresentHfModelAsMegatron(input, parts, pipeline_parts, kImportAsTorchDist, hf, model,
                                  catalog);
}

absl::StatusOr<FileFraming> TorchDistOutput::Frame(const OutputFileLayout& file) const {
  if (BaseName(file.name) == kTorchDistCommonName) return torch_.Frame(file);
  return dcp_.Frame(file);
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TorchDistOutput::CompanionFiles(
    const TargetLayout& layout) const {
  if (layout.files.empty()) return absl::InternalError("no output file");
  const std::string& first = layout.files[0].name;
  const std::string folder = first.substr(0, first.find('/'));
  // The DCP checkpoint's files, named inside the iteration folder as `.metadata` records them.
  TargetLayout dcp;
  dcp.kind = layout.kind;
  for (const OutputFileLayout& file : layout.files) {
    if (BaseName(file.name) == kTorchDistCommonName) continue;
    OutputFileLayout inside = file;
    inside.name = BaseName(file.name);
    dcp.files.push_back(std::move(inside));
  }
  ASSIGN_OR_RETURN(auto dcp_files, dcp_.CompanionFiles(dcp));
  std::vector<std::pair<std::string, std::string>> files;
  for (auto& [name, contents] : dcp_files) {
    files.emplace_back(absl::StrCat(folder, "/", name), std::move(contents));
  }
  files.emplace_back(absl::StrCat(folder, "/", kTorchDistMetadataName), kMetadataJson);
  ASSIGN_OR_RETURN(std::string tracker, TrackerTextFor(first));
  files.emplace_back(kMegatronTrackerName, std::move(tracker));
  return files;
}

namespace {
const OutputFormatRegistration<TorchDistOutput> register_output;
}  // namespace

}  // namespace reshard
