// Element-wise comparison of two checkpoints in any formats reshard reads.
//
// Tolerance, stated: tensors of the same dtype must be bit-identical (any NaN equals any NaN).
// Between float dtypes of different precision (F32, F16, BF16), the finer side is rounded to
// the coarser one with round-to-nearest-even and must then be bit-identical: exactly what a
// correct conversion produces, so a single wrongly rounded element is reported. Other dtype
// pairs, and shape differences, are mismatches.

#ifndef RESHARD_LIB_ENGINE_VERIFY_H_
#define RESHARD_LIB_ENGINE_VERIFY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "lib/formats/format.h"

namespace reshard {

struct TensorMismatch {
  std::string name;
  std::string reason;        // "values differ", "shape differs", "dtype differs"
  int64_t mismatches = 0;    // elements that differ (for "values differ")
  int64_t first_index = -1;  // flat index of the first differing element
  int64_t first_byte = -1;   // offset of its first differing byte, in the compared dtype's bytes
  std::string a_value;       // the first differing elements, as hex bits of the compared dtype
  std::string b_value;
  // Where each side stores the first differing element: its file, and the offset there of the
  // first differing byte (of the element's first byte, for a side rounded to the compared
  // dtype). For a replicated copy, side a is the copy conversions read and b the other copy.
  std::string a_file;
  int64_t a_offset = -1;
  std::string b_file;
  int64_t b_offset = -1;
};

struct VerifyResult {
  bool equal = false;
  int64_t tensors_compared = 0;
  uint64_t elements_compared = 0;
  std::vector<TensorMismatch> mismatched;
  std::vector<std::string> only_in_a;
  std::vector<std::string> only_in_b;
  std::string tolerance;  // the rule above, in one line
};

struct VerifyOptions {
  std::string rules_a;  // partition rules to merge A if it is model-parallel parts
  std::string rules_b;
  // What to read from training checkpoints (applies to both sides).
  ReadOptions read;
  const std::atomic<bool>* cancelled = nullptr;
};

absl::StatusOr<VerifyResult> VerifyCheckpoints(const std::string& a, const std::string& b,
                                               const VerifyOptions& options = {});

}  // namespace reshard

#endif  // RESHARD_LIB_ENGINE_VERIFY_H_
