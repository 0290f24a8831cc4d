// The Planner: intersects every output region of a TargetLayout with the Catalog's source
// pieces and emits the CopyPlan, after proving that every output element is covered exactly
// once. Nothing is read or written here; planning is cheap and exact, so a dry run can report
// output files and sizes before any work.

#ifndef RESHARD_LIB_PLAN_PLANNER_H_
#define RESHARD_LIB_PLAN_PLANNER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "lib/core/catalog.h"
#include "lib/plan/layout.h"

namespace reshard {

// True when the Executor can convert `from` into `to`: same dtype, or both among F32/F16/BF16.
bool CanConvert(DType from, DType to);

// Builds the plan. `framings[i]` is the Writer's framing of `layout.files[i]`.
// Errors: InvalidArgument for an unsupported dtype conversion; DataLoss naming the tensor when
// its source pieces leave a hole in, or overlap on, an output region.
absl::StatusOr<CopyPlan> BuildCopyPlan(const Catalog& catalog, const TargetLayout& layout,
                                       const std::vector<FileFraming>& framings);

// Plans the dense copy of the whole of `catalog.tensors[index]` in `dtype` (used by verify).
absl::StatusOr<TensorCopy> PlanWholeTensor(const Catalog& catalog, int index, DType dtype);

}  // namespace reshard

#endif  // RESHARD_LIB_PLAN_PLANNER_H_
