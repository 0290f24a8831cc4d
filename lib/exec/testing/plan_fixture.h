// Sources and plans the executor's tests share: a [rows, cols] F32 tensor "w" stored in two
// files, split by columns, whose every element has a known value, and layouts over it whose
// expected output bytes are known.

#ifndef RESHARD_LIB_EXEC_TESTING_PLAN_FIXTURE_H_
#define RESHARD_LIB_EXEC_TESTING_PLAN_FIXTURE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/plan/layout.h"

namespace reshard {

// Value of element (r, c) of the global F32 tensor: distinct, with fractional bits that make
// narrowing round (and some values that tie), some negative.
float Value(int64_t r, int64_t c);

// The bits of `f`.
uint32_t Bits(float f);

// `value` in `dtype` (F32, BF16 or F16), as stored.
std::string EncodeElement(float value, DType dtype);

// The expected dense data of `region` of the [rows, cols] tensor in `dtype`.
std::string Expected(const Box& region, DType dtype);

// A [rows, cols] F32 tensor split by columns at `split` into two pieces, each stored dense
// row-major in its own file after a few junk bytes.
struct Fixture {
  Catalog catalog;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Writes a.bin and b.bin into `dir`: "w" split by columns at `split`.
Fixture MakeSource(const std::string& dir, int64_t rows, int64_t cols, int64_t split);

struct Case {
  TargetLayout layout;
  std::vector<FileFraming> framings;
  std::vector<std::string> expected;  // per file
};

// File "full.bin": header, whole tensor (F32), "MID", sub-box (BF16), trailer.
// File "rows.bin": rows 1..rows-1 in F16, then a one-column slice in F32.
Case MakeCase(const Fixture& fixture);

// One output file holding the whole tensor "w" of `fixture` in F32.
absl::StatusOr<CopyPlan> WholeTensorPlan(const Fixture& fixture);

// Files of one F32 tensor each, boxes of the fixture's "w", each after `header` bytes; with the
// bytes each file must hold.
struct OneFilePerBox {
  TargetLayout layout;
  std::vector<FileFraming> framings;
  std::vector<std::string> expected;
};
OneFilePerBox BoxesOfW(const std::vector<std::pair<std::string, Box>>& boxes,
                       const std::string& header = "");

// The parts of "w" split along its columns into `parts` files, each "HEADER" and the part.
OneFilePerBox ColumnParts(const Fixture& fixture, int parts);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_TESTING_PLAN_FIXTURE_H_
