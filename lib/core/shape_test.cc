#include "lib/core/shape.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace reshard {
namespace {

TEST(ShapeTest, NumElements) {
  EXPECT_EQ(*NumElements({}), 1);
  EXPECT_EQ(*NumElements({2, 3, 4}), 24);
  EXPECT_EQ(*NumElements({5, 0, 7}), 0);
  EXPECT_EQ(*NumElements({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_EQ(NumElementsUnchecked({2, 3, 4}), 24);
}

TEST(ShapeTest, NumElementsNegative) {
  auto result = NumElements({2, -1, 3});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("negative"), absl::string_view::npos) << result.status();
  // A negative extent after a zero is still rejected.
  EXPECT_FALSE(NumElements({0, -2}).ok());
}

TEST(ShapeTest, NumElementsOverflow) {
  auto result = NumElements({int64_t{1} << 32, int64_t{1} << 32});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("overflow"), absl::string_view::npos) << result.status();
  EXPECT_FALSE(NumElements({std::numeric_limits<int64_t>::max(), 2}).ok());
  EXPECT_TRUE(NumElements({std::numeric_limits<int64_t>::max(), 1}).ok());
  // Three factors that only overflow together.
  EXPECT_FALSE(NumElements({1 << 21, 1 << 21, 1 << 21}).ok());
}

TEST(ShapeTest, RowMajorStrides) {
  EXPECT_EQ(RowMajorStrides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(RowMajorStrides({7}), (std::vector<int64_t>{1}));
  EXPECT_TRUE(RowMajorStrides({}).empty());
}

TEST(ShapeTest, Intersect) {
  Box a{{0, 0}, {4, 6}};
  Box b{{2, 3}, {5, 5}};
  std::optional<Box> c = Intersect(a, b);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, (Box{{2, 3}, {2, 3}}));
  EXPECT_EQ(Intersect(b, a), c);
  // Touching boxes do not intersect (half-open).
  EXPECT_FALSE(Intersect(Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}}).has_value());
  // Disjoint in one dimension only.
  EXPECT_FALSE(Intersect(Box{{0, 0}, {4, 2}}, Box{{1, 5}, {2, 2}}).has_value());
  // Empty boxes intersect nothing.
  EXPECT_FALSE(Intersect(Box{{0, 0}, {0, 5}}, Box{{0, 0}, {4, 4}}).has_value());
  // Containment.
  EXPECT_EQ(*Intersect(Box{{0}, {10}}, Box{{3}, {2}}), (Box{{3}, {2}}));
  // Rank 0: the single element.
  EXPECT_TRUE(Intersect(Box{}, Box{}).has_value());
}

TEST(ShapeTest, Contains) {
  Box outer{{0, 0}, {4, 6}};
  EXPECT_TRUE(Contains(outer, outer));
  EXPECT_TRUE(Contains(outer, Box{{1, 2}, {3, 4}}));
  EXPECT_FALSE(Contains(outer, Box{{1, 2}, {4, 4}}));  // past the end of dim 0
  EXPECT_FALSE(Contains(outer, Box{{-1, 0}, {1, 1}}));
  EXPECT_FALSE(Contains(outer, Box{{0, 5}, {1, 2}}));
  EXPECT_FALSE(Contains(outer, Box{{0}, {1}}));  // rank differs
  EXPECT_TRUE(Contains(Box{{2}, {3}}, Box{{2}, {3}}));
  EXPECT_FALSE(Contains(Box{{2}, {3}}, Box{{1}, {2}}));
  EXPECT_TRUE(Contains(Box{}, Box{}));
}

TEST(ShapeTest, Strings) {
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(BoxToString(Box{{0, 4}, {2, 4}}), "[0:2, 4:8]");
  EXPECT_EQ(Box::Full({3, 5}), (Box{{0, 0}, {3, 5}}));
}

}  // namespace
}  // namespace reshard
