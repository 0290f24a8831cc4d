#include "lib/core/shape.h"

#include <algorithm>
#include <cassert>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace reshard {

Box Box::Full(const Shape& shape) { return Box{std::vector<int64_t>(shape.size(), 0), shape}; }

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    if (extent < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape ", ShapeToString(shape)));
    }
    if (__builtin_mul_overflow(count, extent, &count)) {
      return absl::InvalidArgumentError(
          absl::StrCat("element count of shape ", ShapeToString(shape), " overflows int64"));
    }
  }
  return count;
}

int64_t NumElementsUnchecked(absl::Span<const int64_t> shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

std::vector<int64_t> RowMajorStrides(absl::Span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  assert(a.rank() == b.rank());
  Box result;
  result.origin.resize(a.rank());
  result.extent.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    int64_t begin = std::max(a.origin[d], b.origin[d]);
    int64_t end = std::min(a.origin[d] + a.extent[d], b.origin[d] + b.extent[d]);
    if (end <= begin) return std::nullopt;
    result.origin[d] = begin;
    result.extent[d] = end - begin;
  }
  return result;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.rank() != inner.rank()) return false;
  for (size_t d = 0; d < outer.rank(); ++d) {
    if (inner.origin[d] < outer.origin[d] ||
        inner.origin[d] + inner.extent[d] > outer.origin[d] + outer.extent[d]) {
      return false;
    }
  }
  return true;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string BoxToString(const Box& box) {
  std::vector<std::string> ranges;
  for (size_t d = 0; d < box.rank(); ++d) {
    ranges.push_back(absl::StrCat(box.origin[d], ":", box.origin[d] + box.extent[d]));
  }
  return absl::StrCat("[", absl::StrJoin(ranges, ", "), "]");
}

}  // namespace reshard
