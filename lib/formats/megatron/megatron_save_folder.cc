#include "lib/formats/megatron/megatron_save_folder.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/folder_model.h"
#include "lib/formats/megatron/megatron_layout.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace megatron_internal {

absl::StatusOr<Layout> Classify(const std::string& dir) {
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(dir));
  if (!folder) return Layout::kNone;
  ASSIGN_OR_RETURN(const std::vector<std::string> files, ListInputFolder(dir));
  for (const std::string& name : files) {
    if (ParsePipeLayerFile(name).has_value()) return Layout::kDeepSpeedPipe;
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> folders, ListInputSubfolders(dir));
  for (const std::string& name : folders) {
    if (ParseMegatronRankDir(name).has_value()) return Layout::kMegatronLM;
  }
  return Layout::kNone;
}

absl::StatusOr<std::vector<std::string>> CheckpointSubfolders(const std::string& path) {
  std::vector<std::string> found;
  ASSIGN_OR_RETURN(const std::vector<std::string> folders, ListInputSubfolders(path));
  for (const std::string& name : folders) {
    if (!absl::StartsWith(name, "iter_") && name != "release" &&
        !absl::StartsWith(name, "global_step")) {
      continue;
    }
    ASSIGN_OR_RETURN(const Layout layout, Classify(JoinPath(path, name)));
    if (layout != Layout::kNone) found.push_back(name);
  }
  std::sort(found.begin(), found.end(), NaturalLess);
  return found;
}

absl::StatusOr<Resolved> ResolveCheckpoint(const std::string& path, const std::string& tag) {
  auto at = [&](const std::string& name) -> absl::StatusOr<std::optional<Resolved>> {
    const std::string dir = JoinPath(path, name);
    ASSIGN_OR_RETURN(const Layout layout, Classify(dir));
    if (layout == Layout::kNone) return std::nullopt;
    return Resolved{dir, name, layout};
  };
  if (!tag.empty()) {
    std::vector<std::string> names = {tag};
    if (ParseMegatronIndex(tag).has_value()) {
      names.push_back(*IterationFolderFromTracker(tag));
      names.push_back(absl::StrCat("global_step", tag));
    }
    for (const std::string& name : names) {
      if (!IsPlainTag(name)) continue;
      ASSIGN_OR_RETURN(std::optional<Resolved> found, at(name));
      if (found.has_value()) return *found;
    }
    return absl::NotFoundError(absl::StrCat(
        path, ": --tag ", tag, " names no Megatron checkpoint folder here (looked for ",
        absl::StrJoin(names, ", "),
        " holding mp_rank_* folders or DeepSpeed pipeline layer files)"));
  }
  ASSIGN_OR_RETURN(const Layout layout, Classify(path));
  if (layout != Layout::kNone) return Resolved{path, BaseName(path), layout};
  ASSIGN_OR_RETURN(const std::optional<std::string> latest,
                   ReadTrackerFile(JoinPath(path, kDeepSpeedTrackerName)));
  if (latest.has_value() && IsPlainTag(*latest)) {
    ASSIGN_OR_RETURN(std::optional<Resolved> found, at(*latest));
    if (found.has_value()) return *found;
  }
  const std::string tracker_path = JoinPath(path, kMegatronTrackerName);
  ASSIGN_OR_RETURN(const std::optional<std::string> tracker, ReadTrackerFile(tracker_path));
  if (tracker.has_value()) {
    const std::optional<std::string> name = IterationFolderFromTracker(*tracker);
    if (!name.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(tracker_path, ": expected an iteration number or \"release\", but found \"",
                       absl::CEscape(absl::StripAsciiWhitespace(*tracker)), "\""));
    }
    ASSIGN_OR_RETURN(std::optional<Resolved> found, at(*name));
    if (found.has_value()) return *found;
    return absl::NotFoundError(
        absl::StrCat(tracker_path, " names ", *name, ", but ", JoinPath(path, *name),
                     " holds no mp_rank_* folders nor DeepSpeed pipeline layer files"));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> found, CheckpointSubfolders(path));
  if (!found.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds the checkpoint folders ", absl::StrJoin(found, ", "),
                     " but no tracker file (", kMegatronTrackerName, ", ", kDeepSpeedTrackerName,
                     ") saying which to read; pass --tag with one of them"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path,
      ": not a Megatron checkpoint: no mp_rank_XX[_YYY]/model_optim_rng.pt folders, no DeepSpeed "
      "pipeline layer files (layer_XX-model_YY-model_states.pt), and no tracker file (",
      kMegatronTrackerName, ", ", kDeepSpeedTrackerName, ") naming a folder that holds them"));
}

}  // namespace megatron_internal
}  // namespace reshard
