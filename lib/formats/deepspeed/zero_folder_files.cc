#include "lib/formats/deepspeed/zero_folder_files.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/core/status.h"
#include "lib/formats/deepspeed/zero_layout.h"
#include "lib/formats/folder_model.h"
#include "lib/io/file_access.h"

namespace reshard {
namespace zero_internal {

absl::StatusOr<ZeroFolderFiles> ListZeroFolder(const std::string& dir) {
  ZeroFolderFiles files;
  std::set<std::string> prefixes;
  std::vector<std::string> other_mp;
  ASSIGN_OR_RETURN(std::vector<std::string> names, ListInputFolderEntries(dir));
  if (names.size() > static_cast<size_t>(kMaxZeroFolderEntries)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, " holds more than ", kMaxZeroFolderEntries, " entries"));
  }
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.') continue;
    if (std::optional<MoeFileName> moe = ParseMoeFileName(name); moe.has_value()) {
      files.moe_files.emplace_back(*moe, name);
      continue;
    }
    std::optional<ZeroFileName> parsed = ParseZeroFileName(name);
    if (!parsed.has_value()) continue;
    if (parsed->kind == ZeroFileName::Kind::kPipelineLayer) {
      return absl::UnimplementedError(absl::StrCat(
          dir, " holds pipeline-parallel layer files (", name,
          "); that is a Megatron-DeepSpeed pipeline checkpoint, not a plain ZeRO one"));
    }
    switch (parsed->kind) {
      case ZeroFileName::Kind::kOptimizer: {
        files.any_optimizer_file = true;
        files.mp_optimizer_files[parsed->mp][parsed->dp] = name;
        prefixes.insert(parsed->prefix);
        if (parsed->mp != 0) {
          other_mp.push_back(name);
          break;
        }
        auto [it2, inserted] = files.optimizer_files.try_emplace(parsed->dp, name);
        if (!inserted) {
          return absl::DataLossError(absl::StrCat(dir, ": ", it2->second, " and ", name,
                                                  " are both rank ", parsed->dp,
                                                  "'s optimizer file (two runs mixed?)"));
        }
        break;
      }
      case ZeroFileName::Kind::kRankModel:
        files.rank_model_names.push_back(name);
        files.rank_model_mps.insert(parsed->mp);
        if (parsed->mp != 0) {
          other_mp.push_back(name);
        } else {
          files.rank_model_files[parsed->dp] = name;
        }
        break;
      case ZeroFileName::Kind::kModel:
        files.model_files[parsed->mp] = name;
        if (parsed->mp != 0) other_mp.push_back(name);
        break;
      case ZeroFileName::Kind::kPipelineLayer:
        break;
    }
  }
  std::sort(files.rank_model_names.begin(), files.rank_model_names.end(), NaturalLess);
  std::sort(files.moe_files.begin(), files.moe_files.end(),
            [](const auto& a, const auto& b) { return NaturalLess(a.second, b.second); });
  // Without optimizer files, Read decides from the model-states files what the folder is.
  if (!files.any_optimizer_file) return files;
  if (!other_mp.empty() && files.moe_files.empty()) {
    std::sort(other_mp.begin(), other_mp.end(), NaturalLess);
    return absl::UnimplementedError(absl::StrCat(
        dir, " holds files of model-parallel rank > 0 (", other_mp[0],
        "): ZeRO combined with tensor or pipeline parallelism is not supported; reshard reads "
        "data-parallel ZeRO checkpoints (mp_rank_00 files only)"));
  }
  if (prefixes.size() > 1) {
    return absl::DataLossError(
        absl::StrCat(dir, " mixes optimizer files with different prefixes (",
                     absl::StrJoin(prefixes, ", ",
                                   [](std::string* out, const std::string& p) {
                                     absl::StrAppend(out, p.empty() ? "none" : p);
                                   }),
                     "): two runs saved into one folder"));
  }
  files.prefix = *prefixes.begin();
  return files;
}

}  // namespace zero_internal
}  // namespace reshard
