// Shapes, strides and boxes (N-d rectangular regions) of tensors.
//
// Shapes and boxes use int64 extents as torch and safetensors do; element counts are computed
// with overflow checks because every number here can come from an untrusted header.

#ifndef RESHARD_LIB_CORE_SHAPE_H_
#define RESHARD_LIB_CORE_SHAPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace reshard {

using Shape = std::vector<int64_t>;

// A rectangular region of a tensor: `origin[d] <= index[d] < origin[d] + extent[d]`.
struct Box {
  std::vector<int64_t> origin;
  std::vector<int64_t> extent;

  // The box covering all of a tensor of `shape`.
  static Box Full(const Shape& shape);

  size_t rank() const { return extent.size(); }
  friend bool operator==(const Box& a, const Box& b) {
    return a.origin == b.origin && a.extent == b.extent;
  }
};

// Product of the extents; InvalidArgument on a negative extent or on overflow of int64.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);

// Same, for shapes already validated (asserts in debug builds).
int64_t NumElementsUnchecked(absl::Span<const int64_t> shape);

// Element strides of a dense row-major (C order) array of `shape`.
std::vector<int64_t> RowMajorStrides(absl::Span<const int64_t> shape);

// The intersection of two boxes of equal rank; nullopt when it is empty (or either is empty).
std::optional<Box> Intersect(const Box& a, const Box& b);

// True when `inner` lies entirely inside `outer`.
bool Contains(const Box& outer, const Box& inner);

// "[2, 3]".
std::string ShapeToString(absl::Span<const int64_t> shape);

// "[0:2, 4:8]" (half-open ranges per dimension).
std::string BoxToString(const Box& box);

}  // namespace reshard

#endif  // RESHARD_LIB_CORE_SHAPE_H_
