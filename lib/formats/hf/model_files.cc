#include "lib/formats/hf/model_files.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/io/file_access.h"
#include "lib/io/kvstore/location.h"
#include "nlohmann/json.hpp"
#include "re2/re2.h"

namespace reshard {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr absl::string_view kConfigName = "config.json";
constexpr absl::string_view kNemoFormat = "nemo";

constexpr absl::string_view kTokenizerNames[] = {
    "added_tokens.json", "chat_template.jinja",     "chat_template.json",
    "merges.txt",        "special_tokens_map.json", "tokenizer.json",
    "tokenizer.model",   "tokenizer_config.json",   "vocab.json",
    "vocab.txt",
};

constexpr absl::string_view kOtherModelNames[] = {
    "config.json", "generation_config.json", "preprocessor_config.json",
    "README.md",   "USE_POLICY.md",
};

// `path` without trailing '/' (a key prefix "s3://b/model/" names folder "s3://b/model").
std::string WithoutTrailingSlash(std::string path) {
  while (path.size() > 1 && absl::EndsWith(path, "/") && !absl::EndsWith(path, "://")) {
    path.pop_back();
  }
  return path;
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string NameOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool IsAtOrBelow(const std::string& path, const std::string& folder) {
  if (folder == "/") return true;
  return path == folder || absl::StartsWith(path, absl::StrCat(folder, "/"));
}

// Where files of resolved folder `real_folder` may link to: the folder itself, or for a
// Hugging Face cache snapshot (models--org--name/snapshots/<rev>) the repository folder, whose
// blobs/ holds the files the snapshot links to.
std::string LinkBoundary(const std::string& real_folder) {
  const std::filesystem::path folder(real_folder);
  const std::filesystem::path snapshots = folder.parent_path();
  const std::filesystem::path repo = snapshots.parent_path();
  if (snapshots.filename() == "snapshots" &&
      absl::StartsWith(repo.filename().string(), "models--")) {
    return repo.string();
  }
  return real_folder;
}

// PermissionDenied when a file of `files` (in folder `folder`) resolves outside the folder
// (see LinkBoundary). Only posix has symlinks; keys of other stores are what they are named.
// `inside`: the folder whose links may stay within it instead (a checkpoint's save folder, for
// its tokenizer/ subfolder); empty: `folder`.
absl::Status CheckLinksStayInside(const std::string& folder, const std::vector<ModelFile>& files,
                                  const std::string& inside = "") {
  ASSIGN_OR_RETURN(const kvstore::Location location, kvstore::ParseLocation(folder));
  if (!location.driver->has_folders() || files.empty()) return absl::OkStatus();
  const std::string& outer = inside.empty() ? folder : inside;
  ASSIGN_OR_RETURN(const std::string real_folder,
                   location.driver->ConfinedPath(outer, /*must_exist=*/true), outer);
  const std::string boundary = LinkBoundary(real_folder);
  for (const ModelFile& file : files) {
    ASSIGN_OR_RETURN(const std::string target,
                     location.driver->ConfinedPath(file.path, /*must_exist=*/true), file.path);
    if (IsAtOrBelow(target, boundary)) continue;
    std::error_code error;
    const std::filesystem::path link = std::filesystem::read_symlink(file.path, error);
    return absl::PermissionDeniedError(absl::StrCat(
        file.path, " is a symlink to ", error ? target : link.string(),
        error || link.string() == target ? "" : absl::StrCat(" (", target, ")"), ", outside ",
        boundary == real_folder ? "the folder " : "the Hugging Face cache repository ", boundary,
        "; reshard does not follow a model file's symlink out of its folder"));
  }
  return absl::OkStatus();
}

// The files of `listing` (of folder `folder`) that `keep` accepts, sized, sorted by name.
template <typename Keep>
absl::StatusOr<std::vector<ModelFile>> SelectFiles(const std::string& folder,
                                                   const InputListing& listing, Keep keep,
                                                   const std::string& inside = "") {
  std::vector<ModelFile> files;
  for (const std::string& name : listing.files) {
    if (!keep(name)) continue;
    ModelFile file;
    file.name = name;
    file.path = folder == "/" ? absl::StrCat("/", name) : absl::StrCat(folder, "/", name);
    files.push_back(std::move(file));
  }
  RETURN_IF_ERROR(CheckLinksStayInside(folder, files, inside));
  for (ModelFile& file : files) {
    ASSIGN_OR_RETURN(file.size, InputFileSize(file.path));
  }
  return files;
}

// The files `--format hf` writes for a model under Hugging Face names whatever
// --no-extra-files says: without them the output is no model.
bool IsModelDescriptionFile(absl::string_view name) {
  return name == kConfigName || name == "generation_config.json";
}

bool IsMegatronFormat(absl::string_view format) {
  return format == "megatron" || format == "megatron-torch-dist";
}

absl::string_view TorchDtypeName(DTypePolicy dtype) {
  switch (dtype) {
    case DTypePolicy::kF32:
      return "float32";
    case DTypePolicy::kBF16:
      return "bfloat16";
    case DTypePolicy::kF16:
      return "float16";
    case DTypePolicy::kKeep:
      break;
  }
  return "";
}

// The tokenizer files a NeMo input carries: the reader's `embedded` ones (a `.nemo` archive's
// tokenizer members), else those of a NeMo 2 folder's context/nemo_tokenizer/ (AutoTokenizer's
// save_pretrained output).
absl::StatusOr<std::vector<ModelFile>> NemoTokenizerFiles(
    const std::string& input, const std::vector<EmbeddedModelFile>& embedded) {
  std::vector<ModelFile> files;
  for (const EmbeddedModelFile& file : embedded) {
    files.push_back(
        ModelFile{file.name, file.path, file.size, /*in_archive=*/true, file.offset, file.member});
  }
  if (!files.empty()) return MergeModelFiles({}, std::move(files));
  const std::string folder =
      absl::StrCat(WithoutTrailingSlash(input), "/context/nemo_tokenizer");
  ASSIGN_OR_RETURN(const bool is_folder, CheckInputFolder(folder));
  if (!is_folder) return files;
  absl::StatusOr<std::vector<ModelFile>> found = FindTokenizerFiles(folder);
  if (absl::IsNotFound(found.status())) return files;
  return found;
}

}  // namespace

bool IsHuggingFaceWeightName(absl::string_view name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
      name == "pytorch_model.bin" || name == "pytorch_model.bin.index.json") {
    return true;
  }
  static const LazyRE2 kShard = {
      R"((model-\d+-of-\d+\.safetensors)|(pytorch_model-\d+-of-\d+\.bin))"};
  return RE2::FullMatch(re2::StringPiece(name.data(), name.size()), *kShard);
}

bool IsSavePretrainedModel(const InputModel& model) {
  if (model.parts.size() != 1 || model.parts[0].files.empty()) return false;
  const absl::string_view suffix = model.format == "safetensors" ? ".safetensors"
                                   : model.format == "torch"     ? ".bin"
                                                                 : "";
  if (suffix.empty()) return false;
  return std::all_of(model.parts[0].files.begin(), model.parts[0].files.end(),
                     [&](const SourceFile& file) {
                       const std::string name = NameOf(file.path);
                       return absl::EndsWith(name, suffix) && IsHuggingFaceWeightName(name);
                     });
}

std::string SavePretrainedFormatName(const InputModel& model) {
  if (!IsSavePretrainedModel(model)) return "";
  return absl::StrCat("Hugging Face model folder (",
                      model.format == "torch" ? "torch.save" : "safetensors", " files)");
}

bool IsTokenizerFileName(absl::string_view name) {
  return std::find(std::begin(kTokenizerNames), std::end(kTokenizerNames), name) !=
         std::end(kTokenizerNames);
}

bool IsModelFileName(absl::string_view name) {
  return IsTokenizerFileName(name) || absl::StartsWith(name, "LICENSE") ||
         std::find(std::begin(kOtherModelNames), std::end(kOtherModelNames), name) !=
             std::end(kOtherModelNames);
}

bool OutputIsHuggingFaceModel(absl::string_view output_format, bool consolidate) {
  return output_format == "safetensors" || output_format == "hf" ||
         (output_format == "torch" && consolidate);
}

absl::StatusOr<std::vector<ModelFile>> InputModelFiles(const std::string& input,
                                                       absl::string_view input_format) {
  if (input_format == "verl-fsdp") {
    // verl saves the model's config and tokenizer in a huggingface/ folder beside its shards.
    ScopedRemoteListingCache listings;
    const std::string folder = absl::StrCat(WithoutTrailingSlash(input), "/huggingface");
    ASSIGN_OR_RETURN(const bool is_folder, CheckInputFolder(folder));
    if (!is_folder) return std::vector<ModelFile>();
    ASSIGN_OR_RETURN(const InputListing listing, ListInput(folder));
    return SelectFiles(folder, listing,
                       [](const std::string& name) { return IsModelFileName(name); });
  }
  if (input_format != "safetensors" && input_format != "torch") return std::vector<ModelFile>();
  return FindModelFiles(input);
}

absl::StatusOr<std::vector<ModelFile>> ModelFilesToCarry(
    const std::string& input, absl::string_view input_format, absl::string_view output_format,
    bool consolidate, bool no_extra_files, const std::string& tokenizer,
    const std::vector<EmbeddedModelFile>& embedded) {
  std::vector<ModelFile> files;
  if (!OutputIsHuggingFaceModel(output_format, consolidate)) {
    if (tokenizer.empty()) return files;
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer ", tokenizer, ": a ", consolidate ? "consolidated" : "resharded", " --format ",
        output_format,
        " output is not a Hugging Face model (tokenizers are carried into safetensors, hf, and "
        "consolidated torch outputs)"));
  }
  if (IsMegatronFormat(input_format)) {
    // A Megatron checkpoint is a model under Megatron's names: only --format hf makes it a
    // Hugging Face one, with the tokenizer found beside it unless --tokenizer names one.
    if (output_format == "hf" && !no_extra_files && tokenizer.empty()) {
      ASSIGN_OR_RETURN(files, FindCheckpointTokenizerFiles(input));
    }
  } else if (input_format == kNemoFormat) {
    // NeMo's names are Megatron's too; its tokenizer is inside the archive or the folder.
    if (output_format == "hf" && !no_extra_files && tokenizer.empty()) {
      ASSIGN_OR_RETURN(files, NemoTokenizerFiles(input, embedded));
    }
  } else if (IsHfNamedTrainingFormat(input_format)) {
    // A training save is no Hugging Face model until --format hf writes it with the config
    // and tokenizer its trainer saved beside it.
    if (output_format == "hf") {
      ASSIGN_OR_RETURN(files, FindTrainingSaveModelFiles(input));
      if (no_extra_files) {
        files.erase(std::remove_if(files.begin(), files.end(),
                                   [](const ModelFile& file) {
                                     return !IsModelDescriptionFile(file.name);
                                   }),
                    files.end());
      }
    }
  } else if (!no_extra_files) {
    ASSIGN_OR_RETURN(files, InputModelFiles(input, input_format));
  }
  if (!tokenizer.empty()) {
    ASSIGN_OR_RETURN(std::vector<ModelFile> tokenizer_files, FindTokenizerFiles(tokenizer));
    files = MergeModelFiles(std::move(files), std::move(tokenizer_files));
  }
  return files;
}

absl::StatusOr<std::vector<ModelFile>> FindModelFiles(const std::string& input) {
  // On a store (s3://, mem://) the folder's one listing answers the lookups and sizes below.
  ScopedRemoteListingCache listings;
  const std::string path = WithoutTrailingSlash(input);
  ASSIGN_OR_RETURN(const bool is_folder, CheckInputFolder(path));
  std::string folder = path;
  if (!is_folder) {
    // One weight file of a Hugging Face folder: the folder is the model.
    if (!IsHuggingFaceWeightName(NameOf(path))) return std::vector<ModelFile>();
    folder = ParentOf(path);
  }
  ASSIGN_OR_RETURN(const InputListing listing, ListInput(folder));
  const auto has = [&](auto predicate) {
    return std::any_of(listing.files.begin(), listing.files.end(), predicate);
  };
  if (!has([](const std::string& name) { return name == kConfigName; }) ||
      !has([](const std::string& name) { return IsHuggingFaceWeightName(name); })) {
    return std::vector<ModelFile>();
  }
  return SelectFiles(folder, listing,
                     [](const std::string& name) { return IsModelFileName(name); });
}

bool IsHfNamedTrainingFormat(absl::string_view input_format) {
  return input_format == "deepspeed-zero" || input_format == "torch-dcp";
}

absl::StatusOr<std::vector<ModelFile>> FindTrainingSaveModelFiles(
    const std::string& input, std::vector<std::string>* looked_in) {
  ScopedRemoteListingCache listings;
  const std::string given = WithoutTrailingSlash(input);
  ASSIGN_OR_RETURN(const bool is_folder, CheckInputFolder(given));
  if (!is_folder) return std::vector<ModelFile>();
  std::vector<std::string> folders = {given};
  // HF Trainer's checkpoint folder (PREFIX_CHECKPOINT_DIR "checkpoint", "-", the step) holds
  // config.json and the tokenizer beside the weights' folder.
  static const LazyRE2 kTrainerCheckpoint = {R"(checkpoint-\d+)"};
  const std::string parent = ParentOf(given);
  const std::string parent_name = NameOf(parent);
  if (given.find('/') != std::string::npos &&
      RE2::FullMatch(re2::StringPiece(parent_name.data(), parent_name.size()),
                     *kTrainerCheckpoint)) {
    folders.push_back(parent);
  }
  for (const std::string& folder : folders) {
    if (looked_in != nullptr) looked_in->push_back(folder);
    ASSIGN_OR_RETURN(const InputListing listing, ListInput(folder));
    if (std::find(listing.files.begin(), listing.files.end(), kConfigName) ==
        listing.files.end()) {
      continue;
    }
    return SelectFiles(folder, listing,
                       [](const std::string& name) { return IsModelFileName(name); });
  }
  return std::vector<ModelFile>();
}

absl::StatusOr<std::vector<ModelFile>> FindTokenizerFiles(const std::string& dir) {
  ScopedRemoteListingCache listings;
  const std::string folder = WithoutTrailingSlash(dir);
  ASSIGN_OR_RETURN(const bool is_folder, CheckInputFolder(folder));
  if (!is_folder) {
    ASSIGN_OR_RETURN(const bool exists, CheckInputExists(folder));
    if (!exists) {
      return absl::NotFoundError(absl::StrCat("tokenizer folder ", dir, " does not exist"));
    }
    return absl::InvalidArgumentError(absl::StrCat("tokenizer folder ", dir, " is not a folder"));
  }
  ASSIGN_OR_RETURN(const InputListing listing, ListInput(folder));
  ASSIGN_OR_RETURN(std::vector<ModelFile> files,
                   SelectFiles(folder, listing,
                               [](const std::string& name) { return IsTokenizerFileName(name); }));
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("tokenizer folder ", dir,
                                            " holds no tokenizer file (looked for ",
                                            absl::StrJoin(kTokenizerNames, ", "), ")"));
  }
  return files;
}

absl::StatusOr<std::vector<ModelFile>> FindCheckpointTokenizerFiles(const std::string& input) {
  ScopedRemoteListingCache listings;
  const std::string given = WithoutTrailingSlash(input);
  ASSIGN_OR_RETURN(const bool is_folder, CheckInputFolder(given));
  if (!is_folder) return std::vector<ModelFile>();
  // One iteration's folder (iter_0000100, release) is looked in, then the save folder above.
  static const LazyRE2 kIteration = {R"(iter_\d+|release)"};
  const std::string name = NameOf(given);
  const bool iteration = RE2::FullMatch(re2::StringPiece(name.data(), name.size()), *kIteration);
  const std::string root = iteration ? ParentOf(given) : given;
  std::vector<std::string> folders = {given, absl::StrCat(given, "/tokenizer")};
  if (iteration) {
    folders.push_back(root);
    folders.push_back(absl::StrCat(root, "/tokenizer"));
  }
  for (const std::string& folder : folders) {
    ASSIGN_OR_RETURN(const bool exists, CheckInputFolder(folder));
    if (!exists) continue;
    ASSIGN_OR_RETURN(const InputListing listing, ListInput(folder));
    ASSIGN_OR_RETURN(std::vector<ModelFile> files,
                     SelectFiles(
                         folder, listing,
                         [](const std::string& file) { return IsTokenizerFileName(file); }, root));
    if (!files.empty()) return files;
  }
  return std::vector<ModelFile>();
}

absl::StatusOr<std::string> UpdateConfigDtype(absl::string_view config, absl::string_view path,
                                              DTypePolicy dtype) {
  const absl::string_view torch_dtype = TorchDtypeName(dtype);
  if (torch_dtype.empty()) return std::string(config);
  OrderedJson json = OrderedJson::parse(config.begin(), config.end(), nullptr,
                                        /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object (",
                                            json.is_discarded() ? "invalid JSON" : "another value",
                                            "); cannot set its torch_dtype for --dtype"));
  }
  bool found = false;
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!json.contains(key)) continue;
    json[key] = std::string(torch_dtype);
    found = true;
  }
  if (!found) json["torch_dtype"] = std::string(torch_dtype);
  // transformers: json.dumps(config, indent=2, sort_keys=True) + "\n".
  return json.dump(2, ' ', /*ensure_ascii=*/true, OrderedJson::error_handler_t::replace) + "\n";
}

absl::Status AddModelFiles(const std::vector<ModelFile>& files, DTypePolicy dtype,
                           const Catalog& catalog, ArrangedOutput& arranged,
                           std::vector<std::pair<std::string, std::string>>& companions) {
  std::set<std::string> taken;
  for (const OutputFileLayout& file : arranged.layout.files) taken.insert(file.name);
  for (const auto& companion : companions) taken.insert(companion.first);
  for (const ModelFile& file : files) {
    if (!taken.insert(file.name).second) continue;
    if (file.name == kConfigName) {
      if (file.size > kMaxConfigBytes) {
        return absl::ResourceExhaustedError(absl::StrCat(file.path, " is ", file.size,
                                                         " bytes; a config.json is carried up to ",
                                                         kMaxConfigBytes >> 20, " MiB"));
      }
      ASSIGN_OR_RETURN(const std::string config, ReadSmallFile(file.path, kMaxConfigBytes));
      ASSIGN_OR_RETURN(std::string updated, UpdateConfigDtype(config, file.path, dtype));
      companions.emplace_back(file.name, std::move(updated));
    } else if (file.in_archive) {
      RETURN_IF_ERROR(
          AddVerbatimRangeCopy(file.path, file.offset, file.size, file.name, catalog, arranged));
    } else if (file.size <= kModelFileCompanionBytes) {
      ASSIGN_OR_RETURN(std::string contents, ReadSmallFile(file.path, kModelFileCompanionBytes));
      companions.emplace_back(file.name, std::move(contents));
    } else {
      RETURN_IF_ERROR(AddVerbatimCopy(file.path, file.name, catalog, arranged));
    }
  }
  return absl::OkStatus();
}

std::vector<ModelFile> MergeModelFiles(std::vector<ModelFile> files, std::vector<ModelFile> extra) {
  std::map<std::string, ModelFile> by_name;
  for (ModelFile& file : files) by_name[file.name] = std::move(file);
  for (ModelFile& file : extra) by_name[file.name] = std::move(file);
  std::vector<ModelFile> merged;
  for (auto& [name, file] : by_name) merged.push_back(std::move(file));
  return merged;
}

}  // namespace reshard
