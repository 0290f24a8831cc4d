// Where ZeRO's trainable params (and their Adam moments) lie in the ranks' flat fp32 groups,
// once the optimizer and model-states files have been read: the pieces of every param out of
// ZeroRuns (zero_layout.h), and zero_to_fp32's checks of the flat groups' lengths, paddings
// and totals. No IO: the flat tensors come in as (file index, byte offset, length).

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_LOCATE_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_LOCATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/core/catalog.h"
#include "lib/core/shape.h"

namespace reshard {
namespace zero_internal {

// A 1-D contiguous float32 tensor in one file: one rank's flat group or flat moment.
struct FlatTensor {
  int file = -1;
  uint64_t byte_offset = 0;
  int64_t numel = 0;
};

// What one rank's optimizer file holds, per flat group (ZeRO-1/2 param group, ZeRO-3 sub-group).
struct RankFlats {
  std::vector<FlatTensor> fp32;
  std::vector<FlatTensor> exp_avg;  // with include_optimizer only
  std::vector<FlatTensor> exp_avg_sq;
  // ZeRO-1/2 `group_paddings[g]`, when the file records it as an int.
  std::vector<std::optional<int64_t>> paddings;
};

// A trainable param, as rank 0's model states list it in param_shapes.
struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t numel = 0;
  int group = 0;  // index in param_shapes
};

// What locating needs: the run's shape, what the files hold, and names for messages.
struct ZeroFlats {
  int world = 0;                             // data-parallel ranks
  int param_groups = 0;                      // ZeRO-1/2: entries of param_shapes
  const std::vector<ParamInfo>& params;      // trainable params, in flat-buffer order
  const std::vector<RankFlats>& flats;       // per rank
  bool include_optimizer = false;            // also locate exp_avg and exp_avg_sq
  std::vector<std::string> optimizer_paths;  // per rank, for messages
  std::string model_path;                    // rank 0's model-states file, as a path
  std::string model_name;                    // the same, as a file name
  std::string optimizer0_name;               // rank 0's optimizer file name
  std::string dir;                           // the checkpoint folder
  std::string setup;                         // "ZeRO-3 with 4 ranks"
};

// ZeRO-1/2: every param out of `single_partition_of_fp32_groups` (one flat buffer per param
// group, padded to 2 x world and cut into equal partitions), as float32 tensors in params
// order; with include_optimizer, "<param>.exp_avg" / ".exp_avg_sq" appended to `moments`.
// DataLoss naming the file when lengths, paddings or aligned totals disagree.
absl::StatusOr<std::vector<CatalogTensor>> LocateZero12(const ZeroFlats& in,
                                                        std::vector<CatalogTensor>& moments);

// ZeRO-3: every param out of `fp32_flat_groups` (each param padded to world x ceil(n / world),
// every rank holding its slice of every param back to back across sub-groups); moments as
// LocateZero12. DataLoss when the ranks' sub-groups or the totals disagree.
absl::StatusOr<std::vector<CatalogTensor>> LocateZero3(const ZeroFlats& in,
                                                       std::vector<CatalogTensor>& moments);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_LOCATE_H_
