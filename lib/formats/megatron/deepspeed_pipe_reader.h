// The Megatron-DeepSpeed pipeline reader: global_step*/layer_XX-model_YY-model_states.pt files
// (one per layer and TP rank) beside mp_rank_ZZ_model_states.pt, one model-parallel part per
// TP rank. See megatron_format.h for the layout and the checks.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_DEEPSPEED_PIPE_READER_H_
#define RESHARD_LIB_FORMATS_MEGATRON_DEEPSPEED_PIPE_READER_H_

#include "absl/status/statusor.h"
#include "lib/formats/format.h"
#include "lib/formats/megatron/megatron_save_folder.h"

namespace reshard {
namespace megatron_internal {

absl::StatusOr<InputModel> ReadDeepSpeedPipe(const Resolved& where);

}  // namespace megatron_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_DEEPSPEED_PIPE_READER_H_
