#include "lib/formats/megatron/megatron_lm_reader.h"

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
#include "lib/formats/megatron/megatron_facts.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace megatron_internal {

namespace {

// One model_optim_rng.pt, read.
struct RankFile {
  std::string label;  // the rank folder, "mp_rank_00_001"
  FileFacts facts;
  std::vector<Catalog> chunks;  // `model`, or `model0`, `model1`, ... (virtual stages)
  std::vector<std::string> notes;
  // What a Megatron output writes back (CarriedValues).
  std::map<std::string, StructureNode> carried;
  uint64_t parsed_bytes = 0;  // what its parse held (TorchArchive::metadata_bytes)
};

absl::StatusOr<RankFile> ReadRankFile(const std::string& dir, const std::string& label) {
  const std::string relative = absl::StrCat(label, "/", kMegatronRankFileName);
  const std::string path = JoinPath(dir, relative);
  ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive, TorchArchive::Open(path));
  const PickleValue* root = archive->root();
  if (PickleEntries(root) == nullptr) {
    return absl::DataLossError(
        absl::StrCat(path, ": expected a dict at the top, found ", DescribePickleValue(root)));
  }
  RankFile file;
  file.label = label;
  file.facts = ReadFacts(root, relative);
  std::vector<std::string> model_keys;
  if (PickleField(root, "model") != nullptr) {
    model_keys.push_back("model");
  } else {
    for (int v = 0; v < kMaxMegatronIndex && PickleField(root, absl::StrCat("model", v)) != nullptr;
         ++v) {
      model_keys.push_back(absl::StrCat("model", v));
    }
  }
  if (model_keys.empty()) {
    return absl::DataLossError(absl::StrCat(
        path, ": no `model` entry (nor model0, model1, ... for virtual pipeline stages)"));
  }
  for (const std::string& key : model_keys) {
    ASSIGN_OR_RETURN(Catalog catalog, StateDictCatalog(*archive, PickleField(root, key), ""));
    for (std::string& note : catalog.other_entries) file.notes.push_back(std::move(note));
    catalog.other_entries.clear();
    file.chunks.push_back(std::move(catalog));
  }
  NoteTopLevel(root, model_keys, file.notes, {"args", "iteration", "checkpoint_version"});
  file.carried = CarriedValues(root, file.facts, file.notes);
  file.parsed_bytes = archive->metadata_bytes();
  return file;
}

}  // namespace

absl::StatusOr<InputModel> ReadMegatronLM(const Resolved& where) {
  const std::string& dir = where.dir;
  // The rank folders present: (tp, pp) -> name.
  std::map<std::pair<int, int>, std::string> present;
  ASSIGN_OR_RETURN(const std::vector<std::string> folders, ListInputSubfolders(dir));
  for (const std::string& name : folders) {
    const std::optional<MegatronRankDir> rank = ParseMegatronRankDir(name);
    if (!rank.has_value()) continue;
    if (rank->ep >= 0) {
      return absl::UnimplementedError(absl::StrCat(
          dir, ": ", name,
          " is an expert-parallel rank folder (mp_rank_TP_PP_EP); expert-parallel Megatron "
          "checkpoints are not supported"));
    }
    auto [slot, inserted] = present.emplace(std::make_pair(rank->tp, rank->pp), name);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": ", slot->second, " and ", name,
                                                     " are both TP rank ", rank->tp, ", PP rank ",
                                                     rank->pp));
    }
  }
  if (present.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no mp_rank_* folders"));
  }

  // Topology: from the args of the first file there is, else from the folder names.
  std::string first_label;
  for (const auto& [rank, name] : present) {
    ASSIGN_OR_RETURN(const bool has_file,
                     CheckInputFile(JoinPath(JoinPath(dir, name), kMegatronRankFileName)));
    if (has_file) {
      first_label = name;
      break;
    }
  }
  if (first_label.empty()) {
    return absl::DataLossError(absl::StrCat(dir, ": Megatron: ", present.begin()->second, "/",
                                            kMegatronRankFileName,
                                            " is missing (no rank folder holds its file)"));
  }
  ASSIGN_OR_RETURN(RankFile first, ReadRankFile(dir, first_label));
  int tp = 0;
  int pp = 0;
  std::string source = "args";
  const std::optional<int64_t> args_tp = ArgNumber(first.facts.args, "tensor_model_parallel_size");
  const std::optional<int64_t> args_pp =
      ArgNumber(first.facts.args, "pipeline_model_parallel_size");
  if (args_tp.has_value() && args_pp.has_value()) {
    if (*args_tp < 1 || *args_pp < 1 || *args_tp * *args_pp > kMaxMegatronIndex) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": ", first.facts.name, " has args.tensor_model_parallel_size = ", *args_tp,
          " and args.pipeline_model_parallel_size = ", *args_pp));
    }
    tp = static_cast<int>(*args_tp);
    pp = static_cast<int>(*args_pp);
  } else {
    if (!InputHasFolders(dir)) {
      // Locally an empty rank folder still says that its file is missing.
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": ", first.facts.name,
          " has no args.tensor_model_parallel_size and pipeline_model_parallel_size, and in "
          "object storage a rank whose file is missing leaves no folder behind: the TP x PP "
          "size cannot be taken from the folder names. Copy the checkpoint to a local folder"));
    }
    source = "folder names";
    for (const auto& [rank, name] : present) {
      tp = std::max(tp, rank.first + 1);
      pp = std::max(pp, rank.second + 1);
    }
  }
  const std::string what = absl::StrCat(dir, ": ", Topology("Megatron", tp, pp));

  // Every (tp, pp) folder, and no other.
  for (const auto& [rank, name] : present) {
    if (rank.first >= tp || rank.second >= pp) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " (from ", source, "): unexpected folder ", name));
    }
  }
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      const std::string expected = MegatronRankDirName(t, p, pp > 1);
      auto it = present.find({t, p});
      // With PP = 1 Megatron writes mp_rank_XX; accept mp_rank_XX_000 from other writers.
      if (it != present.end() && it->second != expected && pp > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": expected folder ", expected, ", found ", it->second));
      }
      const std::string name = it != present.end() ? it->second : expected;
      bool has_file = false;
      if (it != present.end()) {
        ASSIGN_OR_RETURN(has_file,
                         CheckInputFile(JoinPath(JoinPath(dir, name), kMegatronRankFileName)));
      }
      // A rank's file missing from the save: an incomplete checkpoint, as for ZeRO.
      if (!has_file) {
        return absl::DataLossError(
            absl::StrCat(what, ": ", name, "/", kMegatronRankFileName, " is missing"));
      }
    }
  }

  // Every file, checked against the first; the others read several at once, in (tp, pp) order.
  std::vector<std::string> others;
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      if (present.at({t, p}) != first_label) others.push_back(present.at({t, p}));
    }
  }
  std::vector<RankFile> read;
  RETURN_IF_ERROR(ReadInOrder<RankFile>(
      static_cast<int>(others.size()), ParallelReadOptions(),
      [&](int i) { return ReadRankFile(dir, others[i]); },
      [](const RankFile& file) { return file.parsed_bytes; },
      [&](int i, RankFile file) {
        read.push_back(std::move(file));
        return absl::OkStatus();
      }));
  std::vector<std::vector<RankFile>> files(tp);
  auto next = read.begin();
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      files[t].push_back(present.at({t, p}) == first_label ? std::move(first) : std::move(*next++));
    }
  }
  const RankFile& reference = files[0][0];
  RETURN_IF_ERROR(CheckVersion(reference.facts, what, /*required=*/true));
  const size_t chunks = reference.chunks.size();
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      const RankFile& file = files[t][p];
      RETURN_IF_ERROR(CompareFacts(reference.facts, file.facts, what));
      if (file.chunks.size() != chunks) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", file.facts.name, " holds ",
                                                       file.chunks.size(), " model chunk(s) but ",
                                                       reference.facts.name, " holds ", chunks));
      }
    }
  }
  if (auto vpp = ArgNumber(reference.facts.args, "virtual_pipeline_model_parallel_size");
      vpp.has_value() && *vpp != static_cast<int64_t>(chunks) && !(chunks == 1 && *vpp <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": args.virtual_pipeline_model_parallel_size is ", *vpp,
                     " but the files hold ", chunks, " model chunk(s)"));
  }
  // A stage's tensor names agree across TP ranks.
  auto stage_name = [&](int t, int p, size_t v) {
    return chunks > 1 ? absl::StrCat(files[t][p].label, " model", v) : files[t][p].label;
  };
  for (size_t v = 0; v < chunks; ++v) {
    for (int p = 0; p < pp; ++p) {
      for (int t = 1; t < tp; ++t) {
        RETURN_IF_ERROR(CompareNames(files[0][p].chunks[v], stage_name(0, p, v),
                                     files[t][p].chunks[v], stage_name(t, p, v), what));
      }
    }
  }

  // Stages merged per TP rank; virtual stages interleave: chunk v of every PP rank, then v+1.
  StageMergeOptions merge_options;
  const std::optional<int64_t> num_layers = ArgNumber(reference.facts.args, "num_layers");
  merge_options.total_layers = num_layers;
  bool uneven = false;
  for (const char* key : kUnevenStageArgs) {
    if (auto value = ArgNumber(reference.facts.args, key); value.has_value() && *value != 0) {
      uneven = true;
    }
  }
  const int64_t stages = static_cast<int64_t>(pp) * static_cast<int64_t>(chunks);
  if (num_layers.has_value() && !uneven && *num_layers % stages == 0) {
    merge_options.layers_per_stage = *num_layers / stages;
  }
  InputModel model;
  model.format = kMegatronFormatId;
  model.arrangement = "model-parallel-parts";
  for (int t = 0; t < tp; ++t) {
    std::vector<PipelineStage> stage_list;
    std::vector<std::string> labels;
    for (size_t v = 0; v < chunks; ++v) {
      for (int p = 0; p < pp; ++p) {
        stage_list.push_back({stage_name(t, p, v), std::move(files[t][p].chunks[v])});
      }
    }
    for (int p = 0; p < pp; ++p) labels.push_back(files[t][p].label);
    ASSIGN_OR_RETURN(Catalog merged, MergePipelineStages(std::move(stage_list), merge_options),
                     what);
    std::vector<std::string> notes = files[t][0].notes;
    for (std::string& note : merged.other_entries) notes.push_back(std::move(note));
    merged.other_entries = std::move(notes);
    merged.format = kMegatronFormatId;
    model.parts.push_back(std::move(merged));
    model.part_names.push_back(absl::StrCat("tp ", t, " (", absl::StrJoin(labels, ", "), ")"));
  }
  RETURN_IF_ERROR(CheckPaddedVocab(reference.facts, model.parts[0], tp, what));
  ASSIGN_OR_RETURN(const bool swiglu, DecideSwiGLU(reference.facts, model.parts[0], what));
  model.default_rules = MegatronPartitionRules(swiglu, QkvUnitRows(reference.facts.args));

  int64_t layers = 0;
  if (num_layers.has_value()) {
    layers = *num_layers;
  } else {
    std::set<std::string> seen;
    for (const CatalogTensor& tensor : model.parts[0].tensors) {
      const size_t at = tensor.name.find("layers.");
      if (at == std::string::npos) continue;
      seen.insert(tensor.name.substr(0, tensor.name.find('.', at + 7)));
    }
    layers = static_cast<int64_t>(seen.size());
  }
  // What a Megatron output needs to write checkpoints to train from (megatron_format.h).
  TrainingState& state = model.training_state;
  state.values = reference.carried;
  StructureNode release;
  release.kind = StructureNode::Kind::kBool;
  release.boolean = where.name == "release";
  state.values["megatron.release"] = release;
  std::string when = where.name;
  if (where.name != "release" && reference.facts.iteration.has_value()) {
    when = absl::StrCat("iteration ", *reference.facts.iteration);
  }
  model.description = absl::StrCat(Topology("Megatron-LM", tp, pp),
                                   chunks > 1 ? absl::StrCat(" x ", chunks, " virtual stages") : "",
                                   ", ", layers, " layers", swiglu ? ", SwiGLU" : "", ", ", when);
  return model;
}

}  // namespace megatron_internal
}  // namespace reshard
