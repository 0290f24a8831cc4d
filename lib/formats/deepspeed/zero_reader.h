// The DeepSpeed ZeRO-1/2/3 reader: the consolidated model zero_to_fp32.py would produce,
// located in place in a checkpoint folder's optimizer and model-states files. See
// zero_format.h for the layout, the tensors produced and the checks; zero_layout.h holds the
// flat-buffer arithmetic.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_READER_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "lib/formats/deepspeed/zero_folder_files.h"
#include "lib/formats/format.h"

namespace reshard {
namespace zero_internal {

// Reads checkpoint folder `dir` (tag `tag`) whose `files` include optimizer files.
absl::StatusOr<InputModel> ReadZeroCheckpoint(std::string dir, std::string tag,
                                              ZeroFolderFiles files, const ReadOptions& options);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_READER_H_
