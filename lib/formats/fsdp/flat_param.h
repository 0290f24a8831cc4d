// FSDP flat parameters as OLMo's LocalShardedCheckpointer saves them (olmo_sharded_format.h):
// the metadata of one rank's shard of one flat parameter (a FlatParamHandle's state), in both
// torch generations of its fields, and the check that the ranks' ranges of a parameter tile it.
//
// A handle is a dict with "flat_param._fqns" (parameter names), "flat_param._shapes" (their
// torch.Size) and either
//   - "flat_param._shard_param_infos" (torch >= 2.1): per parameter a _ShardParamInfo(in_shard,
//     offset_in_shard, numel_in_shard, intra_param_start_idx, intra_param_end_idx) NamedTuple:
//     the parameter's flattened elements [start, end] (inclusive) are the shard's from
//     offset_in_shard on; or
//   - "flat_param._shard_indices" (first, last parameter in the shard) and
//     "flat_param._shard_param_offsets" ((start, end) inclusive per parameter from the first),
//     back to back from the shard's start (torch <= 2.0).
// Elements past the last parameter's are padding (the last rank's, to a multiple of the world
// size) and are never read.

#ifndef RESHARD_LIB_FORMATS_FSDP_FLAT_PARAM_H_
#define RESHARD_LIB_FORMATS_FSDP_FLAT_PARAM_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/core/shape.h"
#include "lib/formats/torch/pickle.h"

namespace reshard {

// Whether global `module`.`name` may appear in OLMo's flat parameter state: tensor rebuild
// functions, torch.Size and dtypes, OrderedDict and _ShardParamInfo (torch 2.1's and later module
// paths).
bool IsFlatParamGlobal(const std::string& module, const std::string& name);

// One parameter's elements in a rank's flat shard.
struct FlatParamSlice {
  std::string fqn;              // relative to the FSDP module
  Shape shape;                  // the parameter's
  int64_t begin = 0;            // first element of the parameter's flattening
  int64_t end = 0;              // one past the last
  int64_t offset_in_shard = 0;  // where `begin` is in the shard
};

// The slices of handle `handle` whose flat shard ("flat_param.data") has `flat_numel`
// elements, in the handle's order. DataLoss naming the field and parameter for missing or
// malformed fields, a slice whose numel_in_shard disagrees with its indices, or one that leaves
// the shard.
absl::StatusOr<std::vector<FlatParamSlice>> ParseFlatParamHandle(const PickleValue* handle,
                                                                 int64_t flat_numel);

// One range of a parameter's flattening, as one rank holds it.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t rank = 0;
  int64_t offset_in_shard = 0;
  uint64_t byte_offset = 0;
};

// Sorts `ranges` (every rank's of one parameter of `numel` elements) and checks they tile
// [0, numel) exactly. DataLoss naming the elements no rank holds, or two overlapping ranges, or
// one past the parameter, each described by `describe`; the caller adds the parameter's name.
absl::Status CheckFlatRangesTile(std::vector<FlatRange>& ranges, int64_t numel,
                                 const std::function<std::string(const FlatRange&)>& describe);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_FSDP_FLAT_PARAM_H_
