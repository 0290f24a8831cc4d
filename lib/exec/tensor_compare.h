// Bit-exact comparison of two tensors of one catalog, streamed: both are read window by window
// through TensorFiller (the readers conversions use), so memory stays at two windows however
// large the tensors are.

#ifndef RESHARD_LIB_EXEC_TENSOR_COMPARE_H_
#define RESHARD_LIB_EXEC_TENSOR_COMPARE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/exec/tensor_filler.h"

namespace reshard {

// The window of each side of a comparison: two of these are held at once.
inline constexpr uint64_t kCompareWindowBytes = 4 << 20;

// Fills elements [0, num_elements) of both fillers window by window (`window_elements` of
// `element_size` bytes each, into `buffer_a` and `buffer_b`, resized to a window) and calls
// `on_difference(begin, count)` for each window whose bytes differ, the window's elements then
// at the front of the buffers; it returns false to stop. Between windows, the source pages read
// are handed back, and `cancelled` (when not null) is checked: CancelledError saying
// "<what> cancelled". Read errors are the fillers'.
absl::Status CompareInWindows(TensorFiller& a, TensorFiller& b, int64_t num_elements,
                              size_t element_size, int64_t window_elements,
                              std::vector<std::byte>& buffer_a, std::vector<std::byte>& buffer_b,
                              const std::atomic<bool>* cancelled, absl::string_view what,
                              const std::function<bool(int64_t begin, int64_t count)>&
                                  on_difference);

// The flat (row-major) index of the first element where `catalog.tensors[a]` and
// `catalog.tensors[b]` differ bit for bit, nullopt when they are equal. Both must have the same
// shape and dtype (InvalidArgument naming them otherwise). Read errors name the file and offset.
absl::StatusOr<std::optional<int64_t>> FirstDifferingElement(
    const Catalog& catalog, int a, int b, uint64_t window_bytes = kCompareWindowBytes);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_TENSOR_COMPARE_H_
