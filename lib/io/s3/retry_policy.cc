#include "lib/io/s3/retry_policy.h"

#include <algorithm>

#include "absl/random/distributions.h"

namespace reshard {

absl::Duration RetryPolicy::BackoffCap(int retry) const {
  absl::Duration cap = initial_backoff;
  for (int i = 1; i < retry && cap < max_backoff; ++i) cap *= 2;
  return std::min(cap, max_backoff);
}

absl::Duration RetryPolicy::Backoff(int retry, absl::BitGen& gen) const {
  return BackoffAt(retry, absl::Uniform(gen, 0.0, 1.0));
}

absl::Duration RetryPolicy::BackoffAt(int retry, double fraction) const {
  const double cap_seconds = absl::ToDoubleSeconds(BackoffCap(retry));
  if (cap_seconds <= 0) return absl::ZeroDuration();
  return absl::Seconds(cap_seconds * fraction);
}

bool IsRetryable(const AttemptOutcome& outcome) {
  if (outcome.transport_error) return true;
  // Out of space or over a quota: the same bytes are refused again until someone frees space.
  if (outcome.s3_code == "QuotaExceeded" || outcome.s3_code == "InsufficientStorage" ||
      outcome.http_status == 507) {
    return false;
  }
  if (outcome.s3_code == "SlowDown" || outcome.s3_code == "RequestTimeout" ||
      outcome.s3_code == "InternalError" || outcome.s3_code == "ServiceUnavailable" ||
      outcome.s3_code == "RequestTimeTooSkewed") {
    return true;
  }
  return outcome.http_status == 429 || outcome.http_status >= 500;
}

}  // namespace reshard
