#include "lib/formats/deepspeed/zero_save_folder.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/deepspeed/zero_layout.h"
#include "lib/formats/folder_model.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace zero_internal {

absl::StatusOr<FolderScan> ScanFolder(const std::string& dir) {
  FolderScan scan;
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListInputFolderEntries(dir));
  if (names.size() > static_cast<size_t>(kMaxZeroFolderEntries)) {
    names.resize(kMaxZeroFolderEntries);
  }
  for (const std::string& name : names) {
    std::optional<ZeroFileName> parsed = ParseZeroFileName(name);
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

absl::StatusOr<std::vector<std::string>> SubFolders(const std::string& dir) {
  std::vector<std::string> names;
  ASSIGN_OR_RETURN(std::vector<std::string> listed, ListInputSubfolders(dir));
  for (std::string& name : listed) {
    if (names.size() >= static_cast<size_t>(kMaxZeroFolderEntries)) break;
    if (name.empty() || name[0] == '.') continue;
    names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end(), NaturalLess);
  return names;
}

namespace {

constexpr int kMaxListedFolders = 20;

// "global_step10, global_step20": the checkpoint folders under `dir`, for messages.
std::string ListCheckpointFolders(const std::string& dir) {
  std::vector<std::string> found;
  absl::StatusOr<std::vector<std::string>> folders = SubFolders(dir);
  if (!folders.ok()) {
    return absl::StrCat("its folders cannot be listed (", folders.status().message(), ")");
  }
  for (const std::string& name : *folders) {
    absl::StatusOr<FolderScan> scan = ScanFolder(JoinPath(dir, name));
    if (!scan.ok()) {
      return absl::StrCat(name, " cannot be listed (", scan.status().message(), ")");
    }
    if (scan->Checkpoint()) found.push_back(name);
  }
  if (found.empty()) return "no folder here holds DeepSpeed checkpoint files";
  std::string listed = absl::StrJoin(
      found.begin(), found.begin() + std::min<size_t>(found.size(), kMaxListedFolders), ", ");
  if (found.size() > kMaxListedFolders) {
    absl::StrAppend(&listed, " and ", found.size() - kMaxListedFolders, " more");
  }
  return absl::StrCat("checkpoint folders here: ", listed);
}

}  // namespace

absl::StatusOr<std::pair<std::string, std::string>> ResolveCheckpointFolder(
    const std::string& path, const std::string& tag_option) {
  ASSIGN_OR_RETURN(const bool path_is_folder, CheckInputFolder(path));
  if (!path_is_folder) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a DeepSpeed checkpoint is a folder, not a file"));
  }
  ASSIGN_OR_RETURN(const FolderScan scan, ScanFolder(path));
  const bool here = scan.optimizer || scan.model;
  if (!tag_option.empty()) {
    RETURN_IF_ERROR(CheckTag(tag_option, "from --tag"));
    const std::string folder = JoinPath(path, tag_option);
    ASSIGN_OR_RETURN(const bool tag_folder, CheckInputFolder(folder));
    if (tag_folder) return std::make_pair(folder, tag_option);
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
  ASSIGN_OR_RETURN(const bool tag_folder, CheckInputFolder(folder));
  if (!tag_folder) {
    return absl::NotFoundError(absl::StrCat(latest, " names tag ", tag, ", but there is no folder ",
                                            folder, "; ", ListCheckpointFolders(path),
                                            ". Pass --tag to choose one"));
  }
  return std::make_pair(folder, tag);
}

}  // namespace zero_internal
}  // namespace reshard
