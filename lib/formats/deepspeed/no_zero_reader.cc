#include "lib/formats/deepspeed/no_zero_reader.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/catalog.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/moe_experts.h"
#include "lib/formats/deepspeed/zero_catalog_builder.h"
#include "lib/formats/deepspeed/zero_layout.h"
#include "lib/formats/deepspeed/zero_pickle.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace zero_internal {
namespace {

using Kind = PickleValue::Kind;

// Model-parallel ranks (mp_rank_XX files) read as parts, as many as reshard writes.
constexpr int kMaxModelParallelParts = 4096;

class NoZeroReader {
 public:
  NoZeroReader(const std::string& dir, const std::string& tag, const ZeroFolderFiles& files,
               const ReadOptions& options)
      : dir_(dir), tag_(tag), files_(files), options_(options), builder_(dir) {}

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

  // The refusal for expert files beside ZeRO-3 model states (`name`): DeepSpeed's engine
  // asserts "MoE not supported with Stage 3", so the files are of two saves.
  absl::Status MoeWithZero3(const std::string& name) const {
    return absl::DataLossError(absl::StrCat(
        dir_, ": ", name, " (ZeRO-3 model states) beside the expert files of a DeepSpeed "
        "mixture-of-experts save (", files_.moe_files.front().second,
        "): DeepSpeed does not run MoE with ZeRO-3 (\"MoE not supported with Stage 3\"), so the "
        "files are of two saves"));
  }

  // A folder with model-states files only: a ZeRO checkpoint whose optimizer files were not
  // copied (refused), or DeepSpeed without ZeRO (the weights are `module`, and with
  // mixture-of-experts the expert files).
  absl::StatusOr<InputModel> ReadWithoutOptimizerFiles() {
    const bool moe = !files_.moe_files.empty();
    if (moe && !files_.rank_model_names.empty()) {
      return MoeWithZero3(files_.rank_model_names.front());
    }
    if (moe && files_.model_files.empty()) {
      return absl::DataLossError(
          absl::StrCat(dir_, " holds the expert files of a DeepSpeed mixture-of-experts save (",
                       files_.moe_files.front().second,
                       ") but no mp_rank_00_model_states.pt: the dense parameters live there. ",
                       kPartialSaveHint));
    }
    if (!files_.rank_model_names.empty()) {
      // zero_pp_rank_N_mp_rank_XX_model_states.pt: only ZeRO-3 names model states so. A file
      // that cannot be read only costs the message its bf16_ prefix.
      ZeroSigns signs;
      auto model = OpenArchive(files_.rank_model_names.front());
      if (model.ok()) signs = ReadZeroSigns(**model);
      signs.what = "ZeRO-3";
      return MissingOptimizerFiles(signs, files_.rank_model_mps);
    }
    if (files_.model_files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir_,
          " holds no DeepSpeed checkpoint files (zero_pp_rank_N_mp_rank_00_optim_states.pt, "
          "mp_rank_00_model_states.pt)"));
    }
    std::set<int> mps;
    for (const auto& [mp, name] : files_.model_files) mps.insert(mp);
    // The lowest rank's file first: a ZeRO run is refused whatever else is missing.
    ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> first,
                     OpenArchive(files_.model_files.begin()->second));
    if (const ZeroSigns signs = ReadZeroSigns(*first); !signs.what.empty()) {
      return MissingOptimizerFiles(signs, mps);
    }
    const int parts = files_.model_files.rbegin()->first + 1;
    if (parts > kMaxModelParallelParts) {
      return absl::UnimplementedError(absl::StrCat(
          dir_, ": ", files_.model_files.rbegin()->second, " names model-parallel rank ", parts - 1,
          "; at most ", kMaxModelParallelParts, " parts are read"));
    }
    for (int mp = 0; mp < parts; ++mp) {
      if (files_.model_files.count(mp) == 0) {
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
      return absl::FailedPreconditionError(
          absl::StrCat(first->path(),
                       ": --include-optimizer: DeepSpeed without ZeRO keeps the optimizer state in "
                       "`optimizer`",
                       moe ? " (with mixture-of-experts, each expert-parallel rank's in "
                             "expp_rank_{ep}_mp_rank_XX_optim_states.pt)"
                           : "",
                       ", keyed by parameter index rather than name, so reshard cannot name the "
                       "Adam moments; leave out --include-optimizer"));
    }
    MoeSave experts;
    if (moe) {
      std::vector<int64_t> num_experts;
      const PickleValue* recorded = PickleField(first->root(), "num_experts");
      if (std::optional<int64_t> every = PickleInt(recorded); every.has_value()) {
        num_experts.push_back(*every);  // DeepSpeed's legacy MoE layout: every layer's experts
      } else if (const auto* list = recorded;
                 list != nullptr && list->kind == Kind::kList) {
        for (const PickleValue* item : list->items) {
          std::optional<int64_t> n = PickleInt(item);
          if (!n.has_value()) {
            return Corrupt(*first, absl::StrCat("num_experts holds ", DescribePickleValue(item),
                                                "; expected a number of experts per MoE layer"));
          }
          num_experts.push_back(*n);
        }
      }
      ASSIGN_OR_RETURN(experts, ArrangeMoeFiles(dir_, files_, parts, num_experts));
    }
    InputModel model;
    model.format = kZeroFormatId;
    size_t tensors = 0;
    for (int mp = 0; mp < parts; ++mp) {
      std::unique_ptr<TorchArchive> archive;
      if (mp == 0) {
        archive = std::move(first);
      } else {
        ASSIGN_OR_RETURN(archive, OpenArchive(files_.model_files.at(mp)));
        const ZeroSigns signs = ReadZeroSigns(*archive);
        if (!signs.what.empty()) return MissingOptimizerFiles(signs, mps);
      }
      ASSIGN_OR_RETURN(Catalog part, ReadModule(*archive, moe ? &experts.files.at(mp) : nullptr,
                                                experts.legacy));
      tensors = part.tensors.size();
      model.parts.push_back(std::move(part));
      model.part_names.push_back(archive->path());
    }
    model.arrangement = parts == 1 ? "single-file" : "model-parallel-parts";
    if (moe) {
      if (parts == 1) model.arrangement = "sharded";
      model.description = MoeDescription(experts, parts, tensors);
      return model;
    }
    model.description =
        absl::StrCat("DeepSpeed (no ZeRO), weights from ",
                     parts == 1 ? std::string("mp_rank_00")
                                : absl::StrCat("mp_rank_{00..", TwoDigits(parts - 1), "}"),
                     "_model_states.pt module, ",
                     parts == 1 ? "" : absl::StrCat(parts, " model-parallel parts, "), "tag ", tag_,
                     ", ", tensors, parts == 1 ? " tensors" : " tensors each");
    return model;
  }

  // inspect's sentence for a mixture-of-experts save: "DeepSpeed MoE (no ZeRO), 2 MoE layers x
  // 8 experts, EP 4, TP 2, weights from mp_rank_{00..01}_model_states.pt module and
  // layer_{0..1}_expert_{0..7}_mp_rank_{00..01}_model_states.pt, tag global_step10, 40 tensors
  // each".
  std::string MoeDescription(const MoeSave& experts, int parts, size_t tensors) const {
    const int layers = experts.legacy ? moe_layers_ : static_cast<int>(experts.experts.size());
    const int most = *std::max_element(experts.experts.begin(), experts.experts.end());
    const bool same = std::all_of(experts.experts.begin(), experts.experts.end(),
                                  [&](int n) { return n == most; });
    const std::string mp =
        parts == 1 ? std::string("00") : absl::StrCat("{00..", TwoDigits(parts - 1), "}");
    return absl::StrCat(
        "DeepSpeed MoE (no ZeRO), ", layers, " MoE layer", layers == 1 ? "" : "s", " x ",
        same ? absl::StrCat(most, " experts")
             : absl::StrCat("{", absl::StrJoin(experts.experts, ", "), "} experts"),
        ", EP ", experts.ep > 0 ? absl::StrCat(experts.ep) : "not recorded (no expp_rank files)",
        ", TP ", parts, ", weights from mp_rank_", mp, "_model_states.pt module and ",
        experts.legacy ? std::string()
                       : absl::StrCat("layer_",
                                      layers == 1 ? std::string("0")
                                                  : absl::StrCat("{0..", layers - 1, "}"),
                                      "_"),
        "expert_", most == 1 ? std::string("0") : absl::StrCat("{0..", most - 1, "}"), "_mp_rank_", mp,
        "_model_states.pt", experts.legacy ? " (DeepSpeed's legacy layout: every layer's expert g in one file)" : "",
        ", tag ", tag_, ", ", tensors, parts == 1 ? " tensors" : " tensors each");
  }

  // The tensors of a model-states file's `module` (a state dict), in its order, under their
  // own names and dtypes, and with mixture-of-experts the experts of `expert_files` ([layer]
  // [expert] -> file name) where the model's state dict has them. Tied weights are two names of
  // one storage: identical pieces.
  absl::StatusOr<Catalog> ReadModule(const TorchArchive& model,
                                     const std::vector<std::vector<std::string>>* expert_files,
                                     bool legacy) {
    builder_ = ZeroCatalogBuilder(dir_);
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
    RETURN_IF_ERROR(builder_.AddStateDict(model, module, "module", nullptr));
    if (expert_files != nullptr) {
      RETURN_IF_ERROR(AddExpertTensors(dir_, *expert_files, legacy, builder_));
      std::set<std::string> modules;
      for (const CatalogTensor& tensor : builder_.catalog().tensors) {
        if (auto key = ParseExpertKey(tensor.name); key.has_value()) modules.insert(key->module);
      }
      moe_layers_ = static_cast<int>(modules.size());
    }
    if (builder_.catalog().tensors.empty()) {
      return absl::DataLossError(absl::StrCat(model.path(), ": `module` holds no tensors"));
    }
    if (const auto* top = PickleEntries(model.root()); top != nullptr) {
      for (const auto& [key, value] : *top) {
        std::optional<std::string> name = PickleString(key);
        if (!name.has_value() || *name == "module" || IsNone(value)) continue;
        builder_.catalog().other_entries.push_back(absl::StrCat(*name, " (", BaseName(model.path()),
                                                                "): ", DescribePickleValue(value),
                                                                " (not carried)"));
      }
    }
    Catalog part = std::move(builder_.catalog());
    builder_ = ZeroCatalogBuilder(dir_);
    part.format = kZeroFormatId;
    part.Reindex();
    return part;
  }

 private:
  absl::StatusOr<std::unique_ptr<TorchArchive>> OpenArchive(const std::string& name) const {
    return TorchArchive::Open(JoinPath(dir_, name));
  }

  const std::string& dir_;
  const std::string& tag_;
  const ZeroFolderFiles& files_;
  const ReadOptions& options_;
  ZeroCatalogBuilder builder_;
  int moe_layers_ = 0;  // MoE modules the expert files hold
};

}  // namespace

absl::StatusOr<InputModel> ReadWithoutOptimizerFiles(const std::string& dir, const std::string& tag,
                                                     const ZeroFolderFiles& files,
                                                     const ReadOptions& options) {
  return NoZeroReader(dir, tag, files, options).ReadWithoutOptimizerFiles();
}

}  // namespace zero_internal
}  // namespace reshard
