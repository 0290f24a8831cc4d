// Megatron-DeepSpeed pipeline checkpoints read from their ZeRO-1/2 optimizer files: the fp32
// master weights and Adam moments of every (pp, tp, dp) rank, as the model's own parameters
// (`tied_modules.embed.word_embeddings.weight`, `3.self_attention.query_key_value.weight`,
// `8.weight`: the names of param_shapes and param_slice_mappings), one model-parallel part per
// TP rank, merged with the partition rules ds_to_universal would use. See megatron_format.h,
// "With --include-optimizer".

#ifndef RESHARD_LIB_FORMATS_MEGATRON_DEEPSPEED_PIPE_ZERO_READER_H_
#define RESHARD_LIB_FORMATS_MEGATRON_DEEPSPEED_PIPE_ZERO_READER_H_

#include <optional>

#include "absl/status/statusor.h"
#include "lib/formats/format.h"
#include "lib/formats/megatron/megatron_save_folder.h"

namespace reshard {
namespace megatron_internal {

// The model out of the ZeRO optimizer files of pipeline checkpoint `where`, or nullopt when the
// folder has none, or model-states files that record no partitioned fp32 weights
// (`param_shapes` None): the caller then reads the 16-bit layer files.
absl::StatusOr<std::optional<InputModel>> ReadDeepSpeedPipeZero(const Resolved& where,
                                                                const ReadOptions& options);

}  // namespace megatron_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_MEGATRON_DEEPSPEED_PIPE_ZERO_READER_H_
