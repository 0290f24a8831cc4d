// DeepSpeed mixture-of-experts saves trained with ZeRO-1/2: the fp32 master weights (and, with
// --include-optimizer, the Adam moments) of the dense and the expert param groups of every
// rank's optimizer file, each expert under its global id.
//
// What DeepSpeed writes (engine.py _save_moe_checkpoint and _save_zero_checkpoint,
// stage_1_and_2.py, moe/utils.py, utils/groups.py): mp_rank_XX_model_states.pt and the
// layer_{m}_expert_{g} files hold the 16-bit weights, as without ZeRO; every data-parallel
// rank r of model-parallel rank XX writes zero_pp_rank_{r}_mp_rank_XX_optim_states.pt (each
// mp rank is read as a model-parallel part), whose param groups are the dense
// groups, partitioned over all W ranks, and the expert groups
// (split_params_into_different_moe_groups_for_optimizer), partitioned over the rank's
// expert-data-parallel group of W / EP ranks (`partition_count[g]`). `param_slice_mappings[g]`
// names each param piece of the rank's partition with its `fragment_address(numel, start)`,
// experts under the rank's local ids. Which ranks form an expert-data-parallel group, and so
// which experts a rank's local ids are, comes from groups._create_expert_and_data_parallel:
// rank r is expert-parallel rank r % EP and partition r / EP of its experts' group (DeepSpeed's
// default), or, with "use_data_before_expert_parallelism" in the ds_config the optimizer files
// carry, expert-parallel rank r / (W / EP) and partition r % (W / EP) (read at TP 1 only:
// with TP, _get_expert_parallel_ranks orders that topology's ranks otherwise). DeepSpeed
// refuses MoE with ZeRO-3 ("MoE not supported with Stage 3").

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_MOE_ZERO_READER_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_MOE_ZERO_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "lib/formats/deepspeed/zero_folder_files.h"
#include "lib/formats/format.h"

namespace reshard {
namespace zero_internal {

// Reads checkpoint folder `dir` (tag `tag`), whose `files` hold expert files and optimizer
// files. DataLoss naming the file, the param group and the param: a rank's optimizer file
// missing or of another save (partition counts), an expert group whose partition count is not
// W / EP, fragments that do not tile a rank's partition or a param, an expert param in no
// mapping or in two, a mapped param the model states and expert files do not hold.
absl::StatusOr<InputModel> ReadMoeZeroCheckpoint(const std::string& dir, const std::string& tag,
                                                 const ZeroFolderFiles& files,
                                                 const ReadOptions& options);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_MOE_ZERO_READER_H_
