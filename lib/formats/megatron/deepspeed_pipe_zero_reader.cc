#include "lib/formats/megatron/deepspeed_pipe_zero_reader.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/universal_patterns.h"
#include "lib/formats/deepspeed/zero_folder_files.h"
#include "lib/formats/deepspeed/zero_layout.h"
#include "lib/formats/deepspeed/zero_pickle.h"
#include "lib/formats/deepspeed/zero_reader.h"
#include "lib/formats/megatron/megatron_facts.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_structure.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace megatron_internal {
namespace {

using zero_internal::ZeroFolderFiles;

// What the folder's names say: optimizer files per (mp, dp), model states per mp, TP ranks of
// the layer files.
struct PipeZeroFiles {
  std::map<int, std::map<int, std::string>> optimizer;  // mp -> dp -> name
  std::map<int, std::string> model;                     // mp -> mp_rank_XX_model_states.pt
  std::set<std::string> prefixes;
  std::set<int> layer_tps;
  std::string zero3_file;  // a zero_pp_rank_N_mp_rank_XX_model_states.pt, if any
};

absl::StatusOr<PipeZeroFiles> ListFiles(const std::string& dir) {
  PipeZeroFiles files;
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ListInputFolderEntries(dir));
  for (const std::string& name : names) {
    std::optional<ZeroFileName> parsed = ParseZeroFileName(name);
    if (!parsed.has_value()) continue;
    switch (parsed->kind) {
      case ZeroFileName::Kind::kOptimizer: {
        auto [slot, inserted] = files.optimizer[parsed->mp].emplace(parsed->dp, name);
        if (!inserted) {
          return absl::DataLossError(absl::StrCat(
              dir, ": ", slot->second, " and ", name, " are both the optimizer file of dp rank ",
              parsed->dp, ", mp rank ", parsed->mp, " (two runs mixed?)"));
        }
        files.prefixes.insert(parsed->prefix);
        break;
      }
      case ZeroFileName::Kind::kModel:
        files.model[parsed->mp] = name;
        break;
      case ZeroFileName::Kind::kRankModel:
        files.zero3_file = name;
        break;
      case ZeroFileName::Kind::kPipelineLayer:
        files.layer_tps.insert(parsed->mp);
        break;
    }
  }
  return files;
}

// Whether every model-states file of `files` records partitioned fp32 weights (param_shapes
// not None), the files opened several at once in mp order; false at the first that does not.
absl::StatusOr<bool> AllHaveParamShapes(const std::string& dir, const PipeZeroFiles& files) {
  std::vector<std::string> paths;
  for (const auto& [mp, name] : files.model) paths.push_back(JoinPath(dir, name));
  bool partitioned = true;
  const absl::Status read = OpenArchivesInOrder(paths, [&](int, const TorchArchive& archive) {
    if (!zero_internal::IsNone(PickleField(archive.root(), "param_shapes"))) {
      return absl::OkStatus();
    }
    partitioned = false;
    return absl::CancelledError("stops the reading: a file without partitions");
  });
  if (!partitioned) return false;
  RETURN_IF_ERROR(read);
  return true;
}

// Appends TP rank part `source` (one pipeline stage's params and moments) to `target`. A name
// both hold must be pipeline-replicated (the tied embedding on the first and the last stage):
// the first stage's is kept, as ds_to_universal skips the copies of later stages.
absl::Status AppendStage(Catalog& target, Catalog source, const UniversalPatterns& patterns,
                         const std::string& stage) {
  Catalog kept;
  kept.files = std::move(source.files);
  for (CatalogTensor& tensor : source.tensors) {
    const int existing = target.Find(tensor.name);
    if (existing < 0) {
      kept.tensors.push_back(std::move(tensor));
      continue;
    }
    absl::string_view param = tensor.name;
    if (!absl::ConsumeSuffix(&param, ".exp_avg_sq")) absl::ConsumeSuffix(&param, ".exp_avg");
    if (!patterns.PipelineReplicated(param)) {
      return absl::DataLossError(absl::StrCat(
          stage, ": parameter \"", tensor.name,
          "\" is held by an earlier pipeline stage too, and universal_checkpoint_info's "
          "pipeline_replicated_parameter_patterns do not list it"));
    }
    const CatalogTensor& first = target.tensors[existing];
    if (first.shape != tensor.shape || first.dtype != tensor.dtype) {
      return absl::DataLossError(absl::StrCat(
          stage, ": pipeline-replicated \"", tensor.name, "\" is ", DTypeName(tensor.dtype), " ",
          ShapeToString(tensor.shape), " but ", DTypeName(first.dtype), " ",
          ShapeToString(first.shape), " on an earlier stage"));
    }
  }
  AppendCatalog(target, std::move(kept));
  target.Reindex();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<InputModel>> ReadDeepSpeedPipeZero(const Resolved& where,
                                                                const ReadOptions& options) {
  const std::string& dir = where.dir;
  ASSIGN_OR_RETURN(PipeZeroFiles files, ListFiles(dir));
  if (files.optimizer.empty() || files.model.empty()) return std::nullopt;
  ASSIGN_OR_RETURN(const bool partitioned, AllHaveParamShapes(dir, files));
  if (!partitioned) return std::nullopt;  // no ZeRO fp32 partitions: the layer files it is
  if (!files.zero3_file.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        dir, ": ", files.zero3_file,
        " is a ZeRO-3 model-states file; pipeline checkpoints are read with ZeRO-1/2 only"));
  }
  if (files.prefixes.size() > 1) {
    return absl::DataLossError(absl::StrCat(dir, " mixes optimizer files with different prefixes (",
                                            absl::StrJoin(files.prefixes, ", "),
                                            "): two runs saved into one folder"));
  }

  // Topology: TP from args (else the layer files), PP = model-states files / TP.
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> states0,
                   TorchArchive::Open(JoinPath(dir, files.model.begin()->second)));
  const FileFacts facts = ReadFacts(states0->root(), files.model.begin()->second);
  // How TP slices merge: read here rather than from the training state, which may have failed
  // on a value that has nothing to do with the patterns.
  std::optional<StructureNode> info;
  if (const PickleValue* saved = PickleField(states0->root(), "universal_checkpoint_info");
      !zero_internal::IsNone(saved)) {
    ASSIGN_OR_RETURN(info, PickleToStructure(saved),
                     absl::StrCat(states0->path(), ": universal_checkpoint_info"));
  }
  states0.reset();
  int tp = static_cast<int>(files.layer_tps.size());
  if (auto args_tp = ArgNumber(facts.args, "tensor_model_parallel_size"); args_tp.has_value()) {
    tp = static_cast<int>(*args_tp);
  }
  const int mp_ranks = static_cast<int>(files.model.size());
  if (tp < 1 || mp_ranks % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": ", mp_ranks,
                                                   " mp_rank_XX_model_states.pt files do not "
                                                   "divide into TP ",
                                                   tp, " pipeline stages"));
  }
  const int pp = mp_ranks / tp;
  if (auto args_pp = ArgNumber(facts.args, "pipeline_model_parallel_size");
      args_pp.has_value() && *args_pp != pp) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": args say PP ", *args_pp, " but the folder holds ", mp_ranks,
                     " mp_rank_XX_model_states.pt files for TP ", tp));
  }
  const std::string what = absl::StrCat(dir, ": ", Topology("DeepSpeed pipeline", tp, pp));
  for (int mp = 0; mp < mp_ranks; ++mp) {
    if (files.model.count(mp) == 0) {
      return absl::DataLossError(absl::StrCat(
          what, ": ", absl::StrFormat("mp_rank_%02d_model_states.pt", mp), " is missing"));
    }
    if (files.optimizer.count(mp) == 0) {
      return absl::DataLossError(absl::StrCat(
          what, ": mp rank ", mp, " (pp ", mp / tp, ", tp ", mp % tp, ") has no optimizer files (",
          absl::StrFormat("%szero_pp_rank_*_mp_rank_%02d_optim_states.pt", *files.prefixes.begin(),
                          mp),
          "). ", zero_internal::kPartialSaveHint));
    }
  }
  for (const auto& [mp, ranks] : files.optimizer) {
    if (mp >= mp_ranks) {
      return absl::DataLossError(absl::StrCat(what, ": unexpected optimizer file ",
                                              ranks.begin()->second, " (mp rank ", mp, ")"));
    }
    if (ranks.size() != files.optimizer.at(0).size()) {
      return absl::DataLossError(absl::StrCat(
          what, ": mp rank ", mp, " has ", ranks.size(), " optimizer files but mp rank 0 has ",
          files.optimizer.at(0).size(), ". ", zero_internal::kPartialSaveHint));
    }
  }

  // Each (pp, tp) rank's ZeRO files on their own, as the ZeRO reader reads a data-parallel run.
  std::vector<InputModel> ranks;
  for (int mp = 0; mp < mp_ranks; ++mp) {
    ZeroFolderFiles zero;
    zero.optimizer_files = files.optimizer.at(mp);
    zero.model_files[mp] = files.model.at(mp);
    zero.any_optimizer_file = true;
    zero.prefix = *files.prefixes.begin();
    zero.mp_rank = mp;
    zero.pipeline = true;
    ASSIGN_OR_RETURN(InputModel rank,
                     zero_internal::ReadZeroCheckpoint(dir, where.name, std::move(zero), options),
                     absl::StrCat(what, ", pp ", mp / tp, " tp ", mp % tp));
    ranks.push_back(std::move(rank));
  }
  const TrainingState& state0 = ranks[0].training_state;
  if (tp > 1 && !info.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": ", files.model.at(0),
        " has no universal_checkpoint_info, which says how the TP slices of each parameter "
        "merge (ds_to_universal refuses such a checkpoint too)"));
  }
  ASSIGN_OR_RETURN(UniversalPatterns patterns,
                   UniversalPatterns::FromInfo(info.has_value() ? &*info : nullptr),
                   absl::StrCat(what, ": ", files.model.at(0)));

  InputModel model;
  model.format = kMegatronFormatId;
  model.arrangement = "model-parallel-parts";
  model.training_state.values = state0.values;
  model.training_state.tensors = state0.tensors;
  model.training_state.files = state0.files;
  StructureNode& groups = model.training_state.values["deepspeed.param_group"];
  groups = StructureNode();
  groups.kind = StructureNode::Kind::kDict;
  absl::flat_hash_set<std::string> grouped;
  for (int t = 0; t < tp; ++t) {
    Catalog part;
    part.format = kMegatronFormatId;
    for (int p = 0; p < pp; ++p) {
      InputModel& rank = ranks[p * tp + t];
      RETURN_IF_ERROR(AppendStage(part, std::move(rank.parts[0]), patterns,
                                  absl::StrCat(what, ", pp ", p, " tp ", t)));
      // Which param group each param is in (the step of step.pt), first stage first.
      if (const StructureNode* stage_groups = rank.training_state.Value("deepspeed.param_group")) {
        for (size_t i = 0; i < stage_groups->keys.size(); ++i) {
          if (!grouped.insert(stage_groups->keys[i].text).second) continue;
          groups.keys.push_back(stage_groups->keys[i]);
          groups.values.push_back(stage_groups->values[i]);
        }
      }
    }
    part.Reindex();
    model.parts.push_back(std::move(part));
    model.part_names.push_back(absl::StrFormat("tp %d (mp_rank_%02d..., ZeRO files)", t, t));
  }
  for (int mp = 0; mp < mp_ranks; ++mp) {
    // A rank whose training state could not be read fails the outputs that need it.
    if (const absl::Status& problem = ranks[mp].training_state.problem;
        !problem.ok() && model.training_state.problem.ok()) {
      model.training_state.problem =
          Annotate(problem, absl::StrCat(what, ", pp ", mp / tp, " tp ", mp % tp));
    }
    for (std::string& path : ranks[mp].training_state.verbatim_files) {
      model.training_state.verbatim_files.push_back(std::move(path));
    }
  }
  // Merges ds_to_universal does that are no concatenation: fused sub-params (GQA
  // query_key_value) are regrouped so that concatenation merges them; averaged params keep
  // every TP rank's slice (and moments) in the training state, "deepspeed.tp_slice.<t>.<name>",
  // for the universal output to average.
  std::vector<int> slice_file_base(tp, -1);
  for (size_t i = 0; i < model.parts[0].tensors.size(); ++i) {
    const std::string name = model.parts[0].tensors[i].name;
    const UcpMerge merge = patterns.Classify(name).merge;
    if (merge == UcpMerge::kAverage && tp > 1) {
      TrainingState& state = model.training_state;
      for (int t = 0; t < tp; ++t) {
        const Catalog& part = model.parts[t];
        const int index = part.Find(name);
        if (index < 0) continue;  // MergeParts reports a name missing from a part
        if (slice_file_base[t] < 0) {
          slice_file_base[t] = static_cast<int>(state.files.size());
          state.files.insert(state.files.end(), part.files.begin(), part.files.end());
        }
        CatalogTensor slice = part.tensors[index];
        slice.name = absl::StrCat("deepspeed.tp_slice.", t, ".", name);
        for (SourcePiece& piece : slice.pieces) piece.file += slice_file_base[t];
        state.tensors.push_back(std::move(slice));
      }
    }
  }
  ASSIGN_OR_RETURN(const auto regrouped, RegroupAllSubParams(model.parts, patterns), what);
  for (const auto& [name, shape] : regrouped) {
    RecordSubParams(model.training_state.values, name, {shape->partition_dim, shape->sizes});
  }
  model.default_rules = patterns.MergeRules();
  std::string when = absl::StrCat("tag ", where.name);
  if (facts.iteration.has_value()) when = absl::StrCat("iteration ", *facts.iteration, ", ", when);
  model.description =
      absl::StrCat("Megatron-DeepSpeed pipeline TP", tp, " x PP", pp, ", from its ZeRO files (",
                   files.optimizer.at(0).size(), " data-parallel rank",
                   files.optimizer.at(0).size() == 1 ? "" : "s", ": ", ranks[0].description, "), ",
                   model.parts[0].tensors.size(), " tensors per TP rank, ", when);
  return model;
}

}  // namespace megatron_internal
}  // namespace reshard
