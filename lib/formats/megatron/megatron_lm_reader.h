// The Megatron-LM reader: iter_*/mp_rank_XX[_YYY]/model_optim_rng.pt files, one model-parallel
// part per TP rank with its pipeline stages (and virtual stages) merged. See megatron_format.h
// for the layout and the checks.

#ifndef RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_LM_READER_H_
#define RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_LM_READER_H_

#include "absl/status/statusor.h"
#include "lib/formats/format.h"
#include "lib/formats/megatron/megatron_save_folder.h"

namespace reshard {
namespace megatron_internal {

absl::StatusOr<InputModel> ReadMegatronLM(const Resolved& where);

}  // namespace megatron_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_MEGATRON_LM_READER_H_
