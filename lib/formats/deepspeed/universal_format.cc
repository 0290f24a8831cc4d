#include "lib/formats/deepspeed/universal_format.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/zero_catalog_builder.h"
#include "lib/formats/deepspeed/zero_folder_files.h"
#include "lib/formats/deepspeed/zero_pickle.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/parallel_reads.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;
using zero_internal::Corrupt;
using zero_internal::IsNone;
using zero_internal::ListZeroFolder;
using zero_internal::ZeroCatalogBuilder;
using zero_internal::ZeroFolderFiles;

// ds_to_universal's names (deepspeed/checkpoint/constants.py).
constexpr char kZeroDir[] = "zero";
constexpr char kOptimizerStateName[] = "optimizer_state.pt";
constexpr char kParamKey[] = "param";
constexpr char kFp32State[] = "fp32";
constexpr char kStepState[] = "step";
constexpr const char* kMoments[] = {"exp_avg", "exp_avg_sq"};
// Entries of zero/ a probe looks at before giving up on finding a param folder.
constexpr int kProbeEntries = 1000;
// Entries of one param folder: a handful of state files.
constexpr int kMaxParamFolderEntries = 1000;

// Whether `dir` is a universal checkpoint folder: zero/ holds optimizer_state.pt, or a param
// folder with fp32.pt among its first kProbeEntries entries. Nothing is opened. Errors: what
// could not be looked at.
absl::StatusOr<bool> IsUniversalFolder(const std::string& dir) {
  const std::string zero = JoinPath(dir, kZeroDir);
  ASSIGN_OR_RETURN(const bool zero_folder, CheckInputFolder(zero));
  if (!zero_folder) return false;
  ASSIGN_OR_RETURN(const bool optimizer_state,
                   CheckInputExists(JoinPath(zero, kOptimizerStateName)));
  if (optimizer_state) return true;
  ASSIGN_OR_RETURN(std::vector<std::string> params, ListInputSubfolders(zero));
  if (params.size() > static_cast<size_t>(kProbeEntries)) params.resize(kProbeEntries);
  for (const std::string& name : params) {
    ASSIGN_OR_RETURN(const bool fp32, CheckInputExists(JoinPath(JoinPath(zero, name),
                                                                absl::StrCat(kFp32State, ".pt"))));
    if (fp32) return true;
  }
  return false;
}

std::string NotUniversal(const std::string& folder) {
  return absl::StrCat(folder, " is not a DeepSpeed universal checkpoint (no ", kZeroDir,
                      "/ folder holding ", kOptimizerStateName, " or <param>/fp32.pt)");
}

// The universal folder to read and its tag: `path` itself when it is one, else `path/<tag>` with
// the tag from `tag_option` or `path/latest_universal`.
absl::StatusOr<std::pair<std::string, std::string>> ResolveUniversalFolder(
    const std::string& path, const std::string& tag_option) {
  ASSIGN_OR_RETURN(const bool path_is_folder, CheckInputFolder(path));
  if (!path_is_folder) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a DeepSpeed universal checkpoint is a folder, not a file"));
  }
  ASSIGN_OR_RETURN(const bool here, IsUniversalFolder(path));
  if (!tag_option.empty()) {
    RETURN_IF_ERROR(CheckTag(tag_option, "from --tag"));
    const std::string folder = JoinPath(path, tag_option);
    ASSIGN_OR_RETURN(const bool tag_folder, CheckInputFolder(folder));
    if (tag_folder) {
      ASSIGN_OR_RETURN(const bool universal, IsUniversalFolder(folder));
      if (!universal) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tag ", tag_option, ": ", NotUniversal(folder)));
      }
      return std::make_pair(folder, tag_option);
    }
    if (here && BaseName(path) == tag_option) return std::make_pair(path, tag_option);
    return absl::NotFoundError(absl::StrCat("--tag ", tag_option, ": there is no folder ", folder));
  }
  if (here) return std::make_pair(path, BaseName(path));
  const std::string tracker = JoinPath(path, kUniversalTrackerName);
  ASSIGN_OR_RETURN(std::optional<std::string> contents, ReadTrackerFile(tracker));
  if (!contents.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(NotUniversal(path), ", and holds no ",
                                                   kUniversalTrackerName,
                                                   " file naming one. Pass --tag to choose one"));
  }
  const std::string tag = *std::move(contents);
  if (tag.empty()) {
    return absl::DataLossError(absl::StrCat(tracker, " is empty. Pass --tag to choose one"));
  }
  RETURN_IF_ERROR(CheckTag(tag, absl::StrCat("from ", tracker)));
  const std::string folder = JoinPath(path, tag);
  ASSIGN_OR_RETURN(const bool tag_folder, CheckInputFolder(folder));
  if (!tag_folder) {
    return absl::NotFoundError(absl::StrCat(tracker, " names ", tag, ", but there is no folder ",
                                            folder, ". Pass --tag to choose one"));
  }
  ASSIGN_OR_RETURN(const bool universal, IsUniversalFolder(folder));
  if (!universal) {
    return absl::DataLossError(
        absl::StrCat(tracker, " names ", tag, ", but ", NotUniversal(folder)));
  }
  return std::make_pair(folder, tag);
}

// A plain value of a universal .pt file for other_entries: "0", "True", "[3, 4]"; its kind
// for anything else ("object of deepspeed.checkpoint.constants.SubparamShape").
std::string ValueText(const TorchArchive& archive, const PickleValue* value) {
  switch (value->kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return value->boolean ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(value->integer);
    case Kind::kFloat:
      return absl::StrCat(value->real);
    case Kind::kString:
      return absl::StrCat("\"", value->text, "\"");
    default:
      break;
  }
  if (absl::StatusOr<std::optional<TensorLocation>> location = archive.Tensor(value, "value");
      location.ok() && location->has_value()) {
    return absl::StrCat("tensor ", DTypeName((*location)->dtype), " ",
                        ShapeToString((*location)->shape));
  }
  if (std::optional<std::vector<int64_t>> shape = PickleShape(value); shape.has_value()) {
    return ShapeToString(*shape);
  }
  return DescribePickleValue(value);
}

// Whether a view of `shape` with `strides` is dense row-major (extent-1 dims ignored).
bool IsContiguous(const Shape& shape, const std::vector<int64_t>& strides) {
  const std::vector<int64_t> dense = RowMajorStrides(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 1 && strides[d] != dense[d]) return false;
  }
  return true;
}

class UniversalReader {
 public:
  UniversalReader(std::string dir, std::string tag, const ReadOptions& options)
      : dir_(std::move(dir)),
        zero_(JoinPath(dir_, kZeroDir)),
        tag_(std::move(tag)),
        options_(options),
        builder_(dir_) {}

  absl::StatusOr<InputModel> Read() {
    RETURN_IF_ERROR(ReadModelStates());
    ASSIGN_OR_RETURN(std::vector<std::string> params, ListParams());
    // Each param folder's listing and state files fetched several at once (from S3 each costs
    // its round trips), taken in order.
    RETURN_IF_ERROR(ReadInOrder<ParamFiles>(
        static_cast<int>(params.size()), ParallelReadOptions(),
        [&](int i) { return FetchParam(params[i]); },
        [](const ParamFiles& files) { return files.bytes; },
        [&](int i, ParamFiles files) { return ReadParam(params[i], files); }));
    for (const std::string& name : trainable_) {
      if (!params_.contains(name)) {
        return absl::DataLossError(absl::StrCat(
            JoinPath(zero_, name), " is missing: param_shapes of ", model_->path(),
            " lists trainable param \"", name,
            "\", whose fp32 weights would be there (a partial copy of the universal checkpoint?)"));
      }
    }
    int module_tensors = 0;
    if (model_ != nullptr) {
      ASSIGN_OR_RETURN(module_tensors, AddModuleTensors());
      RETURN_IF_ERROR(AddAliases());
    }
    Catalog catalog = std::move(builder_.catalog());
    catalog.format = kUniversalFormatId;
    for (std::string& entry : notes_) catalog.other_entries.push_back(std::move(entry));
    catalog.Reindex();

    InputModel model;
    model.format = kUniversalFormatId;
    model.arrangement = "sharded";
    model.description = absl::StrCat(
        "DeepSpeed universal checkpoint ", tag_, ", ", params.size(),
        params.size() == 1 ? " parameter" : " parameters",
        version_.empty() ? "" : absl::StrCat(" (universal_checkpoint_version ", version_, ")"));
    if (module_tensors > 0) {
      absl::StrAppend(&model.description, ", ", module_tensors,
                      module_tensors == 1 ? " tensor" : " tensors", " from ",
                      BaseName(model_->path()), " module");
    }
    model.parts.push_back(std::move(catalog));
    model.part_names.push_back(dir_);
    return model;
  }

 private:
  // The lowest-ranked model-states file, when the folder holds one: param_shapes (the order and
  // a bare tensor's shape), shared_params, frozen_param_shapes, module, the version.
  absl::Status ReadModelStates() {
    ASSIGN_OR_RETURN(ZeroFolderFiles files, ListZeroFolder(dir_));
    std::string name;
    if (auto it = files.model_files.find(0); it != files.model_files.end()) {
      name = it->second;
    } else if (!files.rank_model_files.empty()) {
      name = files.rank_model_files.begin()->second;
    } else {
      return absl::OkStatus();
    }
    tensor_parallel_ = files.model_files.size() > 1 ||
                       (!files.rank_model_mps.empty() && *files.rank_model_mps.rbegin() > 0);
    ASSIGN_OR_RETURN(model_, TorchArchive::Open(JoinPath(dir_, name)));
    const PickleValue* root = model_->root();
    if (PickleEntries(root) == nullptr) {
      return Corrupt(*model_, absl::StrCat("holds ", DescribePickleValue(root),
                                           "; expected a DeepSpeed model-states dict"));
    }
    const PickleValue* info = PickleField(root, "universal_checkpoint_info");
    if (const PickleValue* version = PickleField(info, "universal_checkpoint_version");
        version != nullptr) {
      version_ = ValueText(*model_, version);
    }
    const PickleValue* shapes = PickleField(root, "param_shapes");
    std::vector<const PickleValue*> groups;
    if (const auto* items = PickleItems(shapes); items != nullptr) {
      groups.assign(items->begin(), items->end());
    } else if (PickleEntries(shapes) != nullptr) {
      groups.push_back(shapes);
    } else if (!IsNone(shapes)) {
      return Corrupt(*model_, absl::StrCat("param_shapes is ", DescribePickleValue(shapes),
                                           "; expected a list of dicts name -> shape"));
    }
    for (const PickleValue* group : groups) {
      RETURN_IF_ERROR(ReadShapes(group, "param_shapes", param_shapes_, &trainable_));
    }
    const PickleValue* frozen = PickleField(root, "frozen_param_shapes");
    if (PickleEntries(frozen) != nullptr) {
      RETURN_IF_ERROR(ReadShapes(frozen, "frozen_param_shapes", frozen_shapes_, nullptr));
    }
    if (const auto* shared = PickleEntries(PickleField(root, "shared_params")); shared != nullptr) {
      for (const auto& [key, value] : *shared) {
        std::optional<std::string> alias = PickleString(key);
        std::optional<std::string> owner = PickleString(value);
        if (!alias.has_value() || !owner.has_value()) {
          return Corrupt(*model_, "shared_params holds an entry that is not alias name -> owner");
        }
        aliases_.emplace_back(*std::move(alias), *std::move(owner));
      }
    }
    return absl::OkStatus();
  }

  // The (name, shape) entries of dict `dict` (`what` in messages) into `shapes`, the names in
  // order into `order` when given.
  absl::Status ReadShapes(const PickleValue* dict, absl::string_view what,
                          absl::flat_hash_map<std::string, Shape>& shapes,
                          std::vector<std::string>* order) {
    const auto* entries = PickleEntries(dict);
    if (entries == nullptr) {
      return Corrupt(*model_, absl::StrCat(what, " holds ", DescribePickleValue(dict),
                                           "; expected a dict name -> shape"));
    }
    for (const auto& [key, value] : *entries) {
      std::optional<std::string> name = PickleString(key);
      std::optional<std::vector<int64_t>> shape = PickleShape(value);
      if (!name.has_value() || !shape.has_value()) {
        return Corrupt(*model_, absl::StrCat(what, " holds an entry that is not name -> shape (",
                                             DescribePickleValue(key), " -> ",
                                             DescribePickleValue(value), ")"));
      }
      if (!NumElements(*shape).ok()) {
        return Corrupt(*model_, absl::StrCat(what, "[\"", *name, "\"] is ", ShapeToString(*shape),
                                             ": too many elements"));
      }
      if (static_cast<int64_t>(shapes.size()) >= kMaxUniversalParams) {
        return absl::InvalidArgumentError(absl::StrCat(
            model_->path(), ": ", what, " lists more than ", kMaxUniversalParams, " params"));
      }
      if (shapes.emplace(*name, *shape).second && order != nullptr) order->push_back(*name);
    }
    return absl::OkStatus();
  }

  // The param folders of zero/ (in name order) into `unlisted`, from one listing through its
  // driver; other files are noted in name order, hidden entries skipped, and anything that is
  // neither a file nor a folder (a FIFO, socket or device) refused.
  absl::Status ListZeroParams(std::vector<std::string>& unlisted) {
    ASSIGN_OR_RETURN(InputListing listing, ListInput(zero_));
    if (listing.files.size() + listing.folders.size() + listing.others.size() >
        static_cast<size_t>(kMaxUniversalParams + 16)) {
      return absl::InvalidArgumentError(absl::StrCat(zero_, " holds more than ",
                                                     kMaxUniversalParams, " entries; at most ",
                                                     kMaxUniversalParams, " params are read"));
    }
    const auto hidden = [](const std::string& name) { return name.empty() || name[0] == '.'; };
    for (const std::string& name : listing.others) {
      if (hidden(name)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          JoinPath(zero_, name),
          " is neither a regular file nor a folder; a universal checkpoint's zero/ holds param "
          "folders and optimizer_state.pt"));
    }
    for (std::string& name : listing.folders) {
      if (!hidden(name)) unlisted.push_back(std::move(name));
    }
    for (const std::string& name : listing.files) {
      if (hidden(name) || name == kOptimizerStateName) continue;
      notes_.push_back(absl::StrCat(kZeroDir, "/", name, ": not read"));
    }
    return absl::OkStatus();
  }

  // The param folders of zero/, in param_shapes order, then the others in natural order. Other
  // regular files are noted; entries that are neither files nor folders are refused.
  absl::StatusOr<std::vector<std::string>> ListParams() {
    std::vector<std::string> unlisted;
    RETURN_IF_ERROR(ListZeroParams(unlisted));
    if (static_cast<int64_t>(unlisted.size()) > kMaxUniversalParams) {
      return absl::InvalidArgumentError(absl::StrCat(zero_, " holds ", unlisted.size(),
                                                     " param folders; at most ",
                                                     kMaxUniversalParams, " are read"));
    }
    params_.insert(unlisted.begin(), unlisted.end());
    std::vector<std::string> ordered;
    absl::flat_hash_set<std::string> taken;
    for (const std::string& name : trainable_) {
      if (params_.contains(name)) {
        ordered.push_back(name);
        taken.insert(name);
      }
    }
    std::vector<std::string> rest;
    for (std::string& name : unlisted) {
      if (!taken.contains(name)) rest.push_back(std::move(name));
    }
    std::sort(rest.begin(), rest.end(), NaturalLess);
    for (std::string& name : rest) ordered.push_back(std::move(name));
    return ordered;
  }

  // One state file of a param folder, located: a dict's 'param' or a bare tensor.
  struct State {
    CatalogTensor tensor;
    bool bare = false;
  };

  using Opened = absl::StatusOr<std::unique_ptr<TorchArchive>>;

  // What a param folder holds, fetched: its state files (names without ".pt"), and those of
  // them that are read, opened (or the error opening them).
  struct ParamFiles {
    std::set<std::string> states;
    std::map<std::string, Opened> opened;
    uint64_t bytes = 0;  // the opened archives' parsed values
  };

  // Lists zero/<name> and opens the state files ReadParam reads: fp32, and with
  // include_optimizer both moments (when both are there) and step. Runs on a worker thread:
  // reads only members that do not change while params are read.
  absl::StatusOr<ParamFiles> FetchParam(const std::string& name) const {
    const std::string folder = JoinPath(zero_, name);
    ParamFiles files;
    ASSIGN_OR_RETURN(const std::vector<std::string> names, ListInputFolderEntries(folder));
    if (names.size() > static_cast<size_t>(kMaxParamFolderEntries)) {
      return absl::InvalidArgumentError(
          absl::StrCat(folder, " holds more than ", kMaxParamFolderEntries, " entries"));
    }
    for (const std::string& file : names) {
      if (absl::EndsWith(file, ".pt") && file.size() > 3)
        files.states.insert(file.substr(0, file.size() - 3));
    }
    std::vector<std::string> read = {kFp32State};
    if (options_.include_optimizer) {
      if (files.states.count(kMoments[0]) > 0 && files.states.count(kMoments[1]) > 0) {
        read.insert(read.end(), {kMoments[0], kMoments[1]});
      }
      read.push_back(kStepState);
    }
    for (const std::string& state : read) {
      if (files.states.count(state) == 0) continue;
      Opened archive = TorchArchive::Open(JoinPath(folder, state + ".pt"));
      if (archive.ok()) files.bytes += (*archive)->metadata_bytes();
      files.opened.emplace(state, std::move(archive));
    }
    return files;
  }

  // Reads state file `<param>/<state>.pt` (`opened`) as tensor `tensor_name`. For fp32, the
  // dict's other entries go to other_entries. A bare 1-D tensor takes the param's shape from
  // param_shapes.
  absl::StatusOr<State> ReadState(const std::string& param, const std::string& state,
                                  const std::string& tensor_name, const Opened& opened) {
    if (!opened.ok()) return opened.status();
    const std::unique_ptr<TorchArchive>& archive = *opened;
    const PickleValue* root = archive->root();
    State result;
    const PickleValue* value = root;
    result.bare = TorchArchive::IsTensor(root);
    if (!result.bare) {
      const auto* entries = PickleEntries(root);
      if (entries == nullptr) {
        return Corrupt(*archive,
                       absl::StrCat("holds ", DescribePickleValue(root), "; expected a dict with '",
                                    kParamKey, "' (or a bare tensor), as ds_to_universal writes"));
      }
      value = PickleField(root, kParamKey);
      if (value == nullptr) {
        return Corrupt(
            *archive, absl::StrCat("the dict has no '", kParamKey, "' entry (the param's tensor)"));
      }
      for (const auto& [key, item] : *entries) {
        std::optional<std::string> name = PickleString(key);
        if (!name.has_value()) {
          return Corrupt(*archive, absl::StrCat("the dict has a key that is ",
                                                DescribePickleValue(key), ", not a name"));
        }
        if (*name == kParamKey || state != kFp32State) continue;
        notes_.push_back(absl::StrCat(param, ".", *name, ": ", ValueText(*archive, item)));
      }
    }
    const std::string what = result.bare ? "the tensor" : absl::StrCat("'", kParamKey, "'");
    ASSIGN_OR_RETURN(std::optional<TensorLocation> location, archive->Tensor(value, what));
    if (!location.has_value()) {
      return Corrupt(*archive,
                     absl::StrCat(what, " is ", DescribePickleValue(value), ", not a tensor"));
    }
    if (result.bare && location->shape.size() == 1) {
      RETURN_IF_ERROR(ShapeBareTensor(*archive, param, *location));
    }
    result.tensor =
        CatalogTensorAt(tensor_name, *std::move(location), builder_.FileIndex(*archive));
    return result;
  }

  // ZeRO-3's bare flat tensor of `param` takes the shape param_shapes gives it (zero_to_fp32's
  // view), when it has as many elements and is contiguous; otherwise it stays 1-D.
  absl::Status ShapeBareTensor(const TorchArchive& archive, const std::string& param,
                               TensorLocation& location) {
    auto it = param_shapes_.find(param);
    if (it == param_shapes_.end() || it->second == location.shape) return absl::OkStatus();
    const int64_t numel = NumElementsUnchecked(it->second);
    if (numel != location.shape[0]) {
      return Corrupt(archive, absl::StrCat("the bare tensor has ", location.shape[0],
                                           " elements, but param_shapes of ", model_->path(),
                                           " gives \"", param, "\" the shape ",
                                           ShapeToString(it->second), " (", numel, " elements)"));
    }
    if (!IsContiguous(location.shape, location.strides)) {
      notes_.push_back(absl::StrCat(param, ": a strided 1-D tensor, kept 1-D"));
      return absl::OkStatus();
    }
    location.shape = it->second;
    location.strides = RowMajorStrides(location.shape);
    return absl::OkStatus();
  }

  // The param of folder zero/<name> (and its moments with include_optimizer), from `fetched`.
  absl::Status ReadParam(const std::string& name, const ParamFiles& fetched) {
    const std::string folder = JoinPath(zero_, name);
    const std::set<std::string>& files = fetched.states;
    if (files.count(kFp32State) == 0) {
      return absl::DataLossError(absl::StrCat(
          folder,
          " has no fp32.pt (the param's fp32 weights): a partial copy of the universal "
          "checkpoint?"));
    }
    ASSIGN_OR_RETURN(State fp32, ReadState(name, kFp32State, name, fetched.opened.at(kFp32State)));
    const Shape shape = fp32.tensor.shape;
    RETURN_IF_ERROR(builder_.Add(std::move(fp32.tensor)));
    for (const std::string& state : files) {
      bool known = state == kFp32State || state == kStepState;
      for (const char* moment : kMoments) known |= state == moment;
      if (!known) notes_.push_back(absl::StrCat(name, ".", state, ": ", state, ".pt, not read"));
    }
    if (!options_.include_optimizer) return absl::OkStatus();
    const bool has_avg = files.count(kMoments[0]) > 0;
    const bool has_avg_sq = files.count(kMoments[1]) > 0;
    if (!has_avg && !has_avg_sq) {
      notes_.push_back(absl::StrCat(name, ": no optimizer moments (", kMoments[0], ".pt, ",
                                    kMoments[1], ".pt)"));
    } else if (!has_avg || !has_avg_sq) {
      return absl::DataLossError(absl::StrCat(folder, " has ", kMoments[has_avg ? 0 : 1],
                                              ".pt but no ", kMoments[has_avg ? 1 : 0],
                                              ".pt: a partial copy of the universal checkpoint?"));
    } else {
      for (const char* moment : kMoments) {
        ASSIGN_OR_RETURN(State state, ReadState(name, moment, absl::StrCat(name, ".", moment),
                                                fetched.opened.at(moment)));
        if (state.tensor.shape != shape) {
          return absl::DataLossError(absl::StrCat(
              JoinPath(folder, absl::StrCat(moment, ".pt")), ": the tensor has shape ",
              ShapeToString(state.tensor.shape), ", but fp32.pt's is ", ShapeToString(shape)));
        }
        RETURN_IF_ERROR(builder_.Add(std::move(state.tensor)));
      }
    }
    if (files.count(kStepState) > 0) RETURN_IF_ERROR(ReadStep(name, fetched.opened.at(kStepState)));
    return absl::OkStatus();
  }

  // zero/<param>/step.pt (`opened`): a bare value (int, or a 0-d tensor for newer torch Adam),
  // noted.
  absl::Status ReadStep(const std::string& name, const Opened& opened) {
    if (!opened.ok()) return opened.status();
    const std::unique_ptr<TorchArchive>& archive = *opened;
    notes_.push_back(
        absl::StrCat(name, ".", kStepState, ": ", ValueText(*archive, archive->root())));
    return absl::OkStatus();
  }

  // The tensors of `module` zero/ does not hold (buffers, frozen params); returns how many.
  absl::StatusOr<int> AddModuleTensors() {
    const PickleValue* module = PickleField(model_->root(), "module");
    if (module == nullptr || IsNone(module)) return 0;
    if (tensor_parallel_) {
      notes_.push_back(absl::StrCat("module (", BaseName(model_->path()),
                                    "): not read, it holds one tensor-parallel rank's slices"));
      return 0;
    }
    const auto* entries = PickleEntries(module);
    if (entries == nullptr) {
      if (module->kind == Kind::kDict || module->IsObjectOf("collections", "OrderedDict")) {
        return 0;
      }
      return Corrupt(*model_, absl::StrCat("`module` is ", DescribePickleValue(module),
                                           "; expected a state dict"));
    }
    absl::flat_hash_set<std::string> aliases;
    for (const auto& [alias, owner] : aliases_) aliases.insert(alias);
    int added = 0;
    for (const auto& [key, value] : *entries) {
      std::optional<std::string> name = PickleString(key);
      if (!name.has_value() || name->empty()) {
        return Corrupt(*model_, absl::StrCat("`module` has a key that is ",
                                             DescribePickleValue(key), ", not a name"));
      }
      if (builder_.Find(*name) >= 0 || aliases.contains(*name)) continue;
      if (!TorchArchive::IsTensor(value)) {
        notes_.push_back(
            absl::StrCat("module.", *name, ": ", DescribePickleValue(value), " (not carried)"));
        continue;
      }
      const std::string what = absl::StrCat("module[\"", *name, "\"]");
      ASSIGN_OR_RETURN(CatalogTensor tensor, builder_.WholeTensor(*model_, value, *name, what));
      if (auto frozen = frozen_shapes_.find(*name); frozen != frozen_shapes_.end() &&
                                                    NumElementsUnchecked(frozen->second) > 0 &&
                                                    NumElementsUnchecked(tensor.shape) == 0) {
        return absl::UnimplementedError(absl::StrCat(
            model_->path(), ": frozen param \"", *name,
            "\" is an empty ZeRO-3 placeholder in `module`, and zero/ has no folder for it: its "
            "data is in the original checkpoint's frozen_param_fragments, which ds_to_universal "
            "does not convert; read the original ZeRO-3 checkpoint instead"));
      }
      RETURN_IF_ERROR(builder_.Add(std::move(tensor)));
      ++added;
    }
    return added;
  }

  // Tied aliases (shared_params) zero/ does not hold: the owner's tensor under another name.
  absl::Status AddAliases() {
    for (const auto& [alias, owner] : aliases_) {
      if (builder_.Find(alias) >= 0) continue;
      const int index = builder_.Find(owner);
      if (index < 0) {
        notes_.push_back(
            absl::StrCat(alias, ": tied to ", owner, ", which is not in the checkpoint"));
        continue;
      }
      CatalogTensor tensor = builder_.catalog().tensors[index];
      tensor.name = alias;
      RETURN_IF_ERROR(builder_.Add(std::move(tensor)));
    }
    return absl::OkStatus();
  }

  const std::string dir_;
  const std::string zero_;
  const std::string tag_;
  const ReadOptions& options_;
  ZeroCatalogBuilder builder_;
  std::unique_ptr<TorchArchive> model_;  // the model-states file; null without one
  bool tensor_parallel_ = false;         // model-states files of mp rank > 0
  std::string version_;                  // universal_checkpoint_version, as text
  std::vector<std::string> trainable_;   // param_shapes' names, in order
  absl::flat_hash_map<std::string, Shape> param_shapes_;
  absl::flat_hash_map<std::string, Shape> frozen_shapes_;
  std::vector<std::pair<std::string, std::string>> aliases_;  // shared_params: alias, owner
  absl::flat_hash_set<std::string> params_;                   // the param folders of zero/
  std::vector<std::string> notes_;                            // other_entries, in order
};

}  // namespace

absl::StatusOr<bool> UniversalInput::Probe(const std::string& path) const {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return false;
  ASSIGN_OR_RETURN(const bool universal, IsUniversalFolder(path));
  if (universal) return true;
  return CheckInputFile(JoinPath(path, kUniversalTrackerName));
}

absl::StatusOr<InputModel> UniversalInput::Read(const std::string& path,
                                                const ReadOptions& options) const {
  ASSIGN_OR_RETURN(auto folder_tag, ResolveUniversalFolder(path, options.tag));
  return UniversalReader(std::move(folder_tag.first), std::move(folder_tag.second), options).Read();
}

namespace {
const InputFormatRegistration<UniversalInput> register_input;
}  // namespace

}  // namespace reshard
