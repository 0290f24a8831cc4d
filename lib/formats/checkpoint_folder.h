// Helpers every reader of a training checkpoint folder shares: path joining, base names, the
// one rule for tags (the checkpoint folder names a save folder's tracker file or --tag give),
// tracker files read with one size limit, and catalog appending with file-index rebasing.
//
// A save folder, as DeepSpeed and Megatron write it:
//   <save>/latest                               "global_step1200" (DeepSpeed)
//   <save>/latest_checkpointed_iteration.txt    "1200" or "release" (Megatron-LM)
//   <save>/<tag>/...                            the checkpoint itself

#ifndef RESHARD_LIB_FORMATS_CHECKPOINT_FOLDER_H_
#define RESHARD_LIB_FORMATS_CHECKPOINT_FOLDER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"

namespace reshard {

// DeepSpeed's tracker file: the tag of the newest checkpoint (deepspeed/runtime/engine.py,
// DeepSpeedEngine.save_checkpoint writes `latest`).
inline constexpr char kDeepSpeedTrackerName[] = "latest";
// Megatron-LM's tracker file: the newest iteration, or "release"
// (megatron/training/checkpointing.py, get_checkpoint_tracker_filename).
inline constexpr char kMegatronTrackerName[] = "latest_checkpointed_iteration.txt";
// Tracker files hold one short line; anything larger is refused, never truncated.
inline constexpr uint64_t kMaxTrackerFileBytes = 4096;
// The longest path component (NAME_MAX on Linux).
inline constexpr size_t kMaxPathComponentBytes = 255;

// `dir` and `name` with one '/' between them; `name` alone when `dir` is empty, and no second
// '/' when `dir` already ends with one ("save/" + "latest" -> "save/latest").
std::string JoinPath(absl::string_view dir, absl::string_view name);

// The last component of `path`, trailing slashes ignored: "save/global_step5/" -> "global_step5".
std::string BaseName(absl::string_view path);

// Whether `name` is one plain path component, the rule for the file names an index lists: not
// empty, at most kMaxPathComponentBytes, not "." or "..", no '/' and no NUL byte.
bool IsPlainPathComponent(absl::string_view name);

// Whether `tag` is a plain tag, the one rule for every tag (--tag, a job spec's tag, the name a
// tracker file gives): a plain path component (IsPlainPathComponent) that does not contain ".."
// anywhere either ("step..1" is refused), so that no tag can read as a step out of the save
// folder. The ZeRO reader and the daemon have always refused such names; the others now agree.
bool IsPlainTag(absl::string_view tag);

// OK for a plain tag (IsPlainTag); otherwise InvalidArgument naming the tag and where it came
// from (`source`: "from --tag", "from save/latest").
absl::Status CheckTag(absl::string_view tag, absl::string_view source);

// The contents of tracker file `path`, surrounding whitespace stripped; nullopt when there is
// no such file. DataLoss naming the file when it is larger than kMaxTrackerFileBytes or is not
// a regular file; a failure to read it (permission, outside the allowed roots, I/O, a store's
// error) keeps its code. Read through ReadSmallFile (lib/io/file_access.h), so it is opened as
// every input is.
absl::StatusOr<std::optional<std::string>> ReadTrackerFile(const std::string& path);

// Appends `source`'s files, tensors, metadata and other entries to `target`, rebasing the file
// index of every piece past `target`'s files (tensor names must not collide).
void AppendCatalog(Catalog& target, Catalog source);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_CHECKPOINT_FOLDER_H_
