#include "lib/formats/megatron/deepspeed_pipe_reader.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/universal_patterns.h"
#include "lib/formats/megatron/megatron_facts.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_structure.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace megatron_internal {

absl::StatusOr<InputModel> ReadDeepSpeedPipe(const Resolved& where) {
  const std::string& dir = where.dir;
  std::map<int, std::map<int, std::string>> layer_files;  // layer -> tp -> file name
  std::map<int, std::string> state_files;                 // mp rank -> file name
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ListInputFolder(dir));
  for (const std::string& name : names) {
    if (auto layer = ParsePipeLayerFile(name); layer.has_value()) {
      auto [slot, inserted] = layer_files[layer->layer].emplace(layer->tp, name);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": ", slot->second, " and ", name,
                                                       " are both layer ", layer->layer,
                                                       " of TP rank ", layer->tp));
      }
    } else if (absl::StartsWith(name, "layer_") && absl::StrContains(name, "_expert_")) {
      return absl::UnimplementedError(absl::StrCat(
          dir, ": ", name,
          " holds mixture-of-experts weights (layer_L_expert_E_mp_rank_XX files); DeepSpeed MoE "
          "checkpoints are not supported"));
    } else if (auto rank = ParseModelStatesFile(name); rank.has_value()) {
      state_files.emplace(*rank, name);
    }
  }
  if (layer_files.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no pipeline layer files"));
  }

  // Args, iteration and version from the mp_rank files, which must agree.
  std::vector<FileFacts> facts;
  std::vector<std::string> notes;
  std::map<std::string, StructureNode> carried;  // the first file's, for the training state
  // The first file's universal_checkpoint_info: how the TP slices of each parameter merge.
  std::optional<StructureNode> info;
  std::vector<std::string> state_names, state_paths;
  for (const auto& [rank, name] : state_files) {
    state_names.push_back(name);
    state_paths.push_back(JoinPath(dir, name));
  }
  RETURN_IF_ERROR(OpenArchivesInOrder(state_paths, [&](int i, const TorchArchive& archive) {
    const std::string& name = state_names[i];
    facts.push_back(ReadFacts(archive.root(), name));
    if (facts.size() == 1) {
      NoteTopLevel(archive.root(), {}, notes, {"args", "iteration", "checkpoint_version"});
      carried = CarriedValues(archive.root(), facts.back(), notes);
      for (std::string& note : notes) note = absl::StrCat(name, ": ", note);
      if (const PickleValue* saved = PickleField(archive.root(), "universal_checkpoint_info");
          saved != nullptr && saved->kind != PickleValue::Kind::kNone) {
        ASSIGN_OR_RETURN(info, PickleToStructure(saved),
                         absl::StrCat(archive.path(), ": universal_checkpoint_info"));
      }
    }
    return absl::OkStatus();
  }));
  int tp = 0;
  for (const auto& [layer, ranks] : layer_files) tp = std::max(tp, ranks.rbegin()->first + 1);
  std::string what = absl::StrCat(dir, ": DeepSpeed pipeline");
  for (size_t i = 1; i < facts.size(); ++i) RETURN_IF_ERROR(CompareFacts(facts[0], facts[i], what));
  const FileFacts reference = facts.empty() ? FileFacts{} : facts[0];
  RETURN_IF_ERROR(CheckVersion(reference, what, /*required=*/false));
  std::optional<int64_t> pp;
  if (auto args_tp = ArgNumber(reference.args, "tensor_model_parallel_size"); args_tp.has_value()) {
    if (*args_tp < 1 || *args_tp > kMaxMegatronIndex) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", reference.name, " has args.tensor_model_parallel_size = ", *args_tp));
    }
    tp = static_cast<int>(*args_tp);
  }
  pp = ArgNumber(reference.args, "pipeline_model_parallel_size");
  if (!pp.has_value() && !state_files.empty() && state_files.size() % tp == 0) {
    pp = static_cast<int64_t>(state_files.size()) / tp;
  }
  what = absl::StrCat(dir, ": ",
                      pp ? Topology("DeepSpeed pipeline", tp, static_cast<int>(*pp))
                         : absl::StrCat("DeepSpeed pipeline TP", tp));

  // Every layer has a file for every TP rank, and for no other.
  for (const auto& [layer, ranks] : layer_files) {
    std::vector<int> held;
    for (const auto& [rank, name] : ranks) held.push_back(rank);
    for (const auto& [rank, name] : ranks) {
      if (rank >= tp) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": unexpected file ", name, " (TP rank ", rank, ")"));
      }
    }
    for (int t = 0; t < tp; ++t) {
      if (ranks.count(t) == 0) {
        return absl::DataLossError(
            absl::StrCat(what, ": ", PipeLayerFileName(layer, t), " is missing (layer ", layer,
                         " has files for TP rank(s) ", absl::StrJoin(held, ", "), ")"));
      }
    }
  }
  // One mp_rank file per (pp, tp) when the args say how many there are.
  if (pp.has_value() && !state_files.empty()) {
    const int64_t expected = *pp * tp;
    for (int64_t i = 0; i < expected && i < kMaxMegatronIndex; ++i) {
      if (state_files.count(static_cast<int>(i)) == 0) {
        return absl::DataLossError(absl::StrCat(
            what, ": ", absl::StrFormat("mp_rank_%02d_model_states.pt", i), " is missing"));
      }
    }
    for (const auto& [rank, name] : state_files) {
      if (rank >= expected) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": unexpected file ", name));
      }
    }
  }

  // Each layer file of each TP rank, its tensors named "<layer>.<key>".
  std::vector<std::vector<Catalog>> layers(tp);  // [tp][layer position]
  std::vector<int> layer_ids;
  for (const auto& [layer, ranks] : layer_files) layer_ids.push_back(layer);
  std::vector<std::string> layer_paths;  // TP rank-major
  for (int t = 0; t < tp; ++t) {
    for (int layer : layer_ids) layer_paths.push_back(JoinPath(dir, layer_files[layer][t]));
  }
  RETURN_IF_ERROR(OpenArchivesInOrder(layer_paths, [&](int i, const TorchArchive& archive) {
    const int t = i / static_cast<int>(layer_ids.size());
    const int layer = layer_ids[i % layer_ids.size()];
    ASSIGN_OR_RETURN(Catalog catalog,
                     StateDictCatalog(archive, archive.root(), absl::StrCat(layer)));
    if (t == 0) {
      for (std::string& note : catalog.other_entries) notes.push_back(std::move(note));
    }
    catalog.other_entries.clear();
    layers[t].push_back(std::move(catalog));
    return absl::OkStatus();
  }));
  for (int t = 1; t < tp; ++t) {
    for (size_t i = 0; i < layer_ids.size(); ++i) {
      RETURN_IF_ERROR(CompareNames(layers[0][i], PipeLayerFileName(layer_ids[i], 0), layers[t][i],
                                   PipeLayerFileName(layer_ids[i], t), what));
    }
  }

  // The tied embedding (TiedLayerSpec 'embed') has a layer file at each end: keep the first.
  // A later layer is that copy when it holds exactly the same keys, dtypes and shapes as the
  // first layer holding word_embeddings.weight.
  auto signature = [](const Catalog& catalog, int layer) {
    std::vector<std::string> keys;
    const std::string prefix = absl::StrCat(layer, ".");
    for (const CatalogTensor& tensor : catalog.tensors) {
      keys.push_back(absl::StrCat(absl::StripPrefix(tensor.name, prefix), " ",
                                  DTypeName(tensor.dtype), " ", ShapeToString(tensor.shape)));
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  };
  std::vector<bool> dropped(layer_ids.size(), false);
  std::optional<size_t> embedding;
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    const Catalog& catalog = layers[0][i];
    if (catalog.Find(absl::StrCat(layer_ids[i], ".word_embeddings.weight")) < 0) continue;
    if (!embedding.has_value()) {
      embedding = i;
      continue;
    }
    if (signature(catalog, layer_ids[i]) ==
        signature(layers[0][*embedding], layer_ids[*embedding])) {
      dropped[i] = true;
      notes.push_back(
          absl::StrCat(layer_ids[i], ".*: the second instance of the tied embedding layer (",
                       PipeLayerFileName(layer_ids[i], 0),
                       ", ...), left out: ", layer_ids[*embedding], ".* holds the embedding"));
    }
  }

  InputModel model;
  model.format = kMegatronFormatId;
  model.arrangement = "model-parallel-parts";
  for (int t = 0; t < tp; ++t) {
    Catalog part;
    part.format = kMegatronFormatId;
    for (size_t i = 0; i < layer_ids.size(); ++i) {
      if (dropped[i]) continue;
      AppendCatalog(part, std::move(layers[t][i]));
    }
    part.other_entries = notes;
    part.Reindex();
    model.parts.push_back(std::move(part));
    model.part_names.push_back(absl::StrFormat("tp %d (layer_*-model_%02d-model_states.pt)", t, t));
  }
  // Fused sub-params (universal_checkpoint_info.parameter_with_sub_params: the GQA
  // query_key_value saved [q_t; k_t; v_t] per TP rank) regrouped so that concatenating the TP
  // parts gives ds_to_universal's merge, [q; k; v], as the ZeRO pipeline reader does; recorded
  // for the outputs that split a fused QKV.
  ASSIGN_OR_RETURN(const UniversalPatterns patterns,
                   UniversalPatterns::FromInfo(info.has_value() ? &*info : nullptr),
                   absl::StrCat(what, ": ", reference.name));
  ASSIGN_OR_RETURN(const auto regrouped, RegroupAllSubParams(model.parts, patterns), what);
  for (const auto& [name, shape] : regrouped) {
    RecordSubParams(carried, name, {shape->partition_dim, shape->sizes});
  }
  RETURN_IF_ERROR(CheckPaddedVocab(reference, model.parts[0], tp, what));
  ASSIGN_OR_RETURN(const bool swiglu, DecideSwiGLU(reference, model.parts[0], what));
  model.default_rules = MegatronPartitionRules(swiglu, QkvUnitRows(reference.args));

  // What a Megatron output needs (megatron_format.h); it maps the layer names back.
  model.training_state.values = std::move(carried);
  std::string when = absl::StrCat("tag ", where.name);
  if (reference.iteration.has_value()) {
    when = absl::StrCat("iteration ", *reference.iteration, ", ", when);
  }
  const std::optional<int64_t> num_layers = ArgNumber(reference.args, "num_layers");
  model.description = absl::StrCat(
      "Megatron-DeepSpeed pipeline ",
      pp ? absl::StrCat("TP", tp, " x PP", *pp) : absl::StrCat("TP", tp), ", ",
      num_layers ? absl::StrCat(*num_layers, " layers in ") : "", layer_ids.size(), " layer files",
      swiglu ? ", SwiGLU" : "", ", ", when,
      facts.empty() ? " (no mp_rank_XX_model_states.pt: topology from the layer files)" : "");
  return model;
}

}  // namespace megatron_internal
}  // namespace reshard
