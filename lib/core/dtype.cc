#include "lib/core/dtype.h"

#include "absl/strings/string_view.h"

namespace reshard {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kBool, "BOOL", 1},      {DType::kU8, "U8", 1},          {DType::kI8, "I8", 1},
    {DType::kF8E5M2, "F8_E5M2", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E8M0, "F8_E8M0", 1},
    {DType::kI16, "I16", 2},        {DType::kU16, "U16", 2},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},      {DType::kI32, "I32", 4},        {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},        {DType::kF64, "F64", 8},        {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
};

const DTypeInfo& Info(DType dtype) { return kInfo[static_cast<int>(dtype)]; }

}  // namespace

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> DTypeFromName(absl::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

bool IsConvertibleFloat(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

int DTypeSortRank(DType dtype) {
  // safetensors' enum also has F4, F6_E2M3 and F6_E3M2 between BOOL and U8, and C64 between F32
  // and F64; they are not representable here, so shifting ranks keeps the relative order exact.
  return static_cast<int>(dtype);
}

}  // namespace reshard
