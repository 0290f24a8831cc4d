#include "lib/formats/megatron/megatron_lm_reader.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
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

// The rank folders of one TP rank's expert-parallel ranks merged into one Catalog: expert
// tensors renamed to their global ids (ExpertTensorNameFor), each expert exactly once; the
// other tensors taken from EP rank 0, their copies in the other EP ranks kept as replicas that
// `verify` compares. `ranks[e]` is EP rank e's merged stages, `labels[e]` its folders.
absl::StatusOr<Catalog> MergeExpertRanks(std::vector<Catalog> ranks,
                                         const std::vector<std::string>& labels,
                                         std::optional<int64_t> num_experts,
                                         absl::string_view what) {
  const int ep = static_cast<int>(ranks.size());
  // Expert tensors of each rank, by their layer's experts prefix.
  std::vector<std::map<std::string, std::vector<int>>> experts_of(ep);
  std::vector<std::vector<std::optional<ExpertTensorName>>> parsed(ep);
  for (int e = 0; e < ep; ++e) {
    for (const CatalogTensor& tensor : ranks[e].tensors) {
      parsed[e].push_back(ParseExpertTensorName(tensor.name));
      if (parsed[e].back().has_value()) {
        experts_of[e][parsed[e].back()->experts].push_back(
            static_cast<int>(parsed[e].size()) - 1);
      }
    }
  }
  int64_t local_experts = 0;
  if (num_experts.has_value()) {
    if (*num_experts < 1 || *num_experts % ep != 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": args.num_experts = ", *num_experts,
                                                     " is not divisible over ", ep,
                                                     " expert-parallel ranks"));
    }
    local_experts = *num_experts / ep;
  } else {
    for (const auto& [prefix, indices] : experts_of[0]) {
      for (int i : indices) {
        local_experts = std::max<int64_t>(local_experts, parsed[0][i]->local + 1);
      }
    }
  }
  const int64_t total = local_experts * ep;

  Catalog merged;
  merged.format = kMegatronFormatId;
  std::vector<std::vector<int>> file_map(ep);
  for (int e = 0; e < ep; ++e) {
    for (SourceFile& file : ranks[e].files) {
      file_map[e].push_back(static_cast<int>(merged.files.size()));
      merged.files.push_back(std::move(file));
    }
  }
  auto remapped = [&](int e, std::vector<SourcePiece> pieces) {
    for (SourcePiece& piece : pieces) piece.file = file_map[e].at(piece.file);
    return pieces;
  };
  // Global name -> where it came from, for the duplicate check.
  absl::flat_hash_map<std::string, std::string> origin;
  auto add_expert = [&](int e, int i) -> absl::Status {
    CatalogTensor& tensor = ranks[e].tensors[i];
    const ExpertTensorName& name = *parsed[e][i];
    const int64_t global = GlobalExpertId(e, local_experts, name.local);
    const std::string from = absl::StrCat(labels[e], " (", tensor.name, ")");
    if (name.local >= local_experts) {
      const int owner = static_cast<int>(global / local_experts);
      const std::string owner_tensor = ExpertTensorNameFor(name, global % local_experts);
      std::string also;
      if (owner < ep) {
        also = absl::StrCat("; expert ", global, " belongs to ", labels[owner], " (local expert ",
                            global % local_experts, ")");
      }
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", from, " is local expert ", name.local, " of ", name.experts,
          ", but each of the ", ep, " expert-parallel ranks holds ", local_experts, " experts (",
          total, " in all", num_experts.has_value() ? ", args.num_experts" : "",
          "): expert ", global, " of ", name.experts, " is duplicated", also));
    }
    std::string global_name = ExpertTensorNameFor(name, global);
    auto [it, inserted] = origin.emplace(global_name, from);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": expert ", global, " of ",
                                                     name.experts, " is duplicated: ", it->second,
                                                     " and ", from, " are both ", global_name));
    }
    CatalogTensor out = std::move(tensor);
    out.name = std::move(global_name);
    out.pieces = remapped(e, std::move(out.pieces));
    merged.tensors.push_back(std::move(out));
    return absl::OkStatus();
  };

  absl::flat_hash_map<std::string, int> rank0_index;  // non-expert name -> merged tensor
  std::set<std::string> emitted_prefixes;
  for (size_t i = 0; i < ranks[0].tensors.size(); ++i) {
    if (parsed[0][i].has_value()) {
      const std::string& prefix = parsed[0][i]->experts;
      if (!emitted_prefixes.insert(prefix).second) continue;
      // Every rank's experts of this layer, in global order.
      for (int e = 0; e < ep; ++e) {
        auto it = experts_of[e].find(prefix);
        if (it == experts_of[e].end()) continue;
        for (int index : it->second) RETURN_IF_ERROR(add_expert(e, index));
      }
      continue;
    }
    CatalogTensor tensor = std::move(ranks[0].tensors[i]);
    tensor.pieces = remapped(0, std::move(tensor.pieces));
    rank0_index[tensor.name] = static_cast<int>(merged.tensors.size());
    merged.tensors.push_back(std::move(tensor));
  }
  for (int e = 1; e < ep; ++e) {
    size_t shared = 0;
    for (size_t i = 0; i < ranks[e].tensors.size(); ++i) {
      CatalogTensor& tensor = ranks[e].tensors[i];
      if (parsed[e][i].has_value()) {
        if (!emitted_prefixes.count(parsed[e][i]->experts)) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": ", labels[e], " holds experts of ", parsed[e][i]->experts,
                           " that ", labels[0], " lacks"));
        }
        continue;
      }
      auto it = rank0_index.find(tensor.name);
      if (it == rank0_index.end()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", labels[e], " holds tensor \"",
                                                       tensor.name, "\" that ", labels[0],
                                                       " lacks"));
      }
      CatalogTensor& first = merged.tensors[it->second];
      if (first.shape != tensor.shape || first.dtype != tensor.dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": \"", tensor.name, "\" is ", DTypeName(tensor.dtype), " ",
            ShapeToString(tensor.shape), " in ", labels[e], " but ", DTypeName(first.dtype), " ",
            ShapeToString(first.shape), " in ", labels[0],
            " (a tensor outside the experts is the same in every expert-parallel rank)"));
      }
      for (SourcePiece& piece : remapped(e, std::move(tensor.pieces))) {
        first.replicas.push_back(std::move(piece));
      }
      ++shared;
    }
    if (shared != rank0_index.size()) {
      for (const auto& [name, index] : rank0_index) {
        bool found = false;
        for (const CatalogTensor& tensor : ranks[e].tensors) found |= tensor.name == name;
        if (!found) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": ", labels[e], " lacks tensor \"",
                                                         name, "\" that ", labels[0], " holds"));
        }
      }
    }
  }
  // Every expert of every layer, with the same tensors.
  std::map<std::string, std::set<std::string>> rests;
  for (int e = 0; e < ep; ++e) {
    for (const std::optional<ExpertTensorName>& name : parsed[e]) {
      if (name.has_value()) rests[name->experts].insert(name->rest);
    }
  }
  for (const auto& [prefix, names] : rests) {
    for (int64_t global = 0; global < total; ++global) {
      for (const std::string& rest : names) {
        ExpertTensorName name{prefix, 0, rest};
        if (origin.count(ExpertTensorNameFor(name, global))) continue;
        const int owner = static_cast<int>(global / local_experts);
        return absl::DataLossError(absl::StrCat(
            what, ": expert ", global, " of ", prefix, " is missing: ", labels[owner],
            " has no local expert ", global % local_experts, " ", rest, " (", total,
            " experts over ", ep, " expert-parallel ranks)"));
      }
    }
  }
  for (int e = 0; e < ep; ++e) {
    for (std::string& note : ranks[e].other_entries) {
      if (e == 0) merged.other_entries.push_back(std::move(note));
    }
  }
  merged.Reindex();
  return merged;
}

}  // namespace

absl::StatusOr<InputModel> ReadMegatronLM(const Resolved& where) {
  const std::string& dir = where.dir;
  // The rank folders there are, as named; what their numbers mean depends on the args.
  std::map<std::string, MegatronRankDir> named;
  ASSIGN_OR_RETURN(const std::vector<std::string> folders, ListInputSubfolders(dir));
  for (const std::string& name : folders) {
    const std::optional<MegatronRankDir> rank = ParseMegatronRankDir(name);
    if (rank.has_value()) named.emplace(name, *rank);
  }
  if (named.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": no mp_rank_* folders"));
  }

  // Topology: from the args of the first file there is, else from the folder names.
  std::string first_label;
  for (const auto& [name, rank] : named) {
    ASSIGN_OR_RETURN(const bool has_file,
                     CheckInputFile(JoinPath(JoinPath(dir, name), kMegatronRankFileName)));
    if (has_file) {
      first_label = name;
      break;
    }
  }
  if (first_label.empty()) {
    return absl::DataLossError(absl::StrCat(dir, ": Megatron: ", named.begin()->first, "/",
                                            kMegatronRankFileName,
                                            " is missing (no rank folder holds its file)"));
  }
  ASSIGN_OR_RETURN(RankFile first, ReadRankFile(dir, first_label));
  int tp = 0;
  int pp = 0;
  int ep = 1;
  std::string source = "args";
  const std::optional<int64_t> args_tp = ArgNumber(first.facts.args, "tensor_model_parallel_size");
  const std::optional<int64_t> args_pp =
      ArgNumber(first.facts.args, "pipeline_model_parallel_size");
  const std::optional<int64_t> args_ep = ArgNumber(first.facts.args, "expert_model_parallel_size");
  const std::optional<int64_t> num_experts = ArgNumber(first.facts.args, "num_experts");
  std::map<std::tuple<int, int, int>, std::string> present;  // (tp, pp, ep) -> folder
  auto place = [&](const std::string& name, const MegatronRankDir& rank) -> absl::Status {
    auto [slot, inserted] = present.emplace(std::make_tuple(rank.tp, rank.pp, rank.ep), name);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": ", slot->second, " and ", name,
                                                     " are both TP rank ", rank.tp, ", PP rank ",
                                                     rank.pp, ", EP rank ", rank.ep));
    }
    return absl::OkStatus();
  };
  if (args_tp.has_value() && args_pp.has_value()) {
    if (*args_tp < 1 || *args_pp < 1 || *args_tp * *args_pp > kMaxMegatronIndex ||
        (args_ep.has_value() && (*args_ep < 1 || *args_ep * *args_tp * *args_pp >
                                                     kMaxMegatronIndex))) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": ", first.facts.name, " has args.tensor_model_parallel_size = ", *args_tp,
          ", args.pipeline_model_parallel_size = ", *args_pp,
          " and args.expert_model_parallel_size = ", args_ep.value_or(1)));
    }
    tp = static_cast<int>(*args_tp);
    pp = static_cast<int>(*args_pp);
    ep = static_cast<int>(args_ep.value_or(1));
    for (const auto& [name, parsed] : named) {
      const std::optional<MegatronRankDir> rank =
          InterpretMegatronRankDir(parsed, /*pipeline=*/pp > 1, /*expert=*/ep > 1);
      if (!rank.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, ": ", Topology("Megatron", tp, pp), ep > 1 ? absl::StrCat(" x EP", ep) : "",
            " (from args): unexpected folder ", name, " (Megatron names the rank folders ",
            MegatronRankDirName(0, 0, pp > 1, ep > 1 ? 0 : -1), " ...)"));
      }
      RETURN_IF_ERROR(place(name, *rank));
    }
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
    for (const auto& [name, rank] : named) {
      MegatronRankDir placed = rank;
      placed.ep = std::max(rank.ep, 0);
      tp = std::max(tp, placed.tp + 1);
      pp = std::max(pp, placed.pp + 1);
      ep = std::max(ep, placed.ep + 1);
      RETURN_IF_ERROR(place(name, placed));
    }
  }
  const std::string what =
      absl::StrCat(dir, ": ", Topology("Megatron", tp, pp), ep > 1 ? absl::StrCat(" x EP", ep) : "");

  // Every (tp, pp, ep) folder, and no other.
  for (const auto& [rank, name] : present) {
    if (std::get<0>(rank) >= tp || std::get<1>(rank) >= pp || std::get<2>(rank) >= ep) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " (from ", source, "): unexpected folder ", name));
    }
  }
  for (int t = 0; t < tp; ++t) {
    for (int p = 0; p < pp; ++p) {
      for (int e = 0; e < ep; ++e) {
        const std::string expected = MegatronRankDirName(t, p, pp > 1, ep > 1 ? e : -1);
        auto it = present.find({t, p, e});
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
          std::string experts;
          if (ep > 1 && num_experts.has_value() && *num_experts % ep == 0) {
            const int64_t local = *num_experts / ep;
            experts = absl::StrCat(" (it holds experts ", GlobalExpertId(e, local, 0), " to ",
                                   GlobalExpertId(e, local, local - 1), ")");
          }
          return absl::DataLossError(absl::StrCat(what, ": ", name, "/", kMegatronRankFileName,
                                                  " is missing", experts));
        }
      }
    }
  }

  // Every file, checked against the first; the others read several at once, in (tp, ep, pp)
  // order.
  std::vector<std::string> others;
  for (int t = 0; t < tp; ++t) {
    for (int e = 0; e < ep; ++e) {
      for (int p = 0; p < pp; ++p) {
        if (present.at({t, p, e}) != first_label) others.push_back(present.at({t, p, e}));
      }
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
  // files[t * ep + e][p]: the stages of TP rank t, EP rank e.
  std::vector<std::vector<RankFile>> files(tp * ep);
  auto next = read.begin();
  for (int t = 0; t < tp; ++t) {
    for (int e = 0; e < ep; ++e) {
      for (int p = 0; p < pp; ++p) {
        files[t * ep + e].push_back(present.at({t, p, e}) == first_label ? std::move(first)
                                                                        : std::move(*next++));
      }
    }
  }
  const RankFile& reference = files[0][0];
  RETURN_IF_ERROR(CheckVersion(reference.facts, what, /*required=*/true));
  const size_t chunks = reference.chunks.size();
  for (const std::vector<RankFile>& stages : files) {
    for (const RankFile& file : stages) {
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
  // A stage's tensor names agree across TP ranks (EP ranks are compared when merged).
  auto stage_name = [&](int t, int e, int p, size_t v) {
    const std::string& label = files[t * ep + e][p].label;
    return chunks > 1 ? absl::StrCat(label, " model", v) : label;
  };
  for (size_t v = 0; v < chunks; ++v) {
    for (int e = 0; e < ep; ++e) {
      for (int p = 0; p < pp; ++p) {
        for (int t = 1; t < tp; ++t) {
          RETURN_IF_ERROR(CompareNames(files[e][p].chunks[v], stage_name(0, e, p, v),
                                       files[t * ep + e][p].chunks[v], stage_name(t, e, p, v),
                                       what));
        }
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
  bool has_experts = false;
  bool grouped_experts = false;  // TEGroupedMLP names (linear_fc1.weight<l>)
  for (int t = 0; t < tp; ++t) {
    std::vector<Catalog> ranks;
    std::vector<std::string> rank_labels;
    std::vector<std::string> labels;
    for (int e = 0; e < ep; ++e) {
      std::vector<RankFile>& stages = files[t * ep + e];
      std::vector<PipelineStage> stage_list;
      for (size_t v = 0; v < chunks; ++v) {
        for (int p = 0; p < pp; ++p) {
          stage_list.push_back({stage_name(t, e, p, v), std::move(stages[p].chunks[v])});
        }
      }
      std::vector<std::string> stage_labels;
      for (int p = 0; p < pp; ++p) stage_labels.push_back(stages[p].label);
      ASSIGN_OR_RETURN(Catalog merged, MergePipelineStages(std::move(stage_list), merge_options),
                       what);
      std::vector<std::string> notes = stages[0].notes;
      for (std::string& note : merged.other_entries) notes.push_back(std::move(note));
      merged.other_entries = std::move(notes);
      ranks.push_back(std::move(merged));
      rank_labels.push_back(absl::StrJoin(stage_labels, ", "));
      for (std::string& label : stage_labels) labels.push_back(std::move(label));
    }
    for (const Catalog& rank : ranks) {
      for (const CatalogTensor& tensor : rank.tensors) {
        if (ParseExpertTensorName(tensor.name).has_value()) {
          has_experts = true;
          grouped_experts |= !absl::StrContains(tensor.name, ".local_experts.");
        }
      }
    }
    Catalog merged;
    if (ep > 1 || has_experts) {
      ASSIGN_OR_RETURN(merged, MergeExpertRanks(std::move(ranks), rank_labels, num_experts, what));
    } else {
      merged = std::move(ranks[0]);
    }
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
  if (has_experts) {
    StructureNode grouped;
    grouped.kind = StructureNode::Kind::kBool;
    grouped.boolean = grouped_experts;
    state.values[kMegatronGroupedExpertsKey] = grouped;
  }
  std::string when = where.name;
  if (where.name != "release" && reference.facts.iteration.has_value()) {
    when = absl::StrCat("iteration ", *reference.facts.iteration);
  }
  std::string experts;
  if (ep > 1 || has_experts) {
    // Without args.num_experts: the experts of the first MoE layer.
    int64_t count = num_experts.value_or(0);
    if (!num_experts.has_value()) {
      std::string first_layer;
      for (const CatalogTensor& tensor : model.parts[0].tensors) {
        const std::optional<ExpertTensorName> name = ParseExpertTensorName(tensor.name);
        if (!name.has_value()) continue;
        if (first_layer.empty()) first_layer = name->experts;
        if (name->experts == first_layer) count = std::max<int64_t>(count, name->local + 1);
      }
    }
    experts = absl::StrCat(" x EP", ep, ", ", count, " experts");
  }
  model.description = absl::StrCat(Topology("Megatron-LM", tp, pp), experts,
                                   chunks > 1 ? absl::StrCat(" x ", chunks, " virtual stages") : "",
                                   ", ", layers, " layers", swiglu ? ", SwiGLU" : "", ", ", when);
  return model;
}

}  // namespace megatron_internal
}  // namespace reshard
