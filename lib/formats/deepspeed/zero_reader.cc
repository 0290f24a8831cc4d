#include "lib/formats/deepspeed/zero_reader.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/zero_catalog_builder.h"
#include "lib/formats/deepspeed/zero_layout.h"
#include "lib/formats/deepspeed/zero_locate.h"
#include "lib/formats/deepspeed/zero_pickle.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_structure.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace zero_internal {
namespace {

using Kind = PickleValue::Kind;

class ZeroReader {
 public:
  ZeroReader(std::string dir, std::string tag, ZeroFolderFiles files, const ReadOptions& options)
      : dir_(std::move(dir)),
        tag_(std::move(tag)),
        options_(options),
        files_(std::move(files)),
        builder_(dir_) {}

  absl::StatusOr<InputModel> Read() {
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> optim0, OpenOptimizer(0));
    RETURN_IF_ERROR(ReadStage(*optim0));
    RETURN_IF_ERROR(CheckRankFiles());
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> model0, OpenArchive(ModelName(0)));
    RETURN_IF_ERROR(ReadParamShapes(*model0));
    RETURN_IF_ERROR(ReadSharedParams(*model0));

    // Every rank's flat groups; an archive is dropped once its tensors are located.
    flats_.resize(world_);
    ASSIGN_OR_RETURN(flats_[0], ReadRankFlats(*optim0));
    if (options_.include_optimizer) {
      // Only output formats that resume training need it: a failure is theirs to report.
      absl::Status state = ReadTrainingState(*optim0, *model0);
      if (!state.ok()) {
        training_state_ = TrainingState();
        training_state_.problem = std::move(state);
      }
    }
    optim0.reset();
    // CheckRankFiles found every rank's optimizer file.
    RETURN_IF_ERROR(ReadRankArchives(
        [this](int rank) { return files_.optimizer_files.at(rank); },
        [this](int rank, const TorchArchive& optim) -> absl::Status {
          RETURN_IF_ERROR(CheckSameRun(optim, rank));
          ASSIGN_OR_RETURN(flats_[rank], ReadRankFlats(optim));
          return absl::OkStatus();
        }));

    std::vector<CatalogTensor> buffers, frozen, trainable, moments;
    ASSIGN_OR_RETURN(buffers, ReadBuffers(*model0));
    ASSIGN_OR_RETURN(frozen, ReadFrozen(*model0));
    const ZeroFlats located = Flats();
    if (stage_ == 3) {
      ASSIGN_OR_RETURN(trainable, LocateZero3(located, moments));
    } else {
      ASSIGN_OR_RETURN(trainable, LocateZero12(located, moments));
    }
    const size_t buffer_count = buffers.size();
    const size_t frozen_count = frozen.size();
    const size_t trainable_count = trainable.size();
    for (auto* part : {&buffers, &frozen, &trainable}) {
      for (CatalogTensor& tensor : *part) RETURN_IF_ERROR(builder_.Add(std::move(tensor)));
    }
    RETURN_IF_ERROR(AddAliases());
    for (CatalogTensor& tensor : moments) RETURN_IF_ERROR(builder_.Add(std::move(tensor)));
    builder_.catalog().format = kZeroFormatId;
    builder_.catalog().Reindex();

    InputModel model;
    model.format = kZeroFormatId;
    model.arrangement = "sharded";
    model.description = Description(buffer_count, frozen_count, trainable_count);
    model.parts.push_back(std::move(builder_.catalog()));
    model.part_names.push_back(dir_);
    model.training_state = std::move(training_state_);
    return model;
  }

 private:
  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }

  TrainingState training_state_;

  std::string OptimizerName(int rank) const {
    return absl::StrCat(files_.prefix, "zero_pp_rank_", rank, "_mp_rank_", MpRank(),
                        "_optim_states.pt");
  }
  std::string ModelName(int rank) const {
    return stage_ == 3
               ? absl::StrCat("zero_pp_rank_", rank, "_mp_rank_", MpRank(), "_model_states.pt")
               : absl::StrCat("mp_rank_", MpRank(), "_model_states.pt");
  }
  // "00", "07": the model-parallel rank as the file names write it.
  std::string MpRank() const {
    return files_.mp_rank < 10 ? absl::StrCat("0", files_.mp_rank) : absl::StrCat(files_.mp_rank);
  }

  // What LocateZero12 / LocateZero3 need, once the files are read.
  ZeroFlats Flats() const {
    ZeroFlats in{world_, param_groups_, params_, flats_, options_.include_optimizer};
    for (int rank = 0; rank < world_; ++rank) {
      in.optimizer_paths.push_back(Path(files_.optimizer_files.at(rank)));
    }
    in.model_path = Path(ModelName(0));
    in.model_name = ModelName(0);
    in.optimizer0_name = OptimizerName(0);
    in.dir = dir_;
    in.setup = Setup();
    return in;
  }

  // "ZeRO-3 with 4 ranks", "BF16_Optimizer (ZeRO-1 layout) with 2 ranks".
  std::string Setup() const {
    return absl::StrCat(
        bf16_optimizer_ ? "BF16_Optimizer (ZeRO-1 layout)" : absl::StrCat("ZeRO-", stage_),
        " with ", world_, world_ == 1 ? " rank" : " ranks");
  }

  absl::StatusOr<std::unique_ptr<TorchArchive>> OpenArchive(const std::string& name) const {
    return TorchArchive::Open(Path(name));
  }

  // The archives of ranks 1..world-1 named by `name(rank)`, opened several at once (from S3
  // each costs its round trips) and handed to `take(rank, archive)` in rank order.
  absl::Status ReadRankArchives(absl::FunctionRef<std::string(int)> name,
                                absl::FunctionRef<absl::Status(int, const TorchArchive&)> take) {
    std::vector<std::string> paths;
    for (int rank = 1; rank < world_; ++rank) paths.push_back(Path(name(rank)));
    return OpenArchivesInOrder(
        paths, [&](int i, const TorchArchive& archive) { return take(i + 1, archive); });
  }

  absl::StatusOr<std::unique_ptr<TorchArchive>> OpenOptimizer(int rank) const {
    auto it = files_.optimizer_files.find(rank);
    if (it == files_.optimizer_files.end()) {
      // Only rank 0 can be missing here: CheckRankFiles has run for the others.
      std::vector<int> found;
      for (const auto& [r, name] : files_.optimizer_files) found.push_back(r);
      return absl::DataLossError(
          absl::StrCat(dir_, ": rank ", rank, "'s optimizer file (", OptimizerName(rank),
                       ") is missing; it gives the ZeRO stage and world size (found ranks ",
                       absl::StrJoin(found, ", "), "). ", kPartialSaveHint));
    }
    return OpenArchive(it->second);
  }

  static const PickleValue* OptimizerState(const TorchArchive& archive) {
    return PickleField(archive.root(), "optimizer_state_dict");
  }

  // What an optimizer file says about the run.
  struct RunInfo {
    int stage = 1;
    int world = 1;
    bool bf16_optimizer = false;  // BF16_Optimizer: no zero_stage
    int64_t group_counts = 0;     // entries of a list partition_count (0: an int)
  };

  absl::StatusOr<RunInfo> ReadRunInfo(const TorchArchive& archive) const {
    RunInfo info;
    const PickleValue* state = OptimizerState(archive);
    if (PickleEntries(state) == nullptr) {
      return Corrupt(archive,
                     "no optimizer_state_dict dict: not a DeepSpeed ZeRO optimizer-states file");
    }
    const PickleValue* stage_value = PickleField(state, "zero_stage");
    if (stage_value == nullptr) {
      // BF16_Optimizer writes no zero_stage; ds_to_universal reads it as stage 1.
      if (PickleField(state, "single_partition_of_fp32_groups") == nullptr) {
        return Corrupt(archive,
                       "optimizer_state_dict has neither zero_stage nor "
                       "single_partition_of_fp32_groups: not a ZeRO checkpoint");
      }
      info.bf16_optimizer = true;
    } else {
      std::optional<int64_t> value = ZeroStage(stage_value);
      if (!value.has_value()) {
        return Corrupt(archive,
                       absl::StrCat("optimizer_state_dict.zero_stage is ",
                                    DescribePickleValue(stage_value), ", not a ZeroStageEnum"));
      }
      if (*value == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(archive.path(),
                         ": zero_stage is 0 (ZeRO disabled) in a ZeRO optimizer file. Without "
                         "ZeRO the weights are the `module` of mp_rank_00_model_states.pt, which "
                         "reshard reads from a folder that holds no optimizer files"));
      }
      if (*value < 1 || *value > 3) {
        return Corrupt(archive, absl::StrCat("zero_stage is ", *value, "; expected 1, 2 or 3"));
      }
      info.stage = static_cast<int>(*value);
    }
    const PickleValue* count = PickleField(state, "partition_count");
    std::vector<int64_t> counts;
    if (std::optional<int64_t> single = PickleInt(count); single.has_value()) {
      counts.push_back(*single);
    } else if (const auto* items = PickleItems(count); items != nullptr && !items->empty()) {
      for (const PickleValue* item : *items) {
        counts.push_back(PickleInt(item).value_or(-1));
      }
    } else {
      return Corrupt(
          archive, absl::StrCat("optimizer_state_dict.partition_count is ",
                                DescribePickleValue(count), "; expected an int or a list of ints"));
    }
    const int64_t world = *std::max_element(counts.begin(), counts.end());
    for (int64_t c : counts) {
      if (c < 1 || c > kZeroMaxWorld) {
        return Corrupt(archive,
                       absl::StrCat("partition_count ", c, " is outside [1, ", kZeroMaxWorld, "]"));
      }
      if (c != world) {
        return absl::UnimplementedError(absl::StrCat(
            archive.path(), ": param groups are partitioned over different numbers of ranks (",
            "partition_count [", absl::StrJoin(counts, ", "),
            "]): MoE expert groups or MiCS are not supported"));
      }
    }
    if (PickleItems(count) != nullptr) info.group_counts = static_cast<int64_t>(counts.size());
    info.world = static_cast<int>(world);
    return info;
  }

  absl::Status ReadStage(const TorchArchive& optim0) {
    ASSIGN_OR_RETURN(RunInfo info, ReadRunInfo(optim0));
    stage_ = info.stage;
    world_ = info.world;
    bf16_optimizer_ = info.bf16_optimizer;
    group_partition_counts_ = info.group_counts;
    if (!IsNone(PickleField(OptimizerState(optim0), "ds_zero_partition_groups"))) {
      return absl::UnimplementedError(
          absl::StrCat(optim0.path(),
                       ": ZeRO-3 with partition groups (ds_zero_partition_groups, AutoEP "
                       "experts) is not supported"));
    }
    return absl::OkStatus();
  }

  // Rank `rank`'s optimizer file belongs to the same run as rank 0's.
  absl::Status CheckSameRun(const TorchArchive& archive, int rank) const {
    ASSIGN_OR_RETURN(RunInfo info, ReadRunInfo(archive));
    if (info.stage != stage_ || info.world != world_ || info.bf16_optimizer != bf16_optimizer_) {
      return Corrupt(archive, absl::StrCat("rank ", rank, "'s file says ",
                                           info.bf16_optimizer ? "BF16_Optimizer"
                                                               : absl::StrCat("ZeRO-", info.stage),
                                           " with ", info.world, " ranks, but rank 0's says ",
                                           Setup(), ": files of two runs mixed"));
    }
    return absl::OkStatus();
  }

  // Exactly ranks 0..W-1, with their model-states files.
  absl::Status CheckRankFiles() const {
    const std::string setup = Setup();
    const std::string count = absl::StrCat(files_.optimizer_files.size(), " optimizer file",
                                           files_.optimizer_files.size() == 1 ? "" : "s", " found");
    for (int rank = 0; rank < world_; ++rank) {
      if (files_.optimizer_files.count(rank) == 0) {
        return absl::DataLossError(absl::StrCat(dir_, ": ", setup, ": rank ", rank,
                                                "'s optimizer file (", OptimizerName(rank),
                                                ") is missing (", count, "). ", kPartialSaveHint));
      }
    }
    for (const auto& [rank, name] : files_.optimizer_files) {
      if (rank >= world_) {
        return absl::DataLossError(
            absl::StrCat(dir_, ": ", setup, " (partition_count of ", files_.optimizer_files.at(0),
                         ") but ", count, ": ", name,
                         " is beyond the world size. Files of two runs mixed, or a save with a "
                         "different world size over an old checkpoint"));
      }
    }
    if (stage_ == 3) {
      for (int rank = 0; rank < world_; ++rank) {
        if (files_.rank_model_files.count(rank) == 0) {
          return absl::DataLossError(absl::StrCat(dir_, ": ", setup, ": rank ", rank,
                                                  "'s model-states file (", ModelName(rank),
                                                  ") is missing. ", kPartialSaveHint));
        }
      }
      for (const auto& [rank, name] : files_.rank_model_files) {
        if (rank >= world_) {
          return absl::DataLossError(
              absl::StrCat(dir_, ": ", setup, " but ", name, " is beyond the world size"));
        }
      }
    } else if (files_.model_files.count(files_.mp_rank) == 0) {
      return absl::DataLossError(absl::StrCat(dir_, ": ", setup, ": the model-states file (",
                                              ModelName(0), ") is missing. ", kPartialSaveHint));
    }
    return absl::OkStatus();
  }

  // param_shapes of rank 0's model states: the trainable params, in flat-buffer order.
  absl::Status ReadParamShapes(const TorchArchive& model) {
    if (PickleField(model.root(), "buffer_names") == nullptr) {
      return Corrupt(model, "no buffer_names: not a DeepSpeed model-states file");
    }
    const PickleValue* shapes = PickleField(model.root(), "param_shapes");
    const auto* groups = PickleItems(shapes);
    if (groups == nullptr) {
      return Corrupt(model, absl::StrCat("param_shapes is ", DescribePickleValue(shapes),
                                         "; a ZeRO checkpoint has a list of dicts there"));
    }
    absl::flat_hash_set<std::string> seen;
    for (size_t g = 0; g < groups->size(); ++g) {
      const auto* entries = PickleEntries((*groups)[g]);
      if (entries == nullptr) {
        if ((*groups)[g]->kind == Kind::kDict) continue;  // an empty group
        return Corrupt(model, absl::StrCat("param_shapes[", g, "] is ",
                                           DescribePickleValue((*groups)[g]), ", not a dict"));
      }
      for (const auto& [key, value] : *entries) {
        std::optional<std::string> name = PickleString(key);
        if (!name.has_value() || name->empty()) {
          return Corrupt(model, absl::StrCat("param_shapes[", g, "] has a key that is ",
                                             DescribePickleValue(key), ", not a name"));
        }
        std::optional<Shape> shape = PickleShape(value);
        if (!shape.has_value()) {
          return Corrupt(model, absl::StrCat("param_shapes[", g, "][\"", *name, "\"] is ",
                                             DescribePickleValue(value), ", not a torch.Size"));
        }
        auto numel = NumElements(*shape);
        if (!numel.ok() || *numel > kZeroMaxElements) {
          return Corrupt(model, absl::StrCat("param_shapes[", g, "][\"", *name,
                                             "\"] = ", ShapeToString(*shape), " is too large"));
        }
        if (!seen.insert(*name).second) {
          return Corrupt(model,
                         absl::StrCat("param \"", *name, "\" is listed twice in param_shapes"));
        }
        if (static_cast<int64_t>(params_.size()) >= kZeroMaxParams) {
          return Corrupt(model,
                         absl::StrCat("param_shapes lists more than ", kZeroMaxParams, " params"));
        }
        params_.push_back(ParamInfo{*name, *std::move(shape), *numel, static_cast<int>(g)});
      }
    }
    param_groups_ = static_cast<int>(groups->size());
    if (stage_ != 3 && group_partition_counts_ > 0 && group_partition_counts_ != param_groups_) {
      return Corrupt(
          model,
          absl::StrCat("param_shapes has ", param_groups_, " param groups, but partition_count of ",
                       files_.optimizer_files.at(0), " lists ", group_partition_counts_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<FlatTensor> Flat(const TorchArchive& archive, const PickleValue* value,
                                  const std::string& what) {
    return builder_.Flat(archive, value, what);
  }

  // The optimizer state (a dict holding exp_avg, exp_avg_sq) of flat group `group`.
  absl::StatusOr<const PickleValue*> MomentState(const TorchArchive& archive, int group,
                                                 std::string& what) const {
    const PickleValue* state = OptimizerState(archive);
    const PickleValue* entry = nullptr;
    if (stage_ == 3) {
      what = absl::StrCat("optimizer_state_dict.optimizer_state_dict.state[", group, "]");
      entry = IntKeyField(PickleField(PickleField(state, "optimizer_state_dict"), "state"), group);
    } else {
      const PickleValue* base = PickleField(state, "base_optimizer_state");
      if (const auto* items = PickleItems(base); items != nullptr) {
        // The legacy elastic layout: one state dict per group.
        what = absl::StrCat("optimizer_state_dict.base_optimizer_state[", group, "]");
        if (group < static_cast<int>(items->size())) entry = (*items)[group];
      } else {
        what = absl::StrCat("optimizer_state_dict.base_optimizer_state.state[", group, "]");
        entry = IntKeyField(PickleField(base, "state"), group);
      }
    }
    if (entry == nullptr || PickleField(entry, "exp_avg") == nullptr ||
        PickleField(entry, "exp_avg_sq") == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat(archive.path(), ": --include-optimizer: no Adam moments (exp_avg, ",
                       "exp_avg_sq) in ", what, entry == nullptr ? " (missing)" : "",
                       "; the optimizer is not Adam, or it never stepped"));
    }
    return entry;
  }

  absl::StatusOr<RankFlats> ReadRankFlats(const TorchArchive& archive) {
    const PickleValue* state = OptimizerState(archive);
    const char* key = stage_ == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
    const PickleValue* groups = PickleField(state, key);
    const auto* items = PickleItems(groups);
    if (items == nullptr) {
      return Corrupt(archive, absl::StrCat("optimizer_state_dict.", key, " is ",
                                           DescribePickleValue(groups), "; expected a list"));
    }
    if (static_cast<int64_t>(items->size()) > kZeroMaxParams) {
      return Corrupt(archive, absl::StrCat(key, " has too many groups"));
    }
    const auto* paddings = PickleItems(PickleField(state, "group_paddings"));
    RankFlats flats;
    for (size_t g = 0; g < items->size(); ++g) {
      ASSIGN_OR_RETURN(
          FlatTensor flat,
          Flat(archive, (*items)[g], absl::StrCat("optimizer_state_dict.", key, "[", g, "]")));
      flats.fp32.push_back(flat);
      flats.paddings.push_back(
          paddings != nullptr && g < paddings->size() ? PickleInt((*paddings)[g]) : std::nullopt);
      if (!options_.include_optimizer) continue;
      std::string what;
      ASSIGN_OR_RETURN(const PickleValue* entry, MomentState(archive, static_cast<int>(g), what));
      ASSIGN_OR_RETURN(FlatTensor exp_avg, Flat(archive, PickleField(entry, "exp_avg"),
                                                absl::StrCat(what, ".exp_avg")));
      ASSIGN_OR_RETURN(FlatTensor exp_avg_sq, Flat(archive, PickleField(entry, "exp_avg_sq"),
                                                   absl::StrCat(what, ".exp_avg_sq")));
      flats.exp_avg.push_back(exp_avg);
      flats.exp_avg_sq.push_back(exp_avg_sq);
    }
    return flats;
  }

  // What a checkpoint to resume training from carries beside the weights and moments
  // (InputModel::training_state; the names are documented in zero_format.h): the model-states
  // files, each flat group's step, which group each trainable param is in.
  absl::Status ReadTrainingState(const TorchArchive& optim0, const TorchArchive& model0) {
    TrainingState& state = training_state_;
    state.values["deepspeed.zero_stage"] = StructureNode::Int(stage_);
    for (int rank = 0; rank < (stage_ == 3 ? world_ : 1); ++rank) {
      state.verbatim_files.push_back(Path(ModelName(rank)));
    }
    // Each flat group's (ZeRO-3: sub-group's) step: a tensor "deepspeed.step.<g>" in
    // state.tensors, or a number in state.values under that name.
    const int groups = stage_ == 3 ? static_cast<int>(flats_[0].fp32.size()) : param_groups_;
    std::map<int, StructureNode> steps;
    for (int g = 0; g < groups; ++g) {
      std::string what;
      ASSIGN_OR_RETURN(const PickleValue* entry, MomentState(optim0, g, what));
      const PickleValue* step = PickleField(entry, "step");
      if (step == nullptr) continue;
      const std::string name = absl::StrCat("deepspeed.step.", g);
      if (std::optional<int64_t> number = PickleInt(step); number.has_value()) {
        steps[g] = state.values[name] = StructureNode::Int(*number);
        continue;
      }
      if (step->kind == Kind::kFloat) {
        StructureNode value;
        value.kind = StructureNode::Kind::kFloat;
        value.real = step->real;
        steps[g] = state.values[name] = std::move(value);
        continue;
      }
      ASSIGN_OR_RETURN(std::optional<TensorLocation> location,
                       optim0.Tensor(step, absl::StrCat(what, ".step")));
      if (!location.has_value()) {
        return Corrupt(optim0, absl::StrCat(what, ".step is ", DescribePickleValue(step),
                                            ", not a number or tensor"));
      }
      if (state.files.empty()) state.files.push_back(optim0.Source());
      state.tensors.push_back(CatalogTensorAt(name, *location, 0));
      StructureNode leaf;
      leaf.kind = StructureNode::Kind::kTensor;
      leaf.text = name;
      steps[g] = std::move(leaf);
    }
    ASSIGN_OR_RETURN(state.values["deepspeed.optimizer_state"],
                     UnpartitionedOptimizerState(optim0, steps));
    if (const PickleValue* info = PickleField(model0.root(), "universal_checkpoint_info");
        info != nullptr && !IsNone(info)) {
      auto converted = PickleToStructure(info);
      if (!converted.ok()) {
        return Annotate(converted.status(),
                        absl::StrCat(model0.path(), ": universal_checkpoint_info"));
      }
      state.values["deepspeed.universal_checkpoint_info"] = *std::move(converted);
    }
    if (stage_ == 3) return absl::OkStatus();  // no step.pt: the step is in the optimizer state
    StructureNode param_group;
    param_group.kind = StructureNode::Kind::kDict;
    for (const ParamInfo& param : params_) {
      param_group.keys.push_back(StructureNode::String(param.name));
      param_group.values.push_back(StructureNode::Int(param.group));
    }
    state.values["deepspeed.param_group"] = std::move(param_group);
    return absl::OkStatus();
  }

  // Rank 0's `optimizer_state_dict` without what is partitioned across ranks, plus the param
  // groups at the top, as ds_to_universal writes zero/optimizer_state.pt: ZeRO-1/2 without
  // base_optimizer_state, single_partition_of_fp32_groups and param_slice_mappings; ZeRO-3
  // without fp32_flat_groups and the nested optimizer's per-rank `state` (upstream keeps rank
  // 0's partitions there; they are meaningless at another world size; each sub-group's `step`
  // is kept, from `steps`). Every other value (the
  // loss scaler object, zero_stage, partition_count, ...) is carried as saved.
  absl::StatusOr<StructureNode> UnpartitionedOptimizerState(
      const TorchArchive& optim0, const std::map<int, StructureNode>& steps) const {
    const PickleValue* saved = OptimizerState(optim0);
    if (saved == nullptr || saved->kind != Kind::kDict) {
      return Corrupt(optim0, "optimizer_state_dict is not a dict");
    }
    PickleStructureOptions options;
    options.replace = [](const PickleValue* value,
                         absl::string_view path) -> absl::StatusOr<std::optional<StructureNode>> {
      if (TorchArchive::IsTensor(value)) {
        return absl::UnimplementedError(
            "a tensor outside the partitioned state; reshard cannot carry it to "
            "zero/optimizer_state.pt");
      }
      return std::nullopt;
    };
    StructureNode result;
    result.kind = StructureNode::Kind::kDict;
    result.ordered = saved->ordered;
    const PickleValue* param_groups = nullptr;
    for (const auto& [key, value] : saved->entries) {
      const std::string name = key->kind == Kind::kString ? key->text : "";
      if (name == "base_optimizer_state") {
        param_groups = PickleField(value, "param_groups");
        continue;
      }
      if (name == "single_partition_of_fp32_groups" || name == "param_slice_mappings" ||
          name == "fp32_flat_groups") {
        continue;
      }
      StructureNode converted;
      if (name == "optimizer_state_dict") {  // ZeRO-3: the wrapped optimizer's own state dict
        param_groups = PickleField(value, "param_groups");
        converted.kind = StructureNode::Kind::kDict;
        // DeepSpeed's ZeRO-3 loader fills state[0] with the moments it slices from zero/ and
        // loads this state dict into the optimizer: each sub-group keeps its step.
        StructureNode sub_group_states;
        sub_group_states.kind = StructureNode::Kind::kDict;
        for (const auto& [group, step] : steps) {
          StructureNode entry;
          entry.kind = StructureNode::Kind::kDict;
          entry.keys.push_back(StructureNode::String("step"));
          entry.values.push_back(step);
          sub_group_states.keys.push_back(StructureNode::Int(group));
          sub_group_states.values.push_back(std::move(entry));
        }
        converted.keys.push_back(StructureNode::String("state"));
        converted.values.push_back(std::move(sub_group_states));
        if (param_groups != nullptr) {
          converted.keys.push_back(StructureNode::String("param_groups"));
          ASSIGN_OR_RETURN(StructureNode groups, PickleToStructure(param_groups, options),
                           absl::StrCat(optim0.path(), ": optimizer_state_dict.param_groups"));
          converted.values.push_back(std::move(groups));
        }
      } else {
        auto value_node = PickleToStructure(value, options);
        if (!value_node.ok()) {
          return Annotate(value_node.status(),
                          absl::StrCat(optim0.path(), ": optimizer_state_dict.", name));
        }
        converted = *std::move(value_node);
      }
      ASSIGN_OR_RETURN(StructureNode key_node, PickleToStructure(key));
      result.keys.push_back(std::move(key_node));
      result.values.push_back(std::move(converted));
    }
    if (param_groups != nullptr) {
      auto groups = PickleToStructure(param_groups, options);
      if (!groups.ok()) {
        return Annotate(groups.status(), absl::StrCat(optim0.path(), ": param_groups"));
      }
      result.keys.push_back(StructureNode::String("param_groups"));
      result.values.push_back(*std::move(groups));
    }
    return result;
  }

  // Rank 0's buffers, in module order.
  absl::StatusOr<std::vector<CatalogTensor>> ReadBuffers(const TorchArchive& model) {
    const PickleValue* names_value = PickleField(model.root(), "buffer_names");
    const auto* names = PickleItems(names_value);
    if (names == nullptr && !IsNone(names_value)) {
      return Corrupt(model, absl::StrCat("buffer_names is ", DescribePickleValue(names_value),
                                         "; expected a list of names"));
    }
    std::vector<CatalogTensor> buffers;
    if (names == nullptr || names->empty() || files_.pipeline) return buffers;
    for (const PickleValue* item : *names) {
      std::optional<std::string> name = PickleString(item);
      if (!name.has_value()) {
        return Corrupt(model, absl::StrCat("buffer_names holds ", DescribePickleValue(item)));
      }
      buffer_names_.insert(*name);
    }
    const PickleValue* module = PickleField(model.root(), "module");
    const auto* entries = PickleEntries(module);
    if (entries == nullptr) {
      return Corrupt(model, absl::StrCat("module is ", DescribePickleValue(module),
                                         ", but buffer_names lists ", names->size(),
                                         " buffers to take from it"));
    }
    absl::flat_hash_set<std::string> found;
    for (const auto& [key, value] : *entries) {
      std::optional<std::string> name = PickleString(key);
      if (!name.has_value() || !buffer_names_.contains(*name) || !found.insert(*name).second) {
        continue;
      }
      ASSIGN_OR_RETURN(CatalogTensor tensor,
                       builder_.WholeTensor(model, value, *name, absl::StrCat("module.", *name)));
      buffers.push_back(std::move(tensor));
    }
    // zero_to_fp32 would skip such a buffer silently; a model without it is not the one saved.
    for (const std::string& name : buffer_names_) {
      if (!found.contains(name)) {
        return Corrupt(model, absl::StrCat("buffer_names lists \"", name,
                                           "\" but module holds no such tensor; the model "
                                           "states file is inconsistent"));
      }
    }
    return buffers;
  }

  // Names tied to another param by shared_params (rank 0's), in order.
  // shared_params of rank 0's model states (alias -> owner; other ranks write {}).
  absl::Status ReadSharedParams(const TorchArchive& model) {
    const PickleValue* value = PickleField(model.root(), "shared_params");
    if (IsNone(value)) return absl::OkStatus();
    const auto* entries = PickleEntries(value);
    if (entries == nullptr) {
      if (value->kind == Kind::kDict) return absl::OkStatus();  // {}
      return Corrupt(model, absl::StrCat("shared_params is ", DescribePickleValue(value),
                                         "; expected a dict alias -> owner"));
    }
    for (const auto& [key, item] : *entries) {
      std::optional<std::string> alias = PickleString(key);
      std::optional<std::string> owner = PickleString(item);
      if (!alias.has_value() || !owner.has_value()) {
        return Corrupt(model, absl::StrCat("shared_params maps ", DescribePickleValue(key), " to ",
                                           DescribePickleValue(item), "; expected names"));
      }
      shared_.emplace_back(*alias, *owner);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<CatalogTensor>> ReadFrozen(const TorchArchive& model0) {
    std::vector<CatalogTensor> frozen;
    const PickleValue* shapes_value = PickleField(model0.root(), "frozen_param_shapes");
    if (IsNone(shapes_value)) {
      if (stage_ != 3) return FrozenFromModule(model0);
      return frozen;
    }
    const auto* shapes = PickleEntries(shapes_value);
    if (shapes == nullptr) {
      if (shapes_value->kind == Kind::kDict) return frozen;  // {}
      return Corrupt(model0, absl::StrCat("frozen_param_shapes is ",
                                          DescribePickleValue(shapes_value), ", not a dict"));
    }
    std::vector<ParamInfo> infos;
    for (const auto& [key, value] : *shapes) {
      std::optional<std::string> name = PickleString(key);
      std::optional<Shape> shape = PickleShape(value);
      if (!name.has_value() || !shape.has_value()) {
        return Corrupt(model0, absl::StrCat("frozen_param_shapes holds ", DescribePickleValue(key),
                                            " -> ", DescribePickleValue(value)));
      }
      auto numel = NumElements(*shape);
      if (!numel.ok() || *numel > kZeroMaxElements) {
        return Corrupt(model0, absl::StrCat("frozen_param_shapes[\"", *name,
                                            "\"] = ", ShapeToString(*shape), " is too large"));
      }
      infos.push_back(ParamInfo{*name, *shape, *numel, 0});
    }
    if (stage_ != 3) {
      const PickleValue* fragments = PickleField(model0.root(), "frozen_param_fragments");
      for (const ParamInfo& info : infos) {
        const std::string what = absl::StrCat("frozen_param_fragments[\"", info.name, "\"]");
        const PickleValue* value = PickleField(fragments, info.name);
        if (value == nullptr) return Corrupt(model0, absl::StrCat(what, " is missing"));
        ASSIGN_OR_RETURN(CatalogTensor tensor,
                         builder_.WholeTensor(model0, value, info.name, what));
        if (tensor.shape != info.shape) {
          // A fragment of another shape but the same elements, stored contiguously.
          const std::vector<int64_t> dense = RowMajorStrides(tensor.shape);
          if (NumElementsUnchecked(tensor.shape) != info.numel ||
              (info.numel > 1 && tensor.pieces[0].strides != dense)) {
            return Corrupt(
                model0, absl::StrCat(what, " has shape ", ShapeToString(tensor.shape),
                                     ", but frozen_param_shapes says ", ShapeToString(info.shape)));
          }
          const SourcePiece piece = tensor.pieces[0];
          tensor.shape = info.shape;
          tensor.pieces.clear();
          AddFlatRangePieces(tensor, piece.file, piece.byte_offset, 0, info.numel);
        }
        frozen.push_back(std::move(tensor));
      }
      return frozen;
    }
    // ZeRO-3: rank r's fragment holds elements [r*P, (r+1)*P) of the flattened param.
    for (const ParamInfo& info : infos) {
      frozen.push_back(CatalogTensor{info.name, DType::kF32, info.shape, {}});
    }
    if (infos.empty()) return frozen;
    auto add_fragments = [&](int rank, const TorchArchive* model) -> absl::Status {
      const PickleValue* fragments = PickleField(model->root(), "frozen_param_fragments");
      for (size_t i = 0; i < infos.size(); ++i) {
        const ParamInfo& info = infos[i];
        const std::string what = absl::StrCat("frozen_param_fragments[\"", info.name, "\"]");
        const PickleValue* value = PickleField(fragments, info.name);
        if (value == nullptr) return Corrupt(*model, absl::StrCat(what, " is missing"));
        ASSIGN_OR_RETURN(std::optional<TensorLocation> location, model->Tensor(value, what));
        if (!location.has_value()) {
          return Corrupt(*model,
                         absl::StrCat(what, " is ", DescribePickleValue(value), ", not a tensor"));
        }
        const int64_t partition = info.numel / world_ + (info.numel % world_ != 0 ? 1 : 0);
        if (rank == 0) frozen[i].dtype = location->dtype;
        if (location->dtype != frozen[i].dtype || location->shape.size() != 1 ||
            location->shape[0] != partition ||
            (location->shape[0] > 1 && location->strides[0] != 1)) {
          return Corrupt(
              *model, absl::StrCat(what, " is a ", DTypeName(location->dtype), " tensor of shape ",
                                   ShapeToString(location->shape), "; expected a 1-D contiguous ",
                                   DTypeName(frozen[i].dtype), " partition of ", partition,
                                   " elements (", info.numel, " over ", world_, " ranks)"));
        }
        const int64_t begin = std::min(rank * partition, info.numel);
        const int64_t end = std::min(begin + partition, info.numel);
        AddFlatRangePieces(frozen[i], builder_.FileIndex(*model), location->byte_offset, begin,
                           end);
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(add_fragments(0, &model0));
    RETURN_IF_ERROR(ReadRankArchives(
        [this](int rank) { return ModelName(rank); },
        [&](int rank, const TorchArchive& model) { return add_fragments(rank, &model); }));
    return frozen;
  }

  // ZeRO-1/2 without frozen_param_shapes (ZeRO-1, or exclude_frozen_parameters): the module's
  // 16-bit tensors that are not trainable params, buffers or tied aliases.
  absl::StatusOr<std::vector<CatalogTensor>> FrozenFromModule(const TorchArchive& model) {
    std::vector<CatalogTensor> frozen;
    const auto* entries = PickleEntries(PickleField(model.root(), "module"));
    if (entries == nullptr) return frozen;
    absl::flat_hash_set<std::string> known(buffer_names_.begin(), buffer_names_.end());
    for (const ParamInfo& param : params_) known.insert(param.name);
    for (const auto& [alias, owner] : shared_) known.insert(alias);
    for (const auto& [key, value] : *entries) {
      std::optional<std::string> name = PickleString(key);
      if (!name.has_value() || known.contains(*name) || !TorchArchive::IsTensor(value)) continue;
      known.insert(*name);
      ASSIGN_OR_RETURN(CatalogTensor tensor,
                       builder_.WholeTensor(model, value, *name, absl::StrCat("module.", *name)));
      frozen.push_back(std::move(tensor));
      frozen_from_module_ = true;
    }
    return frozen;
  }

  // Tied aliases take their owner's dtype, shape and pieces (zero_to_fp32: state_dict[alias] =
  // state_dict[owner]); an alias whose owner is not in the checkpoint is skipped.
  absl::Status AddAliases() {
    for (const auto& [alias, owner] : shared_) {
      const int owner_index = builder_.Find(owner);
      if (owner_index < 0) {
        builder_.catalog().other_entries.push_back(absl::StrCat(
            alias, ": tied to ", owner, ", which the checkpoint does not hold (skipped)"));
        continue;
      }
      CatalogTensor tied = builder_.catalog().tensors[owner_index];
      tied.name = alias;
      if (const int existing = builder_.Find(alias); existing >= 0) {
        builder_.catalog().tensors[existing] = std::move(tied);
      } else {
        RETURN_IF_ERROR(builder_.Add(std::move(tied)));
      }
      ++aliases_;
    }
    return absl::OkStatus();
  }

  std::string Description(size_t buffers, size_t frozen, size_t trainable) const {
    std::string text = absl::StrCat(
        "DeepSpeed ",
        bf16_optimizer_ ? "BF16_Optimizer (ZeRO-1 layout)" : absl::StrCat("ZeRO-", stage_),
        files_.prefix == "bf16_" && !bf16_optimizer_ ? " (bf16)" : "", ", ", world_,
        " data-parallel rank", world_ == 1 ? "" : "s", ", tag ", tag_, ", ",
        trainable + frozen + aliases_, " parameters");
    // Frozen and shared ones, when there are any: "(2 frozen, 1 shared)".
    std::vector<std::string> kinds;
    if (frozen > 0) {
      kinds.push_back(
          absl::StrCat(frozen, " frozen", frozen_from_module_ ? " from the 16-bit module" : ""));
    }
    if (aliases_ > 0) kinds.push_back(absl::StrCat(aliases_, " shared"));
    if (!kinds.empty()) absl::StrAppend(&text, " (", absl::StrJoin(kinds, ", "), ")");
    if (buffers > 0) absl::StrAppend(&text, ", ", buffers, " buffer", buffers == 1 ? "" : "s");
    if (options_.include_optimizer) absl::StrAppend(&text, ", with Adam moments");
    return text;
  }

  const std::string dir_;
  const std::string tag_;
  const ReadOptions options_;

  const ZeroFolderFiles files_;

  int stage_ = 0;
  int world_ = 0;
  bool bf16_optimizer_ = false;
  int64_t group_partition_counts_ = 0;  // entries of a list partition_count
  int param_groups_ = 0;
  std::vector<ParamInfo> params_;
  absl::flat_hash_set<std::string> buffer_names_;
  bool frozen_from_module_ = false;
  std::vector<std::pair<std::string, std::string>> shared_;  // alias -> owner
  int aliases_ = 0;
  std::vector<RankFlats> flats_;

  ZeroCatalogBuilder builder_;
};

}  // namespace

absl::StatusOr<InputModel> ReadZeroCheckpoint(std::string dir, std::string tag,
                                              ZeroFolderFiles files, const ReadOptions& options) {
  return ZeroReader(std::move(dir), std::move(tag), std::move(files), options).Read();
}

}  // namespace zero_internal
}  // namespace reshard
