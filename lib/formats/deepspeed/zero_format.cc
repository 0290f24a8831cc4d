#include "lib/formats/deepspeed/zero_format.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using Kind = PickleValue::Kind;

// Directory entries looked at by Probe and when listing a folder.
constexpr int kMaxProbeEntries = 100'000;
constexpr int kMaxListedFolders = 20;
// Model-parallel ranks (mp_rank_XX files) read as parts, as many as reshard writes.
constexpr int kMaxModelParallelParts = 4096;

constexpr char kPartialSaveHint[] =
    "A partial save is the usual cause: the checkpoint is still being written, some ranks did not "
    "finish saving, or a copy lost files (zero_to_fp32 refuses such a checkpoint too).";

// --- Folders ----------------------------------------------------------------------------------

struct FolderScan {
  bool optimizer = false;  // holds ZeRO optimizer files
  bool model = false;      // holds DeepSpeed model-states files (mp_rank_XX, zero_pp_rank_N_...)
  bool pipeline = false;   // holds pipeline layer files

  // A DeepSpeed checkpoint folder this reader reads (pipeline ones are the Megatron reader's).
  bool Checkpoint() const { return (optimizer || model) && !pipeline; }
};

FolderScan ScanFolder(const std::string& dir) {
  FolderScan scan;
  std::error_code error;
  int seen = 0;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (++seen > kMaxProbeEntries) break;
    std::optional<ZeroFileName> parsed = ParseZeroFileName(it->path().filename().string());
    if (!parsed.has_value()) continue;
    if (parsed->kind == ZeroFileName::Kind::kPipelineLayer) scan.pipeline = true;
    if (parsed->kind == ZeroFileName::Kind::kOptimizer) scan.optimizer = true;
    if (parsed->kind == ZeroFileName::Kind::kModel ||
        parsed->kind == ZeroFileName::Kind::kRankModel) {
      scan.model = true;
    }
  }
  return scan;
}

// Sub-folders of `dir` (not hidden), in natural order.
std::vector<std::string> SubFolders(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  int seen = 0;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (++seen > kMaxProbeEntries) break;
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.' || !it->is_directory(error)) continue;
    names.push_back(name);
  }
  std::sort(names.begin(), names.end(), NaturalLess);
  return names;
}

// "global_step10, global_step20": the checkpoint folders under `dir`, for messages.
std::string ListCheckpointFolders(const std::string& dir) {
  std::vector<std::string> found;
  for (const std::string& name : SubFolders(dir)) {
    if (ScanFolder(JoinPath(dir, name)).Checkpoint()) found.push_back(name);
  }
  if (found.empty()) return "no folder here holds DeepSpeed checkpoint files";
  std::string listed = absl::StrJoin(
      found.begin(), found.begin() + std::min<size_t>(found.size(), kMaxListedFolders), ", ");
  if (found.size() > kMaxListedFolders) {
    absl::StrAppend(&listed, " and ", found.size() - kMaxListedFolders, " more");
  }
  return absl::StrCat("checkpoint folders here: ", listed);
}

// The checkpoint folder to read and its tag: `path` itself when it holds DeepSpeed checkpoint
// files (optimizer or model states), else `path/<tag>` with the tag from `tag_option` or
// `path/latest`.
absl::StatusOr<std::pair<std::string, std::string>> ResolveCheckpointFolder(
    const std::string& path, const std::string& tag_option) {
  std::error_code error;
  if (!fs::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a DeepSpeed checkpoint is a folder, not a file"));
  }
  const FolderScan scan = ScanFolder(path);
  const bool here = scan.optimizer || scan.model;
  if (!tag_option.empty()) {
    RETURN_IF_ERROR(CheckTag(tag_option, "from --tag"));
    const std::string folder = JoinPath(path, tag_option);
    if (fs::is_directory(folder, error)) return std::make_pair(folder, tag_option);
    if (here && BaseName(path) == tag_option) return std::make_pair(path, tag_option);
    return absl::NotFoundError(absl::StrCat("--tag ", tag_option, ": there is no folder ", folder,
                                            "; ", ListCheckpointFolders(path)));
  }
  if (here) return std::make_pair(path, BaseName(path));
  const std::string latest = JoinPath(path, kDeepSpeedTrackerName);
  ASSIGN_OR_RETURN(std::optional<std::string> contents, ReadTrackerFile(latest));
  if (!contents.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds no DeepSpeed checkpoint files and no `latest` file naming a checkpoint; ",
        ListCheckpointFolders(path), ". Pass --tag to choose one"));
  }
  const std::string tag = *std::move(contents);
  if (tag.empty()) {
    return absl::DataLossError(absl::StrCat(latest, " is empty; ", ListCheckpointFolders(path),
                                            ". Pass --tag to choose one"));
  }
  RETURN_IF_ERROR(CheckTag(tag, absl::StrCat("from ", latest)));
  const std::string folder = JoinPath(path, tag);
  if (!fs::is_directory(folder, error)) {
    return absl::NotFoundError(absl::StrCat(latest, " names tag ", tag, ", but there is no folder ",
                                            folder, "; ", ListCheckpointFolders(path),
                                            ". Pass --tag to choose one"));
  }
  return std::make_pair(folder, tag);
}

// --- Pickle helpers ---------------------------------------------------------------------------

// ZeroStageEnum as pickled by Python <= 3.10 (ZeroStageEnum(3), an int Enum call) or by 3.11
// (getattr(ZeroStageEnum, "weights")).
std::optional<int64_t> ZeroStage(const PickleValue* value) {
  if (std::optional<int64_t> stage = PickleInt(value); stage.has_value()) return stage;
  if (value == nullptr || value->kind != Kind::kObject || value->callable == nullptr ||
      !value->callable->IsGlobal("builtins", "getattr") || value->args == nullptr ||
      value->args->kind != Kind::kTuple || value->args->items.size() != 2 ||
      value->args->items[0]->kind != Kind::kGlobal ||
      value->args->items[0]->name != "ZeroStageEnum" ||
      value->args->items[1]->kind != Kind::kString) {
    return std::nullopt;
  }
  static const auto* const kNames = new std::map<std::string, int64_t>{
      {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
  auto it = kNames->find(value->args->items[1]->text);
  if (it == kNames->end()) return std::nullopt;
  return it->second;
}

// The value under int key `key` of a dict (torch optimizer state is keyed by param index).
const PickleValue* IntKeyField(const PickleValue* dict, int64_t key) {
  const auto* entries = PickleEntries(dict);
  if (entries == nullptr) return nullptr;
  for (const auto& [k, v] : *entries) {
    if (k->kind == Kind::kInt && k->integer == key) return v;
  }
  return nullptr;
}

bool IsNone(const PickleValue* value) { return value == nullptr || value->kind == Kind::kNone; }

// --- The reader -------------------------------------------------------------------------------

// A 1-D contiguous float32 tensor in one file: one rank's flat group or flat moment.
struct FlatTensor {
  int file = -1;
  uint64_t byte_offset = 0;
  int64_t numel = 0;
};

// What one rank's optimizer file holds, per flat group (ZeRO-1/2 param group, ZeRO-3 sub-group).
struct RankFlats {
  std::vector<FlatTensor> fp32;
  std::vector<FlatTensor> exp_avg;  // with include_optimizer only
  std::vector<FlatTensor> exp_avg_sq;
  // ZeRO-1/2 `group_paddings[g]`, when the file records it as an int.
  std::vector<std::optional<int64_t>> paddings;
};

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t numel = 0;
  int group = 0;  // index in param_shapes
};

class ZeroReader {
 public:
  ZeroReader(std::string dir, std::string tag, const ReadOptions& options)
      : dir_(std::move(dir)), tag_(std::move(tag)), options_(options) {}

  absl::StatusOr<InputModel> Read() {
    RETURN_IF_ERROR(ListFiles());
    if (!any_optimizer_file_) return ReadWithoutOptimizerFiles();
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> optim0, OpenOptimizer(0));
    RETURN_IF_ERROR(ReadStage(*optim0));
    RETURN_IF_ERROR(CheckRankFiles());
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> model0, OpenArchive(ModelName(0)));
    RETURN_IF_ERROR(ReadParamShapes(*model0));
    RETURN_IF_ERROR(ReadSharedParams(*model0));

    // Every rank's flat groups; an archive is dropped once its tensors are located.
    flats_.resize(world_);
    ASSIGN_OR_RETURN(flats_[0], ReadRankFlats(*optim0));
    optim0.reset();
    for (int rank = 1; rank < world_; ++rank) {
      ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> optim, OpenOptimizer(rank));
      RETURN_IF_ERROR(CheckSameRun(*optim, rank));
      ASSIGN_OR_RETURN(flats_[rank], ReadRankFlats(*optim));
    }

    std::vector<CatalogTensor> buffers, frozen, trainable, moments;
    ASSIGN_OR_RETURN(buffers, ReadBuffers(*model0));
    ASSIGN_OR_RETURN(frozen, ReadFrozen(*model0));
    if (stage_ == 3) {
      ASSIGN_OR_RETURN(trainable, LocateZero3(moments));
    } else {
      ASSIGN_OR_RETURN(trainable, LocateZero12(moments));
    }
    const size_t buffer_count = buffers.size();
    const size_t frozen_count = frozen.size();
    const size_t trainable_count = trainable.size();
    for (auto* part : {&buffers, &frozen, &trainable}) {
      for (CatalogTensor& tensor : *part) RETURN_IF_ERROR(Add(std::move(tensor)));
    }
    RETURN_IF_ERROR(AddAliases());
    for (CatalogTensor& tensor : moments) RETURN_IF_ERROR(Add(std::move(tensor)));
    catalog_.format = ZeroInput::kId;
    catalog_.Reindex();

    InputModel model;
    model.format = ZeroInput::kId;
    model.layout = "sharded";
    model.description = Description(buffer_count, frozen_count, trainable_count);
    model.parts.push_back(std::move(catalog_));
    model.part_names.push_back(dir_);
    return model;
  }

 private:
  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }

  std::string OptimizerName(int rank) const {
    return absl::StrCat(prefix_, "zero_pp_rank_", rank, "_mp_rank_00_optim_states.pt");
  }
  std::string ModelName(int rank) const {
    return stage_ == 3 ? absl::StrCat("zero_pp_rank_", rank, "_mp_rank_00_model_states.pt")
                       : std::string("mp_rank_00_model_states.pt");
  }

  // "ZeRO-3 with 4 ranks", "BF16_Optimizer (ZeRO-1 layout) with 2 ranks".
  std::string Setup() const {
    return absl::StrCat(
        bf16_optimizer_ ? "BF16_Optimizer (ZeRO-1 layout)" : absl::StrCat("ZeRO-", stage_),
        " with ", world_, world_ == 1 ? " rank" : " ranks");
  }

  absl::Status Corrupt(const TorchArchive& archive, absl::string_view message) const {
    return absl::DataLossError(absl::StrCat(archive.path(), ": ", message));
  }

  int FileIndex(const TorchArchive& archive) {
    auto [it, inserted] = file_index_.try_emplace(archive.path(), catalog_.files.size());
    if (inserted) catalog_.files.push_back(archive.Source());
    return it->second;
  }

  // Sorts the folder's files by kind and rank.
  absl::Status ListFiles() {
    std::error_code error;
    int seen = 0;
    std::vector<std::string> other_mp;
    for (fs::directory_iterator it(dir_, error), end; !error && it != end; it.increment(error)) {
      if (++seen > kMaxProbeEntries) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir_, " holds more than ", kMaxProbeEntries, " entries"));
      }
      const std::string name = it->path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      if (absl::StartsWith(name, "expp_rank_") || absl::StrContains(name, "_expert_")) {
        return absl::UnimplementedError(absl::StrCat(
            dir_, ": ", name,
            " belongs to a mixture-of-experts checkpoint; reshard does not read MoE expert files"));
      }
      std::optional<ZeroFileName> parsed = ParseZeroFileName(name);
      if (!parsed.has_value()) continue;
      if (parsed->kind == ZeroFileName::Kind::kPipelineLayer) {
        return absl::UnimplementedError(absl::StrCat(
            dir_, " holds pipeline-parallel layer files (", name,
            "); that is a Megatron-DeepSpeed pipeline checkpoint, not a plain ZeRO one"));
      }
      switch (parsed->kind) {
        case ZeroFileName::Kind::kOptimizer: {
          any_optimizer_file_ = true;
          if (parsed->mp != 0) {
            other_mp.push_back(name);
            break;
          }
          auto [it2, inserted] = optimizer_files_.try_emplace(parsed->dp, name);
          if (!inserted) {
            return absl::DataLossError(absl::StrCat(dir_, ": ", it2->second, " and ", name,
                                                    " are both rank ", parsed->dp,
                                                    "'s optimizer file (two runs mixed?)"));
          }
          prefixes_.insert(parsed->prefix);
          break;
        }
        case ZeroFileName::Kind::kRankModel:
          rank_model_names_.push_back(name);
          rank_model_mps_.insert(parsed->mp);
          if (parsed->mp != 0) {
            other_mp.push_back(name);
          } else {
            rank_model_files_[parsed->dp] = name;
          }
          break;
        case ZeroFileName::Kind::kModel:
          model_files_[parsed->mp] = name;
          if (parsed->mp != 0) other_mp.push_back(name);
          break;
        case ZeroFileName::Kind::kPipelineLayer:
          break;
      }
    }
    if (error) return ErrnoToStatus(error.value(), absl::StrCat("listing ", dir_));
    std::sort(rank_model_names_.begin(), rank_model_names_.end(), NaturalLess);
    // Without optimizer files, Read decides from the model-states files what the folder is.
    if (!any_optimizer_file_) return absl::OkStatus();
    if (!other_mp.empty()) {
      std::sort(other_mp.begin(), other_mp.end(), NaturalLess);
      return absl::UnimplementedError(absl::StrCat(
          dir_, " holds files of model-parallel rank > 0 (", other_mp[0],
          "): ZeRO combined with tensor or pipeline parallelism is not supported; reshard reads "
          "data-parallel ZeRO checkpoints (mp_rank_00 files only)"));
    }
    if (prefixes_.size() > 1) {
      return absl::DataLossError(
          absl::StrCat(dir_, " mixes optimizer files with different prefixes (",
                       absl::StrJoin(prefixes_, ", ",
                                     [](std::string* out, const std::string& p) {
                                       absl::StrAppend(out, p.empty() ? "none" : p);
                                     }),
                       "): two runs saved into one folder"));
    }
    prefix_ = *prefixes_.begin();
    return absl::OkStatus();
  }

  // --- Folders without optimizer files --------------------------------------------------------

  // What a model-states file says about ZeRO: `what` names the setup ("ZeRO-2") when the run
  // partitioned its fp32 weights into optimizer files, empty when it did not (ZeRO disabled).
  struct ZeroSigns {
    std::string what;
    bool bf16 = false;  // bf16 run: the optimizer files are `bf16_zero_pp_rank_*`
  };

  static ZeroSigns ReadZeroSigns(const TorchArchive& model) {
    ZeroSigns signs;
    const PickleValue* config = PickleField(model.root(), "ds_config");
    for (const char* key : {"bf16", "bfloat16"}) {
      if (PickleInt(PickleField(PickleField(config, key), "enabled")).value_or(0) != 0) {
        signs.bf16 = true;
      }
    }
    const PickleValue* zero = PickleField(config, "zero_optimization");
    std::optional<int64_t> stage = ZeroStage(PickleField(zero, "stage"));
    if (!stage.has_value()) stage = PickleInt(zero);  // the legacy `"zero_optimization": true`
    if (stage.value_or(0) >= 1) {
      signs.what = absl::StrCat("ZeRO-", *stage);
    } else if (!IsNone(PickleField(model.root(), "param_shapes"))) {
      // param_shapes is saved when the fp32 weights are partitioned into optimizer files: under
      // ZeRO, or by BF16_Optimizer (bf16 without ZeRO).
      signs.what = signs.bf16 ? "BF16_Optimizer" : "ZeRO";
    }
    return signs;
  }

  static std::string TwoDigits(int n) { return absl::StrCat(n < 10 ? "0" : "", n); }

  // The refusal for a ZeRO checkpoint copied without its optimizer files.
  absl::Status MissingOptimizerFiles(const ZeroSigns& signs, const std::set<int>& mps) const {
    const std::string mp = mps.size() == 1 ? TwoDigits(*mps.begin()) : std::string("*");
    return absl::DataLossError(absl::StrCat(
        dir_, ": DeepSpeed ", signs.what, " checkpoint ", tag_, " has no optimizer files (",
        signs.bf16 ? "bf16_" : "", "zero_pp_rank_*_mp_rank_", mp,
        "_optim_states.pt): the fp32 weights live there; copy them too"));
  }

  // A folder with model-states files only: a ZeRO checkpoint whose optimizer files were not
  // copied (refused), or DeepSpeed without ZeRO (the weights are `module`).
  absl::StatusOr<InputModel> ReadWithoutOptimizerFiles() {
    if (!rank_model_names_.empty()) {
      // zero_pp_rank_N_mp_rank_XX_model_states.pt: only ZeRO-3 names model states so. A file
      // that cannot be read only costs the message its bf16_ prefix.
      ZeroSigns signs;
      auto model = OpenArchive(rank_model_names_.front());
      if (model.ok()) signs = ReadZeroSigns(**model);
      signs.what = "ZeRO-3";
      return MissingOptimizerFiles(signs, rank_model_mps_);
    }
    if (model_files_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir_,
          " holds no DeepSpeed checkpoint files (zero_pp_rank_N_mp_rank_00_optim_states.pt, "
          "mp_rank_00_model_states.pt)"));
    }
    std::set<int> mps;
    for (const auto& [mp, name] : model_files_) mps.insert(mp);
    // The lowest rank's file first: a ZeRO run is refused whatever else is missing.
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> first,
                     OpenArchive(model_files_.begin()->second));
    if (const ZeroSigns signs = ReadZeroSigns(*first); !signs.what.empty()) {
      return MissingOptimizerFiles(signs, mps);
    }
    const int parts = model_files_.rbegin()->first + 1;
    if (parts > kMaxModelParallelParts) {
      return absl::UnimplementedError(
          absl::StrCat(dir_, ": ", model_files_.rbegin()->second, " names model-parallel rank ",
                       parts - 1, "; at most ", kMaxModelParallelParts, " parts are read"));
    }
    for (int mp = 0; mp < parts; ++mp) {
      if (model_files_.count(mp) == 0) {
        return absl::DataLossError(absl::StrCat(
            dir_, ": DeepSpeed without ZeRO, model-parallel ranks ",
            absl::StrJoin(mps, ", ", [](std::string* out, int r) { out->append(TwoDigits(r)); }),
            ": mp_rank_", TwoDigits(mp), "_model_states.pt is missing. ", kPartialSaveHint));
      }
    }
    const PickleValue* mp_world = PickleField(first->root(), "mp_world_size");
    if (std::optional<int64_t> world = PickleInt(mp_world); world.has_value() && *world != parts) {
      return absl::DataLossError(
          absl::StrCat(first->path(), ": mp_world_size is ", *world, ", but the folder holds ",
                       parts, " mp_rank_XX_model_states.pt file", parts == 1 ? "" : "s", " (",
                       *world > parts ? "files are missing" : "files of two runs mixed?", ")"));
    }
    if (options_.include_optimizer) {
      return absl::FailedPreconditionError(absl::StrCat(
          first->path(),
          ": --include-optimizer: DeepSpeed without ZeRO keeps the optimizer state in "
          "`optimizer`, keyed by parameter index rather than name, so reshard cannot name the "
          "Adam moments; leave out --include-optimizer"));
    }
    InputModel model;
    model.format = ZeroInput::kId;
    size_t tensors = 0;
    for (int mp = 0; mp < parts; ++mp) {
      std::unique_ptr<TorchArchive> archive;
      if (mp == 0) {
        archive = std::move(first);
      } else {
        ASSIGN_OR_RETURN(archive, OpenArchive(model_files_.at(mp)));
        const ZeroSigns signs = ReadZeroSigns(*archive);
        if (!signs.what.empty()) return MissingOptimizerFiles(signs, mps);
      }
      ASSIGN_OR_RETURN(Catalog part, ReadModule(*archive));
      tensors = part.tensors.size();
      model.parts.push_back(std::move(part));
      model.part_names.push_back(archive->path());
    }
    model.layout = parts == 1 ? "single-file" : "model-parallel-parts";
    model.description =
        absl::StrCat("DeepSpeed (no ZeRO), weights from ",
                     parts == 1 ? std::string("mp_rank_00")
                                : absl::StrCat("mp_rank_{00..", TwoDigits(parts - 1), "}"),
                     "_model_states.pt module, ",
                     parts == 1 ? "" : absl::StrCat(parts, " model-parallel parts, "), "tag ", tag_,
                     ", ", tensors, parts == 1 ? " tensors" : " tensors each");
    return model;
  }

  // Whether `value` holds a tensor somewhere (bounded like the torch reader's walk).
  bool ContainsTensor(const PickleValue* value, int depth, uint64_t& budget) const {
    if (value == nullptr || depth > 64 || budget == 0) return false;
    --budget;
    if (TorchArchive::IsTensor(value)) return true;
    for (const PickleValue* item : value->items) {
      if (ContainsTensor(item, depth + 1, budget)) return true;
    }
    for (const auto& [key, item] : value->entries) {
      if (ContainsTensor(item, depth + 1, budget)) return true;
    }
    return value->state != nullptr && ContainsTensor(value->state, depth + 1, budget);
  }

  // The tensors of a model-states file's `module` (a state dict), in its order, under their
  // own names and dtypes. Tied weights are two names of one storage: identical pieces.
  absl::StatusOr<Catalog> ReadModule(const TorchArchive& model) {
    catalog_ = Catalog();
    file_index_.clear();
    index_.clear();
    const PickleValue* module = PickleField(model.root(), "module");
    if (module == nullptr) {
      return Corrupt(model, "no `module` entry: not a DeepSpeed model-states file");
    }
    if (IsNone(module)) {
      return absl::DataLossError(absl::StrCat(
          model.path(),
          ": `module` is None: DeepSpeed's pipeline engine saved this checkpoint, and its weights "
          "are in layer_XX-model_YY-model_states.pt files, which this folder lacks. ",
          kPartialSaveHint));
    }
    const auto* entries = PickleEntries(module);
    if (entries == nullptr && module->kind != Kind::kDict &&
        !module->IsObjectOf("collections", "OrderedDict")) {
      return Corrupt(model, absl::StrCat("`module` is ", DescribePickleValue(module),
                                         "; expected a state dict"));
    }
    FileIndex(model);
    uint64_t budget = 4 * model.pickle_values() + 4096;
    static const auto* const kNoEntries = new std::vector<std::pair<PickleValue*, PickleValue*>>();
    for (const auto& [key, value] : entries == nullptr ? *kNoEntries : *entries) {
      std::optional<std::string> name = PickleString(key);
      if (!name.has_value() || name->empty()) {
        return Corrupt(model, absl::StrCat("`module` has a key that is ", DescribePickleValue(key),
                                           ", not a name"));
      }
      if (!TorchArchive::IsTensor(value)) {
        if (ContainsTensor(value, 0, budget)) {
          return absl::UnimplementedError(absl::StrCat(
              model.path(), ": module[\"", *name, "\"] is ", DescribePickleValue(value),
              " holding tensors; expected a flat state dict of tensors"));
        }
        catalog_.other_entries.push_back(
            absl::StrCat("module.", *name, ": ", DescribePickleValue(value), " (not carried)"));
        continue;
      }
      ASSIGN_OR_RETURN(CatalogTensor tensor,
                       WholeTensor(model, value, *name, absl::StrCat("module[\"", *name, "\"]")));
      RETURN_IF_ERROR(Add(std::move(tensor)));
    }
    if (catalog_.tensors.empty()) {
      return absl::DataLossError(absl::StrCat(model.path(), ": `module` holds no tensors"));
    }
    if (const auto* top = PickleEntries(model.root()); top != nullptr) {
      for (const auto& [key, value] : *top) {
        std::optional<std::string> name = PickleString(key);
        if (!name.has_value() || *name == "module" || IsNone(value)) continue;
        catalog_.other_entries.push_back(absl::StrCat(*name, " (", BaseName(model.path()),
                                                      "): ", DescribePickleValue(value),
                                                      " (not carried)"));
      }
    }
    catalog_.format = ZeroInput::kId;
    catalog_.Reindex();
    Catalog part = std::move(catalog_);
    catalog_ = Catalog();
    return part;
  }

  absl::StatusOr<std::unique_ptr<TorchArchive>> OpenArchive(const std::string& name) const {
    return TorchArchive::Open(Path(name));
  }

  absl::StatusOr<std::unique_ptr<TorchArchive>> OpenOptimizer(int rank) const {
    auto it = optimizer_files_.find(rank);
    if (it == optimizer_files_.end()) {
      // Only rank 0 can be missing here: CheckRankFiles has run for the others.
      std::vector<int> found;
      for (const auto& [r, name] : optimizer_files_) found.push_back(r);
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
    const std::string count = absl::StrCat(optimizer_files_.size(), " optimizer file",
                                           optimizer_files_.size() == 1 ? "" : "s", " found");
    for (int rank = 0; rank < world_; ++rank) {
      if (optimizer_files_.count(rank) == 0) {
        return absl::DataLossError(absl::StrCat(dir_, ": ", setup, ": rank ", rank,
                                                "'s optimizer file (", OptimizerName(rank),
                                                ") is missing (", count, "). ", kPartialSaveHint));
      }
    }
    for (const auto& [rank, name] : optimizer_files_) {
      if (rank >= world_) {
        return absl::DataLossError(
            absl::StrCat(dir_, ": ", setup, " (partition_count of ", optimizer_files_.at(0),
                         ") but ", count, ": ", name,
                         " is beyond the world size. Files of two runs mixed, or a save with a "
                         "different world size over an old checkpoint"));
      }
    }
    if (stage_ == 3) {
      for (int rank = 0; rank < world_; ++rank) {
        if (rank_model_files_.count(rank) == 0) {
          return absl::DataLossError(absl::StrCat(dir_, ": ", setup, ": rank ", rank,
                                                  "'s model-states file (", ModelName(rank),
                                                  ") is missing. ", kPartialSaveHint));
        }
      }
      for (const auto& [rank, name] : rank_model_files_) {
        if (rank >= world_) {
          return absl::DataLossError(
              absl::StrCat(dir_, ": ", setup, " but ", name, " is beyond the world size"));
        }
      }
    } else if (model_files_.count(0) == 0) {
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
                       optimizer_files_.at(0), " lists ", group_partition_counts_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<FlatTensor> Flat(const TorchArchive& archive, const PickleValue* value,
                                  const std::string& what) {
    if (value == nullptr) return Corrupt(archive, absl::StrCat(what, " is missing"));
    ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive.Tensor(value, what));
    if (!location.has_value()) {
      return Corrupt(archive,
                     absl::StrCat(what, " is ", DescribePickleValue(value), ", not a tensor"));
    }
    if (location->dtype != DType::kF32 || location->shape.size() != 1 ||
        (location->shape[0] > 1 && location->strides[0] != 1)) {
      return Corrupt(archive, absl::StrCat(what, " is a ", DTypeName(location->dtype),
                                           " tensor of shape ", ShapeToString(location->shape),
                                           " strides ", ShapeToString(location->strides),
                                           "; expected a 1-D contiguous float32 tensor"));
    }
    return FlatTensor{FileIndex(archive), location->byte_offset, location->shape[0]};
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

  std::string OptimizerPath(int rank) const { return Path(optimizer_files_.at(rank)); }

  // Appends the pieces of `runs` to `tensor`, out of the flat tensors `member` of each rank.
  absl::Status AddRuns(CatalogTensor& tensor, const std::vector<ZeroRun>& runs,
                       std::vector<FlatTensor> RankFlats::*member, absl::string_view key) const {
    for (const ZeroRun& run : runs) {
      const std::vector<FlatTensor>& groups = flats_[run.rank].*member;
      if (run.group >= static_cast<int>(groups.size()) ||
          run.offset + run.count > groups[run.group].numel) {
        return absl::DataLossError(absl::StrCat(
            OptimizerPath(run.rank), ": \"", tensor.name, "\" needs elements [", run.offset, ", ",
            run.offset + run.count, ") of ", key, "[", run.group, "], which ",
            run.group >= static_cast<int>(groups.size())
                ? "does not exist"
                : absl::StrCat("has ", groups[run.group].numel)));
      }
      const FlatTensor& flat = groups[run.group];
      AddFlatRangePieces(tensor, flat.file,
                         flat.byte_offset + static_cast<uint64_t>(run.offset) * sizeof(float),
                         run.begin, run.begin + run.count);
    }
    return absl::OkStatus();
  }

  // Trainable params (and their moments into `moments`) from the per-rank flat tensors.
  absl::Status Locate(const std::vector<std::vector<ZeroRun>>& runs, absl::string_view key,
                      std::vector<CatalogTensor>& trainable, std::vector<CatalogTensor>& moments) {
    for (size_t p = 0; p < params_.size(); ++p) {
      CatalogTensor tensor{params_[p].name, DType::kF32, params_[p].shape, {}};
      RETURN_IF_ERROR(AddRuns(tensor, runs[p], &RankFlats::fp32, key));
      trainable.push_back(std::move(tensor));
    }
    if (!options_.include_optimizer) return absl::OkStatus();
    for (size_t p = 0; p < params_.size(); ++p) {
      for (auto [suffix, member] : {std::make_pair(".exp_avg", &RankFlats::exp_avg),
                                    std::make_pair(".exp_avg_sq", &RankFlats::exp_avg_sq)}) {
        CatalogTensor tensor{
            absl::StrCat(params_[p].name, suffix), DType::kF32, params_[p].shape, {}};
        RETURN_IF_ERROR(AddRuns(tensor, runs[p], member, absl::StrCat(key, suffix)));
        moments.push_back(std::move(tensor));
      }
    }
    return absl::OkStatus();
  }

  // Checks one flat tensor's length against a ZeRO-1/2 group layout.
  absl::Status CheckZero12Length(const Zero12GroupLayout& layout, int rank, int group,
                                 const FlatTensor& flat, absl::string_view what) const {
    const int64_t unpadded = layout.UnpaddedLength(rank);
    if (flat.numel == unpadded || flat.numel == layout.partition) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat(OptimizerPath(rank), ": ", what, "[", group, "] has ", flat.numel,
                     " elements, but param_shapes[", group, "] (", layout.total, " elements over ",
                     world_, " ranks: partitions of ", layout.partition, ") puts ", unpadded,
                     " on rank ", rank, " (", layout.partition, " with padding)"));
  }

  // `group_paddings[g]` of a rank, when recorded, agrees with param_shapes: the padding of
  // §1.4 (P_g minus the rank's real elements), or A_g - T_g on the last rank and 0 elsewhere
  // (older DeepSpeed and BF16_Optimizer).
  absl::Status CheckZero12Padding(const Zero12GroupLayout& layout, int rank, int group) const {
    const std::optional<int64_t>& recorded = flats_[rank].paddings[group];
    if (!recorded.has_value()) return absl::OkStatus();
    const int64_t padding = layout.partition - layout.UnpaddedLength(rank);
    const int64_t last_rank_padding = rank == world_ - 1 ? layout.aligned - layout.total : 0;
    if (*recorded == padding || *recorded == last_rank_padding) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat(OptimizerPath(rank), ": group_paddings[", group, "] is ", *recorded,
                     ", but param_shapes[", group, "] of ", ModelName(0), " (", layout.total,
                     " elements over ", world_, " ranks: partitions of ", layout.partition,
                     ") leaves ", padding, " padding on rank ", rank));
  }

  absl::StatusOr<std::vector<CatalogTensor>> LocateZero12(std::vector<CatalogTensor>& moments) {
    const std::string model_path = Path(ModelName(0));
    for (int rank = 0; rank < world_; ++rank) {
      if (static_cast<int>(flats_[rank].fp32.size()) != param_groups_) {
        return absl::DataLossError(absl::StrCat(
            OptimizerPath(rank), ": single_partition_of_fp32_groups has ", flats_[rank].fp32.size(),
            " groups, but param_shapes of ", model_path, " has ", param_groups_));
      }
    }
    std::vector<std::vector<ZeroRun>> runs(params_.size());
    for (int g = 0; g < param_groups_; ++g) {
      std::vector<int64_t> numels;
      std::vector<size_t> members;
      for (size_t p = 0; p < params_.size(); ++p) {
        if (params_[p].group != g) continue;
        numels.push_back(params_[p].numel);
        members.push_back(p);
      }
      auto layout = LayoutZero12Group(world_, g, numels);
      if (!layout.ok()) {
        return Annotate(layout.status(), absl::StrCat(model_path, ": param_shapes[", g, "]"));
      }
      // zero_to_fp32's check: the param total and the saved partitions agree once aligned.
      int64_t available = 0;
      for (int rank = 0; rank < world_; ++rank) {
        // Each length is bounded by its file; the sum is bounded to stay clear of overflow.
        available = std::min(available + flats_[rank].fp32[g].numel, kZeroMaxElements);
      }
      if (Zero12Align(layout->total, world_) != Zero12Align(available, world_)) {
        return absl::DataLossError(absl::StrCat(
            dir_, ": ", Setup(), ": param_shapes[", g, "] of ", ModelName(0), " lists ",
            numels.size(), " params of ", layout->total, " elements (aligned to ", 2 * world_, ": ",
            layout->aligned, "), but single_partition_of_fp32_groups[", g,
            "] of the optimizer files hold ", available,
            " (aligned: ", Zero12Align(available, world_), ")"));
      }
      for (int rank = 0; rank < world_; ++rank) {
        RETURN_IF_ERROR(CheckZero12Padding(*layout, rank, g));
        RETURN_IF_ERROR(CheckZero12Length(*layout, rank, g, flats_[rank].fp32[g],
                                          "single_partition_of_fp32_groups"));
        if (options_.include_optimizer) {
          RETURN_IF_ERROR(CheckZero12Length(*layout, rank, g, flats_[rank].exp_avg[g],
                                            "base_optimizer_state exp_avg of group"));
          RETURN_IF_ERROR(CheckZero12Length(*layout, rank, g, flats_[rank].exp_avg_sq[g],
                                            "base_optimizer_state exp_avg_sq of group"));
        }
      }
      for (size_t i = 0; i < members.size(); ++i) runs[members[i]] = std::move(layout->params[i]);
    }
    std::vector<CatalogTensor> trainable;
    RETURN_IF_ERROR(Locate(runs, "single_partition_of_fp32_groups", trainable, moments));
    return trainable;
  }

  absl::StatusOr<std::vector<CatalogTensor>> LocateZero3(std::vector<CatalogTensor>& moments) {
    // Sub-group sizes: rank 0's, and every rank must have the same.
    std::vector<int64_t> sizes;
    for (const FlatTensor& flat : flats_[0].fp32) sizes.push_back(flat.numel);
    for (int rank = 0; rank < world_; ++rank) {
      const RankFlats& flats = flats_[rank];
      for (size_t s = 0; s < std::max(flats.fp32.size(), sizes.size()); ++s) {
        const int64_t got = s < flats.fp32.size() ? flats.fp32[s].numel : -1;
        const int64_t want = s < sizes.size() ? sizes[s] : -1;
        if (got != want) {
          return absl::DataLossError(
              absl::StrCat(OptimizerPath(rank), ": fp32_flat_groups has ", flats.fp32.size(),
                           " sub-groups of sizes [", absl::StrJoin(FlatSizes(flats.fp32), ", "),
                           "], but rank 0's has [", absl::StrJoin(sizes, ", "), "]"));
        }
        if (!options_.include_optimizer) continue;
        for (auto [what, flat] : {std::make_pair("exp_avg", flats.exp_avg[s]),
                                  std::make_pair("exp_avg_sq", flats.exp_avg_sq[s])}) {
          if (flat.numel != want) {
            return absl::DataLossError(absl::StrCat(
                OptimizerPath(rank), ": optimizer_state_dict.optimizer_state_dict.state[", s, "].",
                what, " has ", flat.numel, " elements, but fp32_flat_groups[", s, "] has ", want));
          }
        }
      }
    }
    std::vector<int64_t> numels;
    for (const ParamInfo& param : params_) numels.push_back(param.numel);
    auto layout = LayoutZero3(world_, numels, sizes);
    if (!layout.ok()) {
      // A mismatch of the totals is corrupt input, like every other disagreement of the files.
      const absl::Status status = layout.status().code() == absl::StatusCode::kFailedPrecondition
                                      ? absl::DataLossError(layout.status().message())
                                      : layout.status();
      return Annotate(status, absl::StrCat(dir_, ": ", Setup(), ": param_shapes of ", ModelName(0),
                                           " against fp32_flat_groups of ", OptimizerName(0)));
    }
    std::vector<CatalogTensor> trainable;
    RETURN_IF_ERROR(Locate(layout->params, "fp32_flat_groups", trainable, moments));
    return trainable;
  }

  static std::vector<int64_t> FlatSizes(const std::vector<FlatTensor>& flats) {
    std::vector<int64_t> sizes;
    for (const FlatTensor& flat : flats) sizes.push_back(flat.numel);
    return sizes;
  }

  // A whole tensor of a model-states file as one piece.
  absl::StatusOr<CatalogTensor> WholeTensor(const TorchArchive& archive, const PickleValue* value,
                                            const std::string& name, const std::string& what) {
    ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive.Tensor(value, what));
    if (!location.has_value()) {
      return Corrupt(archive,
                     absl::StrCat(what, " is ", DescribePickleValue(value), ", not a tensor"));
    }
    return CatalogTensorAt(name, *std::move(location), FileIndex(archive));
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
    if (names == nullptr || names->empty()) return buffers;
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
                       WholeTensor(model, value, *name, absl::StrCat("module.", *name)));
      buffers.push_back(std::move(tensor));
    }
    for (const std::string& name : buffer_names_) {
      if (!found.contains(name)) {
        catalog_.other_entries.push_back(absl::StrCat(
            name,
            ": listed in buffer_names but absent from module (skipped, as zero_to_fp32 does)"));
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
        ASSIGN_OR_RETURN(CatalogTensor tensor, WholeTensor(model0, value, info.name, what));
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
    for (int rank = 0; rank < world_ && !infos.empty(); ++rank) {
      std::unique_ptr<TorchArchive> opened;
      const TorchArchive* model = &model0;
      if (rank > 0) {
        ASSIGN_OR_RETURN(opened, OpenArchive(ModelName(rank)));
        model = opened.get();
      }
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
        AddFlatRangePieces(frozen[i], FileIndex(*model), location->byte_offset, begin, end);
      }
    }
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
                       WholeTensor(model, value, *name, absl::StrCat("module.", *name)));
      frozen.push_back(std::move(tensor));
      frozen_from_module_ = true;
    }
    return frozen;
  }

  absl::Status Add(CatalogTensor tensor) {
    if (index_.contains(tensor.name)) {
      return absl::DataLossError(absl::StrCat(dir_, ": \"", tensor.name,
                                              "\" is both a buffer, a frozen or a trainable "
                                              "param, or an optimizer moment: named twice"));
    }
    index_[tensor.name] = static_cast<int>(catalog_.tensors.size());
    catalog_.tensors.push_back(std::move(tensor));
    return absl::OkStatus();
  }

  // Tied aliases take their owner's dtype, shape and pieces (zero_to_fp32: state_dict[alias] =
  // state_dict[owner]); an alias whose owner is not in the checkpoint is skipped.
  absl::Status AddAliases() {
    for (const auto& [alias, owner] : shared_) {
      auto it = index_.find(owner);
      if (it == index_.end()) {
        catalog_.other_entries.push_back(absl::StrCat(
            alias, ": tied to ", owner, ", which the checkpoint does not hold (skipped)"));
        continue;
      }
      CatalogTensor tied = catalog_.tensors[it->second];
      tied.name = alias;
      if (auto existing = index_.find(alias); existing != index_.end()) {
        catalog_.tensors[existing->second] = std::move(tied);
      } else {
        RETURN_IF_ERROR(Add(std::move(tied)));
      }
      ++aliases_;
    }
    return absl::OkStatus();
  }

  std::string Description(size_t buffers, size_t frozen, size_t trainable) const {
    std::string text = absl::StrCat(
        "DeepSpeed ",
        bf16_optimizer_ ? "BF16_Optimizer (ZeRO-1 layout)" : absl::StrCat("ZeRO-", stage_),
        prefix_ == "bf16_" && !bf16_optimizer_ ? " (bf16)" : "", ", ", world_,
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

  std::map<int, std::string> optimizer_files_;   // rank -> file name
  std::map<int, std::string> rank_model_files_;  // ZeRO-3: rank -> file name (mp_rank_00)
  std::vector<std::string> rank_model_names_;    // every zero_pp_rank_*_model_states.pt
  std::set<int> rank_model_mps_;                 // their model-parallel ranks
  std::map<int, std::string> model_files_;       // mp rank -> mp_rank_XX_model_states.pt
  bool any_optimizer_file_ = false;              // of any model-parallel rank
  std::set<std::string> prefixes_;
  std::string prefix_;

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

  Catalog catalog_;
  absl::flat_hash_map<std::string, int> index_;
  absl::flat_hash_map<std::string, int> file_index_;
};

}  // namespace

bool ZeroInput::Probe(const std::string& path) const {
  std::error_code error;
  if (!fs::is_directory(path, error)) return false;
  const FolderScan here = ScanFolder(path);
  if (here.pipeline) return false;
  if (here.Checkpoint()) return true;
  // A parent folder: `latest` or --tag picks the checkpoint at Read.
  for (const std::string& name : SubFolders(path)) {
    if (ScanFolder(JoinPath(path, name)).Checkpoint()) return true;
  }
  return false;
}

absl::StatusOr<InputModel> ZeroInput::Read(const std::string& path,
                                           const ReadOptions& options) const {
  ASSIGN_OR_RETURN(auto folder_tag, ResolveCheckpointFolder(path, options.tag));
  ZeroReader reader(folder_tag.first, folder_tag.second, options);
  return reader.Read();
}

namespace {
const InputFormatRegistration<ZeroInput> register_input;
}  // namespace

}  // namespace reshard
