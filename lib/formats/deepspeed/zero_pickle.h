// What DeepSpeed's pickled values mean, without IO: the ZeRO stage enum as the Python versions
// pickle it, dicts keyed by parameter index, None.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_PICKLE_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_PICKLE_H_

#include <cstdint>
#include <optional>

#include "lib/formats/torch/pickle.h"

namespace reshard {
namespace zero_internal {

// ZeroStageEnum as pickled by Python <= 3.10 (ZeroStageEnum(3), an int Enum call) or by 3.11
// (getattr(ZeroStageEnum, "weights")), or a plain int; nullopt for anything else.
std::optional<int64_t> ZeroStage(const PickleValue* value);

// The value under int key `key` of a dict (torch optimizer state is keyed by param index), or
// nullptr.
const PickleValue* IntKeyField(const PickleValue* dict, int64_t key);

// Whether `value` is absent or None.
bool IsNone(const PickleValue* value);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_PICKLE_H_
