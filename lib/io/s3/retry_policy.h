// When and how long to wait before retrying an S3 request.
//
// A request is retried when the failure says nothing about the request itself: the server was
// busy or broken (5xx, 429, SlowDown, RequestTimeout), or the transport failed (connection
// refused or dropped, timeout, truncated response). Client errors (4xx) are final, and so is a
// store out of space (507 InsufficientStorage) or over a quota (QuotaExceeded). Waits grow
// exponentially with full jitter (a uniform draw in [0, min(max_backoff, initial * 2^n)]), so
// many clients that failed together do not retry together.

#ifndef RESHARD_LIB_IO_S3_RETRY_POLICY_H_
#define RESHARD_LIB_IO_S3_RETRY_POLICY_H_

#include <string>

#include "absl/random/random.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace reshard {

struct RetryPolicy {
  // Attempts per request including the first. Default: 6.
  int max_attempts = 6;
  // Upper bound of the first wait. Default: 100 ms.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // Upper bound of any wait. Default: 10 s.
  absl::Duration max_backoff = absl::Seconds(10);

  // The wait before attempt `retry` + 1 (retry = 1 for the first retry).
  absl::Duration Backoff(int retry, absl::BitGen& gen) const;
  // That wait for the draw `fraction` in [0, 1): BackoffCap(retry) * fraction.
  absl::Duration BackoffAt(int retry, double fraction) const;
  // The upper bound of Backoff(retry): min(max_backoff, initial_backoff * 2^(retry-1)).
  absl::Duration BackoffCap(int retry) const;
};

// How one attempt ended, as far as retrying is concerned.
struct AttemptOutcome {
  // True when the transport failed: nothing (or a partial response) was received.
  bool transport_error = false;
  // The HTTP status when a response was received.
  int http_status = 0;
  // The S3 <Code> of an error body, if any.
  std::string s3_code;
};

// True when a request that ended with `outcome` may succeed if sent again.
bool IsRetryable(const AttemptOutcome& outcome);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_RETRY_POLICY_H_
