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

bool MegatronInput::Probe(const std::string& path) const {
  if (ResolveCheckpoint(path, "").ok()) return true;
  // Megatron save folders with something wrong in them are claimed too, so that Read can say
  // what (or --tag can pick a folder): iter_* / release checkpoints but no tracker; a tracker
  // naming a folder that is missing. A folder a tracker names that holds neither rank folders
  // nor layer files (Megatron's torch_dist format) is left to other readers, and so is a folder
  // beside DeepSpeed's `latest` that is no pipeline checkpoint (the ZeRO reader's).
  if (!IsInputFolder(path) || InputExists(JoinPath(path, kDeepSpeedTrackerName))) {
    return false;
  }
  if (!CheckpointSubfolders(path).empty()) return true;
  // A tracker that cannot be read (or is too large) claims nothing here.
  const absl::StatusOr<std::optional<std::string>> tracker =
      ReadTrackerFile(JoinPath(path, kMegatronTrackerName));
  if (!tracker.ok() || !tracker->has_value()) return false;
  const std::optional<std::string> name = IterationFolderFromTracker(**tracker);
  return name.has_value() && !InputExists(JoinPath(path, *name));
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
