#include "lib/formats/megatron/megatron_format.h"

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/megatron/deepspeed_pipe_reader.h"
#include "lib/formats/megatron/deepspeed_pipe_zero_reader.h"
#include "lib/formats/megatron/megatron_lm_reader.h"
#include "lib/formats/megatron/megatron_save_folder.h"
#include "lib/io/file_access.h"
#include "lib/plan/partition_rules.h"

namespace reshard {

using megatron_internal::CheckpointSubfolders;
using megatron_internal::Layout;
using megatron_internal::ReadDeepSpeedPipe;
using megatron_internal::ReadMegatronLM;
using megatron_internal::ResolveCheckpoint;
using megatron_internal::Resolved;

absl::StatusOr<bool> MegatronInput::Probe(const std::string& path) const {
  const absl::StatusOr<Resolved> resolved = ResolveCheckpoint(path, "");
  if (resolved.ok()) return true;
  const absl::Status& why = resolved.status();
  if (!absl::IsInvalidArgument(why) && !absl::IsNotFound(why) && !absl::IsDataLoss(why)) {
    return why;  // the folder could not be looked at
  }
  // Megatron save folders with something wrong in them are claimed too, so that Read can say
  // what (or --tag can pick a folder): iter_* / release checkpoints but no tracker; a tracker
  // naming a folder that is missing. A folder a tracker names that holds neither rank folders
  // nor layer files (Megatron's torch_dist format) is left to other readers, and so is a folder
  // beside DeepSpeed's `latest` that is no pipeline checkpoint (the ZeRO reader's).
  ASSIGN_OR_RETURN(const bool folder, CheckInputFolder(path));
  if (!folder) return false;
  ASSIGN_OR_RETURN(const bool deepspeed_tracker,
                   CheckInputExists(JoinPath(path, kDeepSpeedTrackerName)));
  if (deepspeed_tracker) return false;
  ASSIGN_OR_RETURN(const std::vector<std::string> subfolders, CheckpointSubfolders(path));
  if (!subfolders.empty()) return true;
  // A damaged tracker (too large, not a regular file) claims nothing here.
  const absl::StatusOr<std::optional<std::string>> tracker =
      ReadTrackerFile(JoinPath(path, kMegatronTrackerName));
  if (absl::IsDataLoss(tracker.status())) return false;
  if (!tracker.ok()) return tracker.status();
  if (!tracker->has_value()) return false;
  const std::optional<std::string> name = IterationFolderFromTracker(**tracker);
  if (!name.has_value()) return false;
  ASSIGN_OR_RETURN(const bool named_exists, CheckInputExists(JoinPath(path, *name)));
  return !named_exists;
}

absl::StatusOr<InputModel> MegatronInput::Read(const std::string& path,
                                               const ReadOptions& options) const {
  ASSIGN_OR_RETURN(Resolved where, ResolveCheckpoint(path, options.tag));
  if (where.layout == Layout::kDeepSpeedPipe) {
    // With the optimizer asked for, the fp32 weights and moments of the ZeRO files, when the
    // folder has real ones; the 16-bit layer files otherwise.
    if (options.include_optimizer) {
      ASSIGN_OR_RETURN(std::optional<InputModel> zero,
                       megatron_internal::ReadDeepSpeedPipeZero(where, options));
      if (zero.has_value()) return *std::move(zero);
    }
    return ReadDeepSpeedPipe(where);
  }
  return ReadMegatronLM(where);
}

namespace {
const InputFormatRegistration<MegatronInput> register_input;
const PartitionRulePresetRegistration register_preset("megatron", MegatronPresetRules());
}  // namespace

}  // namespace reshard
