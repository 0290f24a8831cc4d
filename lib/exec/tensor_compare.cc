#include "lib/exec/tensor_compare.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/exec/executor.h"
#include "lib/exec/tensor_filler.h"
#include "lib/plan/planner.h"

namespace reshard {

absl::Status CompareInWindows(TensorFiller& a, TensorFiller& b, int64_t num_elements,
                              size_t element_size, int64_t window_elements,
                              std::vector<std::byte>& buffer_a, std::vector<std::byte>& buffer_b,
                              const std::atomic<bool>* cancelled, absl::string_view what,
                              const std::function<bool(int64_t begin, int64_t count)>&
                                  on_difference) {
  const int64_t window = std::max<int64_t>(1, window_elements);
  buffer_a.resize(std::min(window, num_elements) * element_size);
  buffer_b.resize(buffer_a.size());
  for (int64_t begin = 0; begin < num_elements; begin += window) {
    if (cancelled != nullptr && cancelled->load()) {
      return absl::CancelledError(absl::StrCat(what, " cancelled"));
    }
    const int64_t end = std::min(num_elements, begin + window);
    RETURN_IF_ERROR(a.Fill(begin, end, buffer_a.data()));
    RETURN_IF_ERROR(b.Fill(begin, end, buffer_b.data()));
    a.ReleaseConsumed();
    b.ReleaseConsumed();
    if (std::memcmp(buffer_a.data(), buffer_b.data(), (end - begin) * element_size) == 0) {
      continue;
    }
    if (!on_difference(begin, end - begin)) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> FirstDifferingElement(const Catalog& catalog, int a,
                                                              int b, uint64_t window_bytes) {
  const CatalogTensor& ta = catalog.tensors[a];
  const CatalogTensor& tb = catalog.tensors[b];
  if (ta.shape != tb.shape || ta.dtype != tb.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", ta.name, "\" (", DTypeName(ta.dtype), " ", ShapeToString(ta.shape),
        ") and tensor \"", tb.name, "\" (", DTypeName(tb.dtype), " ", ShapeToString(tb.shape),
        ") cannot be compared element by element: their shapes or dtypes differ"));
  }
  ASSIGN_OR_RETURN(std::vector<MappedFile> sources, MapSources(catalog.files));
  ASSIGN_OR_RETURN(const TensorCopy copy_a, PlanWholeTensor(catalog, a, ta.dtype));
  ASSIGN_OR_RETURN(const TensorCopy copy_b, PlanWholeTensor(catalog, b, tb.dtype));
  TensorFiller fill_a(copy_a, sources);
  TensorFiller fill_b(copy_b, sources);
  const size_t size = DTypeSize(ta.dtype);
  std::vector<std::byte> buffer_a, buffer_b;
  std::optional<int64_t> first;
  RETURN_IF_ERROR(CompareInWindows(
      fill_a, fill_b, copy_a.num_elements, size, static_cast<int64_t>(window_bytes / size),
      buffer_a, buffer_b, /*cancelled=*/nullptr, "comparison", [&](int64_t begin, int64_t count) {
        for (int64_t i = 0; i < count; ++i) {
          if (std::memcmp(buffer_a.data() + i * size, buffer_b.data() + i * size, size) != 0) {
            first = begin + i;
            return false;
          }
        }
        return true;
      }));
  return first;
}

}  // namespace reshard
