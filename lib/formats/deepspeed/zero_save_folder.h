// Which folder holds a DeepSpeed checkpoint: a scan of a folder's file names, its checkpoint
// sub-folders (for messages), and the folder a path, --tag or the `latest` tracker names.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_SAVE_FOLDER_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_SAVE_FOLDER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard {
namespace zero_internal {

struct FolderScan {
  bool optimizer = false;  // holds ZeRO optimizer files
  bool model = false;      // holds DeepSpeed model-states files (mp_rank_XX, zero_pp_rank_N_...)
  bool pipeline = false;   // holds pipeline layer files

  // A DeepSpeed checkpoint folder this reader reads (pipeline ones are the Megatron reader's).
  bool Checkpoint() const { return (optimizer || model) && !pipeline; }
};

// What the file names directly in `dir` say (at most kMaxZeroFolderEntries looked at); errors
// (the folder cannot be listed) name it.
absl::StatusOr<FolderScan> ScanFolder(const std::string& dir);

// Sub-folders of `dir` (not hidden), in natural order; errors name `dir`.
absl::StatusOr<std::vector<std::string>> SubFolders(const std::string& dir);

// The checkpoint folder to read and its tag: `path` itself when it holds DeepSpeed checkpoint
// files (optimizer or model states), else `path/<tag>` with the tag from `tag_option` or
// `path/latest`.
absl::StatusOr<std::pair<std::string, std::string>> ResolveCheckpointFolder(
    const std::string& path, const std::string& tag_option);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_SAVE_FOLDER_H_
