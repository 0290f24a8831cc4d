// Element types of checkpoint tensors, named as safetensors names them.
//
// The enum lists types in the order of safetensors' `Dtype` enum (increasing alignment), which
// is also the order its reference writer sorts by (descending), see `DTypeSortRank`.

#ifndef RESHARD_LIB_CORE_DTYPE_H_
#define RESHARD_LIB_CORE_DTYPE_H_

#include <cstddef>
#include <optional>

#include "absl/strings/string_view.h"

namespace reshard {

enum class DType : unsigned char {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

inline constexpr DType kAllDTypes[] = {
    DType::kBool, DType::kU8,  DType::kI8,  DType::kF8E5M2, DType::kF8E4M3, DType::kF8E8M0,
    DType::kI16,  DType::kU16, DType::kF16, DType::kBF16,   DType::kI32,    DType::kU32,
    DType::kF32,  DType::kF64, DType::kI64, DType::kU64,
};

// Bytes per element.
size_t DTypeSize(DType dtype);

// The safetensors name ("F32", "BF16", "F8_E4M3", ...).
absl::string_view DTypeName(DType dtype);

// Parses a safetensors dtype name; nullopt for names reshard does not know (or cannot handle,
// such as the sub-byte F4/F6 types and complex C64).
std::optional<DType> DTypeFromName(absl::string_view name);

// True for F16, BF16 and F32: the types `--dtype fp32|bf16|fp16` converts between.
bool IsConvertibleFloat(DType dtype);

// Position in safetensors' enum; its reference writer orders tensors by this, descending.
int DTypeSortRank(DType dtype);

}  // namespace reshard

#endif  // RESHARD_LIB_CORE_DTYPE_H_
