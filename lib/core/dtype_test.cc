#include "lib/core/dtype.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

TEST(DTypeTest, SizesAndNames) {
  struct Expected {
    DType dtype;
    const char* name;
    size_t size;
  };
  const Expected kExpected[] = {
      {DType::kBool, "BOOL", 1},      {DType::kU8, "U8", 1},
      {DType::kI8, "I8", 1},          {DType::kF8E5M2, "F8_E5M2", 1},
      {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E8M0, "F8_E8M0", 1},
      {DType::kI16, "I16", 2},        {DType::kU16, "U16", 2},
      {DType::kF16, "F16", 2},        {DType::kBF16, "BF16", 2},
      {DType::kI32, "I32", 4},        {DType::kU32, "U32", 4},
      {DType::kF32, "F32", 4},        {DType::kF64, "F64", 8},
      {DType::kI64, "I64", 8},        {DType::kU64, "U64", 8},
  };
  ASSERT_EQ(std::size(kExpected), std::size(kAllDTypes));
  for (const Expected& e : kExpected) {
    EXPECT_EQ(DTypeSize(e.dtype), e.size) << e.name;
    EXPECT_EQ(std::string(DTypeName(e.dtype)), e.name);
  }
}

TEST(DTypeTest, RoundTripEveryDType) {
  std::set<std::string> names;
  for (DType dtype : kAllDTypes) {
    const std::string name(DTypeName(dtype));
    EXPECT_TRUE(names.insert(name).second) << "duplicate name " << name;
    std::optional<DType> parsed = DTypeFromName(name);
    ASSERT_TRUE(parsed.has_value()) << name;
    EXPECT_EQ(*parsed, dtype) << name;
  }
  EXPECT_EQ(names.size(), 16u);
}

TEST(DTypeTest, UnknownNames) {
  for (const char* name :
       {"F4", "F6_E2M3", "F6_E3M2", "C64", "f32", "", "F8_E4M3FNUZ", "float32", "F32 ", "Bool"}) {
    EXPECT_FALSE(DTypeFromName(name).has_value()) << "\"" << name << "\"";
  }
  EXPECT_FALSE(DTypeFromName(absl::string_view("F32\0", 4)).has_value());
}

TEST(DTypeTest, ConvertibleFloats) {
  for (DType dtype : kAllDTypes) {
    const bool expected = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
    EXPECT_EQ(IsConvertibleFloat(dtype), expected) << DTypeName(dtype);
  }
}

TEST(DTypeTest, SortRankMatchesSafetensorsWriterOrder) {
  // The reference writer sorts by dtype descending: this is that order, first to last.
  const DType kWriterOrder[] = {
      DType::kU64,    DType::kI64, DType::kF64, DType::kF32,  DType::kU32,    DType::kI32,
      DType::kBF16,   DType::kF16, DType::kU16, DType::kI16,  DType::kF8E8M0, DType::kF8E4M3,
      DType::kF8E5M2, DType::kI8,  DType::kU8,  DType::kBool,
  };
  ASSERT_EQ(std::size(kWriterOrder), std::size(kAllDTypes));
  for (size_t i = 0; i + 1 < std::size(kWriterOrder); ++i) {
    EXPECT_GT(DTypeSortRank(kWriterOrder[i]), DTypeSortRank(kWriterOrder[i + 1]))
        << DTypeName(kWriterOrder[i]) << " must sort before " << DTypeName(kWriterOrder[i + 1]);
  }
}

}  // namespace
}  // namespace reshard
