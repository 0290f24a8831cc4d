// DeepSpeed checkpoint folders without ZeRO optimizer files: a ZeRO checkpoint copied without
// them (refused, naming the files to copy), or DeepSpeed without ZeRO, whose weights are the
// `module` state dict of mp_rank_XX_model_states.pt (one model, or model-parallel parts). See
// zero_format.h.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_NO_ZERO_READER_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_NO_ZERO_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "lib/formats/deepspeed/zero_folder_files.h"
#include "lib/formats/format.h"

namespace reshard {
namespace zero_internal {

// Reads checkpoint folder `dir` (tag `tag`) whose `files` include no optimizer file.
absl::StatusOr<InputModel> ReadWithoutOptimizerFiles(const std::string& dir, const std::string& tag,
                                                     const ZeroFolderFiles& files,
                                                     const ReadOptions& options);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_NO_ZERO_READER_H_
