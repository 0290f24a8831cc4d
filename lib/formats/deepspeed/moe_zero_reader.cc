#include "lib/formats/deepspeed/moe_zero_reader.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/moe_experts.h"
#include "lib/formats/deepspeed/no_zero_reader.h"
#include "lib/formats/deepspeed/zero_catalog_builder.h"
#include "lib/formats/deepspeed/zero_layout.h"
#include "lib/formats/deepspeed/zero_locate.h"
#include "lib/formats/deepspeed/zero_pickle.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace zero_internal {
namespace {

// One entry of a rank's param_slice_mappings[g]: `numel` elements of param `name` (as the rank
// names it) from element `start` of the rank's partition.
struct Fragment {
  std::string name;
  int64_t start = 0;
  int64_t numel = 0;
};

// What one rank's optimizer file holds of one param group.
struct RankGroup {
  FlatTensor fp32;
  FlatTensor exp_avg;  // with include_optimizer only
  FlatTensor exp_avg_sq;
  std::optional<int64_t> padding;  // group_paddings[g], when recorded
  std::vector<Fragment> fragments;  // by start
};

const std::vector<std::pair<PickleValue*, PickleValue*>> kNoEntries;

struct RankFile {
  std::string name;
  std::string path;
  int stage = 0;
  std::vector<int64_t> counts;  // partition_count
  std::vector<RankGroup> groups;
};

// Elements [offset, offset + count) of rank `rank`'s partition of group `group`, which are
// elements [begin, begin + count) of a param.
struct Run {
  int rank = 0;
  int group = 0;
  int64_t offset = 0;
  int64_t count = 0;
  int64_t begin = 0;
};

// A param as the mappings give it, under its global name.
struct MappedParam {
  std::vector<Run> runs;
  int64_t numel = 0;
};

class MoeZeroReader {
 public:
  MoeZeroReader(const std::string& dir, const std::string& tag, const ZeroFolderFiles& files,
                const ReadOptions& options)
      : dir_(dir), tag_(tag), files_(files), options_(options), builder_(dir) {}

  absl::StatusOr<InputModel> Read() {
    // Names, shapes and order: the 16-bit model states and expert files, read as DeepSpeed
    // without ZeRO reads them, one part per model-parallel rank.
    ZeroFolderFiles weights = files_;
    weights.any_optimizer_file = false;
    ReadOptions weight_options = options_;
    weight_options.include_optimizer = false;
    ASSIGN_OR_RETURN(InputModel model, ReadWithoutOptimizerFiles(dir_, tag_, weights,
                                                                 weight_options));
    parts_ = static_cast<int>(model.parts.size());
    for (const auto& [parsed, name] : files_.moe_files) {
      if (parsed.kind == MoeFileName::Kind::kExpertOptimizer) ep_ = std::max(ep_, parsed.ep + 1);
    }
    for (const auto& [mp, ranks] : files_.mp_optimizer_files) {
      if (mp >= parts_) {
        return absl::DataLossError(absl::StrCat(
            dir_, ": ", ranks.begin()->second, " is of model-parallel rank ", mp,
            ", but the folder holds ", parts_, " mp_rank_XX_model_states.pt file",
            parts_ == 1 ? "" : "s", " (files of two saves mixed?)"));
      }
    }
    size_t tensors = 0;
    for (mp_ = 0; mp_ < parts_; ++mp_) {
      // The optimizer files join the catalog's files after the model states and expert files.
      builder_ = ZeroCatalogBuilder(dir_);
      builder_.catalog() = std::move(model.parts[mp_]);
      ranks_.clear();
      mapped_.clear();
      experts_.clear();
      modules_.clear();
      RETURN_IF_ERROR(ReadRankFiles());
      RETURN_IF_ERROR(CountExperts());
      for (int g = 0; g < static_cast<int>(counts_.size()); ++g) RETURN_IF_ERROR(MapGroup(g));
      RETURN_IF_ERROR(Rebuild());
      Catalog& catalog = builder_.catalog();
      catalog.format = kZeroFormatId;
      catalog.Reindex();
      tensors = catalog.tensors.size() - moments_;
      model.parts[mp_] = std::move(catalog);
    }
    mp_ = parts_ == 1 ? 0 : -1;  // names in the description: every mp rank's
    model.description = Description(tensors);
    if (parts_ == 1) {
      model.arrangement = "sharded";
      model.part_names = {dir_};
    }
    if (options_.include_optimizer) {
      model.training_state.problem = absl::UnimplementedError(absl::StrCat(
          dir_, ": the training state of a DeepSpeed mixture-of-experts ZeRO save (per-group "
                "steps, optimizer settings) is not carried; its weights and Adam moments are"));
    }
    return model;
  }

 private:
  // "00", "{00..01}" (mp_ -1: every model-parallel rank).
  std::string MpRank() const {
    if (mp_ < 0) return absl::StrCat("{00..", parts_ <= 10 ? "0" : "", parts_ - 1, "}");
    return absl::StrCat(mp_ < 10 ? "0" : "", mp_);
  }
  std::string OptimizerName(int rank) const {
    return absl::StrCat(files_.prefix, "zero_pp_rank_", rank, "_mp_rank_", MpRank(),
                        "_optim_states.pt");
  }
  // "bf16_zero_pp_rank_{0..3}_mp_rank_00_optim_states.pt".
  std::string AllOptimizerNames() const {
    return absl::StrCat(files_.prefix, "zero_pp_rank_{0..", world_ - 1, "}_mp_rank_", MpRank(),
                        "_optim_states.pt");
  }
  // This model-parallel rank's optimizer files: data-parallel rank -> file name.
  const std::map<int, std::string>& OptimizerFiles() const {
    static const std::map<int, std::string>* const kNone = new std::map<int, std::string>();
    auto it = files_.mp_optimizer_files.find(mp_);
    return it == files_.mp_optimizer_files.end() ? *kNone : it->second;
  }

  absl::StatusOr<RankFile> ReadRankFile(const TorchArchive& archive, int rank) {
    RankFile file;
    file.name = OptimizerName(rank);
    file.path = archive.path();
    const PickleValue* state = PickleField(archive.root(), "optimizer_state_dict");
    if (PickleEntries(state) == nullptr) {
      return Corrupt(archive,
                     "no optimizer_state_dict dict: not a DeepSpeed ZeRO optimizer-states file");
    }
    std::optional<int64_t> stage = ZeroStage(PickleField(state, "zero_stage"));
    if (stage.value_or(1) == 3) {
      return absl::DataLossError(absl::StrCat(
          archive.path(), ": a ZeRO-3 optimizer file beside the expert files of a DeepSpeed "
                          "mixture-of-experts save: DeepSpeed does not run MoE with ZeRO-3 "
                          "(\"MoE not supported with Stage 3\"), so the files are of two saves"));
    }
    if (stage.has_value() && (*stage < 1 || *stage > 2)) {
      return Corrupt(archive, absl::StrCat("zero_stage is ", *stage, "; expected 1 or 2"));
    }
    file.stage = static_cast<int>(stage.value_or(1));
    const auto* counts = PickleItems(PickleField(state, "partition_count"));
    if (counts == nullptr || counts->empty()) {
      return Corrupt(archive, absl::StrCat("partition_count is ",
                                           DescribePickleValue(PickleField(state, "partition_count")),
                                           "; expected a list of ints, one per param group"));
    }
    for (const PickleValue* item : *counts) {
      const int64_t count = PickleInt(item).value_or(0);
      if (count < 1 || count > kZeroMaxWorld) {
        return Corrupt(archive, absl::StrCat("partition_count holds ", DescribePickleValue(item),
                                             "; expected 1 to ", kZeroMaxWorld));
      }
      file.counts.push_back(count);
    }
    const auto* flats = PickleItems(PickleField(state, "single_partition_of_fp32_groups"));
    const auto* mappings = PickleItems(PickleField(state, "param_slice_mappings"));
    const auto* paddings = PickleItems(PickleField(state, "group_paddings"));
    const size_t groups = file.counts.size();
    if (flats == nullptr || flats->size() != groups || mappings == nullptr ||
        mappings->size() != groups) {
      return Corrupt(archive, absl::StrCat("partition_count lists ", groups,
                                           " param groups, but single_partition_of_fp32_groups "
                                           "and param_slice_mappings are ",
                                           DescribePickleValue(PickleField(
                                               state, "single_partition_of_fp32_groups")),
                                           " and ",
                                           DescribePickleValue(PickleField(
                                               state, "param_slice_mappings"))));
    }
    const PickleValue* base = PickleField(state, "base_optimizer_state");
    for (size_t g = 0; g < groups; ++g) {
      RankGroup group;
      ASSIGN_OR_RETURN(group.fp32,
                       builder_.Flat(archive, (*flats)[g],
                                     absl::StrCat("single_partition_of_fp32_groups[", g, "]")));
      if (paddings != nullptr && g < paddings->size()) group.padding = PickleInt((*paddings)[g]);
      const auto* entries = PickleEntries((*mappings)[g]);
      if (entries == nullptr && (*mappings)[g]->kind != PickleValue::Kind::kDict) {
        return Corrupt(archive, absl::StrCat("param_slice_mappings[", g, "] is ",
                                             DescribePickleValue((*mappings)[g]),
                                             "; expected a dict of fragment_address"));
      }
      for (const auto& [key, value] : entries != nullptr ? *entries : kNoEntries) {
        std::optional<std::string> name = PickleString(key);
        std::optional<int64_t> start = PickleInt(PickleField(value, "start"));
        std::optional<int64_t> numel = PickleInt(PickleField(value, "numel"));
        if (!name.has_value() || !start.has_value() || !numel.has_value() || *start < 0 ||
            *numel < 1 || *start > group.fp32.numel || *numel > group.fp32.numel - *start) {
          return Corrupt(archive,
                         absl::StrCat("param_slice_mappings[", g, "] maps ",
                                      DescribePickleValue(key), " to ", DescribePickleValue(value),
                                      "; expected a fragment_address(numel, start) inside the ",
                                      group.fp32.numel, " elements of "
                                      "single_partition_of_fp32_groups[", g, "]"));
        }
        group.fragments.push_back(Fragment{*name, *start, *numel});
      }
      std::stable_sort(group.fragments.begin(), group.fragments.end(),
                       [](const Fragment& a, const Fragment& b) { return a.start < b.start; });
      if (options_.include_optimizer) {
        const std::string what = absl::StrCat("optimizer_state_dict.base_optimizer_state.state[",
                                              g, "]");
        const PickleValue* entry = IntKeyField(PickleField(base, "state"), g);
        if (entry == nullptr || PickleField(entry, "exp_avg") == nullptr ||
            PickleField(entry, "exp_avg_sq") == nullptr) {
          return absl::FailedPreconditionError(absl::StrCat(
              archive.path(), ": --include-optimizer: no Adam moments (exp_avg, exp_avg_sq) in ",
              what, "; the optimizer is not Adam, or it never stepped"));
        }
        ASSIGN_OR_RETURN(group.exp_avg, builder_.Flat(archive, PickleField(entry, "exp_avg"),
                                                      absl::StrCat(what, ".exp_avg")));
        ASSIGN_OR_RETURN(group.exp_avg_sq,
                         builder_.Flat(archive, PickleField(entry, "exp_avg_sq"),
                                       absl::StrCat(what, ".exp_avg_sq")));
      }
      file.groups.push_back(std::move(group));
    }
    return file;
  }

  // Every rank's optimizer file, 0..W-1 (W: the dense groups' partition count), of one save.
  absl::Status ReadRankFiles() {
    const std::map<int, std::string>& optimizer_files = OptimizerFiles();
    auto first = optimizer_files.find(0);
    if (first == optimizer_files.end()) {
      return absl::DataLossError(absl::StrCat(
          dir_, ": rank 0's optimizer file (", OptimizerName(0),
          ") is missing; it gives the world size and param groups. ", kPartialSaveHint));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive,
                     TorchArchive::Open(JoinPath(dir_, first->second)));
    ASSIGN_OR_RETURN(RankFile rank0, ReadRankFile(*archive, 0));
    const PickleValue* config = PickleField(archive->root(), "ds_config");
    data_before_expert_ =
        PickleInt(PickleField(config, "use_data_before_expert_parallelism")).value_or(0) != 0;
    if (data_before_expert_ && parts_ > 1) {
      // groups._get_expert_parallel_ranks orders that topology's data-parallel ranks otherwise
      // than the ZeRO files number them.
      return absl::UnimplementedError(absl::StrCat(
          archive->path(), ": use_data_before_expert_parallelism with ", parts_,
          " model-parallel ranks; reshard reads that placement at TP 1 only"));
    }
    archive.reset();
    counts_ = rank0.counts;
    world_ = static_cast<int>(*std::max_element(counts_.begin(), counts_.end()));
    stage_ = rank0.stage;
    for (int rank = 0; rank < world_; ++rank) {
      if (optimizer_files.count(rank) == 0) {
        return absl::DataLossError(absl::StrCat(
            dir_, ": DeepSpeed MoE with ZeRO-", stage_, ", ", world_, " ranks (partition_count of ",
            first->second, "): rank ", rank, "'s optimizer file (", OptimizerName(rank),
            ") is missing. ", kPartialSaveHint));
      }
    }
    if (const auto& [rank, name] = *optimizer_files.rbegin(); rank >= world_) {
      return absl::DataLossError(absl::StrCat(
          dir_, ": ", name, " is beyond the ", world_, " ranks of partition_count [",
          absl::StrJoin(counts_, ", "), "] in ", first->second, " (files of two saves mixed?)"));
    }
    ranks_.push_back(std::move(rank0));
    std::vector<std::string> paths;
    for (int rank = 1; rank < world_; ++rank) {
      paths.push_back(JoinPath(dir_, optimizer_files.at(rank)));
    }
    return OpenArchivesInOrder(paths, [&](int i, const TorchArchive& optim) -> absl::Status {
      ASSIGN_OR_RETURN(RankFile file, ReadRankFile(optim, i + 1));
      if (file.counts != counts_ || file.stage != stage_) {
        return absl::DataLossError(absl::StrCat(
            optim.path(), ": ZeRO-", file.stage, " with partition_count [",
            absl::StrJoin(file.counts, ", "), "], but ", ranks_[0].name, " has ZeRO-", stage_,
            " with [", absl::StrJoin(counts_, ", "), "] (files of two saves mixed)"));
      }
      ranks_.push_back(std::move(file));
      return absl::OkStatus();
    });
  }

  // Per MoE module, its experts, from the expert files' global ids.
  absl::Status CountExperts() {
    for (const CatalogTensor& tensor : builder_.catalog().tensors) {
      if (std::optional<ExpertKey> key = ParseExpertKey(tensor.name); key.has_value()) {
        auto [it, inserted] = experts_.try_emplace(key->module, 0);
        if (inserted) modules_.push_back(key->module);
        it->second = std::max<int64_t>(it->second, key->id + 1);
      }
    }
    return absl::OkStatus();
  }

  // The global name of `fragment` of expert-parallel rank `ep_rank` at EP `ep` in group `g`.
  absl::StatusOr<std::string> GlobalName(const RankFile& file, int g, const Fragment& fragment,
                                         int ep, int ep_rank) const {
    std::optional<ExpertKey> key = ParseExpertKey(fragment.name);
    if (!key.has_value()) return fragment.name;
    auto it = experts_.find(key->module);
    if (it == experts_.end()) {
      return absl::DataLossError(absl::StrCat(
          file.path, ": param_slice_mappings[", g, "] names \"", fragment.name,
          "\", an expert of module ", key->module,
          ", which no layer_{m}_expert_{g}_mp_rank_", MpRank(),
          "_model_states.pt holds (two saves mixed?)"));
    }
    const int64_t local = it->second / ep;
    if (it->second % ep != 0 || key->id >= local) {
      return absl::DataLossError(absl::StrCat(
          file.path, ": param_slice_mappings[", g, "] names \"", fragment.name, "\": local expert ",
          key->id, " of ", key->module, ", whose ", it->second, " experts over EP ", ep, " give ",
          it->second % ep != 0 ? "no equal share" : absl::StrCat(local, " per rank"),
          " (two saves mixed?)"));
    }
    return key->WithId(ep_rank * local + key->id);
  }

  // Group `g`'s params out of its partitions: for each expert-parallel rank, the ranks of its
  // expert-data-parallel group in partition order, each rank's fragments tiling its partition.
  absl::Status MapGroup(int g) {
    const int64_t count = counts_[g];
    const RankFile& first = ranks_[0];
    if (world_ % count != 0) {
      return absl::DataLossError(absl::StrCat(
          first.path, ": param group ", g, " is partitioned over ", count,
          " ranks (partition_count [", absl::StrJoin(counts_, ", "), "]), which does not divide the ",
          world_, " ranks of the dense groups"));
    }
    const int ep = static_cast<int>(world_ / count);
    bool experts = false;
    for (const RankFile& file : ranks_) {
      for (const Fragment& fragment : file.groups[g].fragments) {
        if (ParseExpertKey(fragment.name).has_value()) experts = true;
      }
    }
    if (experts && ep_ > 0 && ep != ep_) {
      return absl::DataLossError(absl::StrCat(
          first.path, ": param group ", g, " holds experts and is partitioned over ", count,
          " ranks, but ", world_, " ranks at EP ", ep_, " (expp_rank_0..", ep_ - 1,
          ") give expert groups of ", world_ / ep_, " (files of two saves mixed?)"));
    }
    if (!experts && ep != 1) {
      return absl::DataLossError(absl::StrCat(
          first.path, ": param group ", g, " holds no expert and is partitioned over ", count,
          " of the ", world_, " ranks; DeepSpeed partitions dense groups over every rank"));
    }
    if (experts) ep_groups_ = ep;
    for (int ep_rank = 0; ep_rank < ep; ++ep_rank) {
      std::string last;
      int64_t done = 0;  // elements of `last` so far
      for (int64_t index = 0; index < count; ++index) {
        const int rank = data_before_expert_ ? static_cast<int>(ep_rank * count + index)
                                             : static_cast<int>(index * ep + ep_rank);
        const RankFile& file = ranks_[rank];
        const RankGroup& group = file.groups[g];
        int64_t end = 0;
        for (const Fragment& fragment : group.fragments) {
          if (fragment.start != end) {
            return absl::DataLossError(absl::StrCat(
                file.path, ": param_slice_mappings[", g, "][\"", fragment.name, "\"] starts at ",
                fragment.start, ", but the fragments before it end at ", end,
                ": the fragments do not tile single_partition_of_fp32_groups[", g, "]"));
          }
          end += fragment.numel;
          ASSIGN_OR_RETURN(std::string name, GlobalName(file, g, fragment, ep, ep_rank));
          auto [it, inserted] = mapped_.try_emplace(name);
          if (!inserted && name != last) {
            const Run& before = it->second.runs.front();
            return absl::DataLossError(absl::StrCat(
                file.path, ": param_slice_mappings[", g, "] holds \"", name, "\" (as \"",
                fragment.name, "\"), which param_slice_mappings[", before.group, "] of ",
                ranks_[before.rank].name, " holds too (files of two saves mixed?)"));
          }
          if (inserted) done = 0;
          it->second.runs.push_back(Run{rank, g, fragment.start, fragment.numel, done});
          it->second.numel += fragment.numel;
          done += fragment.numel;
          last = name;
        }
        const int64_t padding = group.padding.value_or(0);
        if (end != group.fp32.numel && end != group.fp32.numel - padding) {
          return absl::DataLossError(absl::StrCat(
              file.path, ": single_partition_of_fp32_groups[", g, "] holds ", group.fp32.numel,
              " elements, but the fragments of param_slice_mappings[", g, "] cover ", end,
              ": they do not tile the rank's partition"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status AddRuns(CatalogTensor& tensor, const MappedParam& param,
                       FlatTensor RankGroup::*member, const char* what) const {
    for (const Run& run : param.runs) {
      const FlatTensor& flat = ranks_[run.rank].groups[run.group].*member;
      if (run.offset + run.count > flat.numel) {
        return absl::DataLossError(absl::StrCat(
            ranks_[run.rank].path, ": \"", tensor.name, "\" needs elements [", run.offset, ", ",
            run.offset + run.count, ") of ", what, " of group ", run.group, ", which has ",
            flat.numel));
      }
      AddFlatRangePieces(tensor, flat.file,
                         flat.byte_offset + static_cast<uint64_t>(run.offset) * sizeof(float),
                         run.begin, run.begin + run.count);
    }
    return absl::OkStatus();
  }

  // The 16-bit tensors replaced by their fp32 master weights; moments appended.
  absl::Status Rebuild() {
    std::vector<CatalogTensor>& tensors = builder_.catalog().tensors;
    std::vector<CatalogTensor> moments;
    size_t found = 0;
    for (CatalogTensor& tensor : tensors) {
      auto it = mapped_.find(tensor.name);
      if (it == mapped_.end()) {
        if (std::optional<ExpertKey> key = ParseExpertKey(tensor.name); key.has_value()) {
          return absl::DataLossError(absl::StrCat(
              dir_, ": \"", tensor.name, "\" (expert ", key->id, " of ", key->module,
              ") is in no param_slice_mappings of ", AllOptimizerNames(),
              ": its fp32 weights are not in the save (files of two saves mixed?)"));
        }
        continue;  // a buffer or a frozen param: not in the optimizer, kept as saved
      }
      ++found;
      const MappedParam& param = it->second;
      ASSIGN_OR_RETURN(const int64_t numel, NumElements(tensor.shape));
      if (param.numel != numel) {
        return absl::DataLossError(absl::StrCat(
            ranks_[param.runs.front().rank].path, ": the fragments of \"", tensor.name,
            "\" in param_slice_mappings[", param.runs.front().group, "] of ",
            AllOptimizerNames(), " hold ", param.numel, " elements, but it is ",
            ShapeToString(tensor.shape), " (", numel,
            ") in the model states: the slices do not tile the param"));
      }
      tensor.dtype = DType::kF32;
      tensor.pieces.clear();
      RETURN_IF_ERROR(AddRuns(tensor, param, &RankGroup::fp32, "single_partition_of_fp32_groups"));
      if (!options_.include_optimizer) continue;
      for (auto [suffix, member] : {std::make_pair(".exp_avg", &RankGroup::exp_avg),
                                    std::make_pair(".exp_avg_sq", &RankGroup::exp_avg_sq)}) {
        CatalogTensor moment{absl::StrCat(tensor.name, suffix), DType::kF32, tensor.shape, {}};
        RETURN_IF_ERROR(AddRuns(moment, param, member, "base_optimizer_state"));
        moments.push_back(std::move(moment));
      }
    }
    if (found != mapped_.size()) {
      for (const auto& [name, param] : mapped_) {
        if (builder_.catalog().Find(name) >= 0) continue;
        return absl::DataLossError(absl::StrCat(
            ranks_[param.runs.front().rank].path, ": param_slice_mappings[",
            param.runs.front().group, "] holds \"", name,
            "\", which neither mp_rank_", MpRank(),
            "_model_states.pt nor an expert file holds (files of two saves mixed?)"));
      }
    }
    moments_ = moments.size();
    for (CatalogTensor& moment : moments) tensors.push_back(std::move(moment));
    return absl::OkStatus();
  }

  // "DeepSpeed MoE with ZeRO-2, 2 MoE layers x 8 experts, EP 2, TP 1, PP 1, world size 4 (4
  // data-parallel ranks x TP 1): fp32 master weights from ... (expert groups over 2 ranks each;
  // rank r is expert-parallel rank r % 2, ...)". DeepSpeed's MoE saves have no pipeline stages.
  std::string Description(size_t tensors) const {
    int64_t most = 0;
    std::vector<int64_t> counts;
    for (const std::string& module : modules_) {
      counts.push_back(experts_.at(module));
      most = std::max(most, counts.back());
    }
    const bool same = std::all_of(counts.begin(), counts.end(),
                                  [&](int64_t n) { return n == most; });
    const int layers = static_cast<int>(modules_.size());
    const int ep = ep_groups_;
    const int64_t edp = world_ / ep;
    const std::string placement =
        data_before_expert_
            ? absl::StrCat("rank r is expert-parallel rank r / ", edp,
                           ", use_data_before_expert_parallelism")
            : absl::StrCat("rank r is expert-parallel rank r % ", ep,
                           ", DeepSpeed's default expert-then-data placement");
    return absl::StrCat(
        "DeepSpeed MoE with ZeRO-", stage_, ", ", layers, " MoE layer", layers == 1 ? "" : "s",
        " x ",
        same ? absl::StrCat(most, " experts")
             : absl::StrCat("{", absl::StrJoin(counts, ", "), "} experts"),
        ", EP ", ep, ", TP ", parts_, ", PP 1, world size ", world_ * parts_, " (", world_,
        " data-parallel ranks x TP ", parts_, "): fp32 master weights from ", AllOptimizerNames(),
        " (expert groups over ", edp, edp == 1 ? " rank" : " ranks", " each; ", placement,
        "), names and shapes from mp_rank_", MpRank(), "_model_states.pt and layer_",
        layers == 1 ? std::string("0") : absl::StrCat("{0..", layers - 1, "}"), "_expert_",
        most == 1 ? std::string("0") : absl::StrCat("{0..", most - 1, "}"), "_mp_rank_", MpRank(),
        "_model_states.pt, tag ", tag_, ", ", tensors, parts_ == 1 ? " tensors" : " tensors each");
  }

  const std::string& dir_;
  const std::string& tag_;
  const ZeroFolderFiles& files_;
  const ReadOptions& options_;
  ZeroCatalogBuilder builder_;
  int ep_ = 0;            // expp_rank files; 0 when none
  int parts_ = 1;         // model-parallel ranks
  int mp_ = 0;            // the one read
  int ep_groups_ = 1;     // the expert groups' EP, from their partition count
  int world_ = 0;
  int stage_ = 0;
  bool data_before_expert_ = false;
  std::vector<int64_t> counts_;                // partition_count
  std::vector<RankFile> ranks_;                // by rank
  std::map<std::string, int64_t> experts_;     // MoE module -> experts
  std::vector<std::string> modules_;           // MoE modules, in model order
  std::map<std::string, MappedParam> mapped_;  // global name -> where its fp32 weights are
  size_t moments_ = 0;
};

}  // namespace

absl::StatusOr<InputModel> ReadMoeZeroCheckpoint(const std::string& dir, const std::string& tag,
                                                 const ZeroFolderFiles& files,
                                                 const ReadOptions& options) {
  return MoeZeroReader(dir, tag, files, options).Read();
}

}  // namespace zero_internal
}  // namespace reshard
