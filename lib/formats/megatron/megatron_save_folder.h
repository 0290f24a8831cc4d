// Where a Megatron checkpoint is inside a save folder: which folders hold one (Megatron-LM rank
// folders or DeepSpeed pipeline layer files), and which one a path, --tag or the tracker files
// (DeepSpeed's `latest`, Megatron's latest_checkpointed_iteration.txt) name.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_SAVE_FOLDER_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_SAVE_FOLDER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard {
namespace megatron_internal {

enum class Layout { kNone, kMegatronLM, kDeepSpeedPipe };

// What a folder holds: Megatron-LM rank folders (mp_rank_XX[_YYY], with or without their
// model file: Read says which file is missing) or DeepSpeed pipeline layer files. Errors: the
// folder cannot be looked at.
absl::StatusOr<Layout> Classify(const std::string& dir);

// The iter_*, release and global_step* folders directly in `path` that hold a checkpoint, in
// natural order. Errors: a folder cannot be looked at.
absl::StatusOr<std::vector<std::string>> CheckpointSubfolders(const std::string& path);

struct Resolved {
  std::string dir;   // the checkpoint folder itself
  std::string name;  // its name: "iter_0000100", "release", "global_step100"
  Layout layout = Layout::kNone;
};

// The checkpoint folder `path` stands for: itself, the folder `tag` names inside it, or the
// folder its tracker file names (DeepSpeed's `latest` first, since Megatron-DeepSpeed writes
// both trackers, then Megatron's latest_checkpointed_iteration.txt). InvalidArgument, NotFound
// or DataLoss (a damaged tracker) say why `path` is no Megatron checkpoint; other codes are
// failures to look (permission, I/O, a store's error).
absl::StatusOr<Resolved> ResolveCheckpoint(const std::string& path, const std::string& tag);

}  // namespace megatron_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_SAVE_FOLDER_H_
