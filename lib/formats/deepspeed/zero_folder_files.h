// The files of one DeepSpeed checkpoint folder, sorted by kind and rank from their names, with
// the refusals a listing alone can make (pipeline layer files, ZeRO with model parallelism,
// two runs mixed).

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FOLDER_FILES_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FOLDER_FILES_H_

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/formats/deepspeed/zero_layout.h"

namespace reshard {
namespace zero_internal {

// Said in refusals of missing files.
inline constexpr char kPartialSaveHint[] =
    "A partial save is the usual cause: the checkpoint is still being written, some ranks did not "
    "finish saving, or a copy lost files (zero_to_fp32 refuses such a checkpoint too).";

struct ZeroFolderFiles {
  std::map<int, std::string> optimizer_files;   // rank -> file name (mp_rank_00)
  // mp rank -> rank -> file name, every model-parallel rank's (mixture-of-experts saves read
  // each mp rank's ZeRO files as a model-parallel part).
  std::map<int, std::map<int, std::string>> mp_optimizer_files;
  std::map<int, std::string> rank_model_files;  // ZeRO-3: rank -> file name (mp_rank_00)
  std::vector<std::string> rank_model_names;    // every zero_pp_rank_*_model_states.pt
  std::set<int> rank_model_mps;                 // their model-parallel ranks
  std::map<int, std::string> model_files;       // mp rank -> mp_rank_XX_model_states.pt
  bool any_optimizer_file = false;              // of any model-parallel rank
  std::string prefix;                           // of the optimizer files: "", "bf16_" or "fp16_"
  // The model-parallel rank the optimizer files (and, ZeRO-1/2, mp_rank_XX_model_states.pt)
  // are read for: 0 as ListZeroFolder lists them; another when the Megatron-DeepSpeed pipeline
  // reader reads each (pp, tp) rank's ZeRO files on its own.
  int mp_rank = 0;
  // The pipeline engine's model states (module None): buffers and frozen params live in the
  // layer files, so buffer_names is not looked up in `module`.
  bool pipeline = false;
  // A mixture-of-experts save's expert files and expert-parallel optimizer files, with what
  // their names say, in natural order of the names.
  std::vector<std::pair<MoeFileName, std::string>> moe_files;
};

// The files of checkpoint folder `dir`. With optimizer files, refuses mixed prefixes and,
// unless the folder holds mixture-of-experts files, model-parallel ranks > 0; without, the
// readers decide from the model-states files.
absl::StatusOr<ZeroFolderFiles> ListZeroFolder(const std::string& dir);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_FOLDER_FILES_H_
