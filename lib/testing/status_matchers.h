// gtest helpers for absl::Status and absl::StatusOr results.

#ifndef RESHARD_LIB_TESTING_STATUS_MATCHERS_H_
#define RESHARD_LIB_TESTING_STATUS_MATCHERS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard {
namespace testing_internal {

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

}  // namespace testing_internal

// Matches an OK StatusOr whose value equals `value`; prints the status otherwise.
MATCHER_P(IsOkAndHolds, value, "") {
  if (!arg.ok()) {
    *result_listener << "error: " << arg.status();
    return false;
  }
  *result_listener << "holds " << ::testing::PrintToString(*arg);
  return *arg == value;
}

}  // namespace reshard

// Fails the test (ASSERT) or the check (EXPECT) with the status when `expr`, an absl::Status or
// absl::StatusOr, is not OK. `expr` is evaluated once.
#define RESHARD_CHECK_OK_(check, expr)                                               \
  do {                                                                               \
    const absl::Status reshard_status = ::reshard::testing_internal::StatusOf(expr); \
    check(reshard_status.ok()) << #expr << ": " << reshard_status;                   \
  } while (false)
#define ASSERT_OK(expr) RESHARD_CHECK_OK_(ASSERT_TRUE, expr)
#define EXPECT_OK(expr) RESHARD_CHECK_OK_(EXPECT_TRUE, expr)

#endif  // RESHARD_LIB_TESTING_STATUS_MATCHERS_H_
