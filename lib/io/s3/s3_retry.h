// The retry loop of one S3 request (S3Client::Send): the deadline of all its attempts, the
// wait before each retry, the time limit of each attempt, and what an attempt's ending means:
// another attempt, or a final error naming the request.
//
//   - Deadline. A range read (S3Request::throughput_floor) has `read_deadline`; any other
//     request `request_deadline` plus its body's bytes at `min_throughput`, in whole seconds.
//     No attempt starts, and no wait begins, that would end past it; the attempt under way is
//     cut there, and the error is DeadlineExceeded "<what>: not done within the read|request
//     deadline of D after N attempts (last: <how the last attempt ended>)".
//   - Waits. Before retry n: a uniform draw in [0, RetryPolicy::BackoffCap(n)] (full jitter).
//     A `Retry-After` header is not read: the jittered wait is all the pause.
//   - Which endings retry: IsRetryable (retry_policy.h) of the answer's status and S3 code, and
//     every transport failure (curl errors, a connection that could not be made within
//     `connect_timeout`, an attempt too slow for the throughput floor). A stall (libcurl's
//     low-speed rule: under 1 KiB/s for `stall_timeout`) retries until `max_stalled_attempts`
//     stalls, then fails "after N attempts: <what>: no progress for D (...)". After
//     `retry.max_attempts` attempts the last error is returned with "after N attempts".
//   - Throughput floor (range reads, `min_throughput` > 0): an attempt also ends at
//     `throughput_grace` + its bytes / min_throughput when that comes before the deadline, and
//     one cut there (or aborted by OnTransferProgress) below the floor's average rate is too
//     slow: DeadlineExceeded "received N bytes in S s (R, below the F minimum)", retried.
//
// Time goes through S3RetryClock so that tests decide it: no real waits, exact answers.

#ifndef RESHARD_LIB_IO_S3_S3_RETRY_H_
#define RESHARD_LIB_IO_S3_S3_RETRY_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "lib/io/s3/retry_policy.h"

namespace reshard {

// How S3 requests are retried and cut (S3Client::Options).
struct S3RetrySettings {
  RetryPolicy retry;
  // Default: 10 s.
  absl::Duration connect_timeout = absl::Seconds(10);
  // An attempt that moves less than 1 KiB/s for this long, in either direction (a server
  // that stops reading the body or never answers), is aborted: a stall. Default: 60 s.
  absl::Duration stall_timeout = absl::Seconds(60);
  // Stalled attempts after which a request fails (DeadlineExceeded) without more retries: a
  // store that stalls twice in a row is stuck, not busy. Default: 2.
  int max_stalled_attempts = 2;
  // Range GETs: the least average rate of the body since the request was sent, in bytes per
  // second, checked once `throughput_grace` has passed; a slower attempt is aborted (and
  // retried). An attempt also ends at throughput_grace + its bytes / min_throughput. 0: no
  // floor. Default: 32 KiB/s (a 16 MiB span then has 542 s) after 30 s.
  uint64_t min_throughput = 32 << 10;
  absl::Duration throughput_grace = absl::Seconds(30);
  // Time for one range read, all its attempts and the waits between them included: no attempt
  // starts after it and the one under way is cut there. Default: 10 min.
  absl::Duration read_deadline = absl::Minutes(10);
  // Time for any other request, all its attempts and the waits between them included, plus
  // its body's bytes at min_throughput (an 8 MiB part: 2 min + 256 s; S3's largest part,
  // 5 GiB, is not cut on a link that keeps the floor): no attempt starts after it and the
  // one under way is cut there (DeadlineExceeded). Default: 2 min.
  absl::Duration request_deadline = absl::Minutes(2);
};

// What a request is, as far as its deadline and floor go.
struct S3RetryRequest {
  // A range read: read_deadline and the throughput floor over `span_bytes`.
  bool throughput_floor = false;
  uint64_t span_bytes = 0;
  // The bytes of the request's body (0: none).
  uint64_t body_bytes = 0;
};

// The clock, the waits and the jitter of a retry loop. The defaults are the real ones.
struct S3RetryClock {
  std::function<absl::Time()> now;
  std::function<void(absl::Duration)> sleep;
  // A uniform draw in [0, 1): the fraction of each wait's cap that is waited.
  std::function<double()> jitter;

  static S3RetryClock Real();
};

// How one attempt ended: what libcurl and the callbacks (s3_transfer.h) tell of it.
struct S3AttemptEnd {
  // CURLcode; 0 (CURLE_OK) when an answer was received.
  int curl_code = 0;
  // curl_easy_strerror(curl_code).
  std::string curl_error;
  absl::Time ended;
  // False when no connection was made (CURLINFO_CONNECT_TIME_T of 0).
  bool connected = true;
  // Body bytes sent (CURLINFO_SIZE_UPLOAD_T) and answer bytes received.
  uint64_t sent = 0;
  uint64_t received = 0;
  // Bytes received into the caller's span (range reads).
  uint64_t span_bytes = 0;
  // Set by OnTransferProgress when it aborted the attempt below the floor.
  bool too_slow = false;
  uint64_t slow_bytes = 0;
  absl::Duration slow_elapsed;
  // With curl_code 0: the answer's HTTP status, its S3 error code, and the error as
  // S3ErrorToStatus gives it for `what` (s3_xml.h). Not used for a 2xx answer.
  int http_status = 0;
  std::string s3_code;
  absl::Status answer_error;
};

// One request's attempts. Use:
//
//   S3RetryLoop loop(settings, request, what);
//   for (;;) {
//     RETURN_IF_ERROR(loop.NextAttempt());  // waits; the final error when none is left
//     ... send with loop.time_limit() ...
//     if (answered with 2xx) return answer;
//     RETURN_IF_ERROR(loop.AttemptFailed(end));  // OK: try again
//   }
//
// Not thread safe: one request's loop.
class S3RetryLoop {
 public:
  S3RetryLoop(const S3RetrySettings& settings, const S3RetryRequest& request,
              absl::string_view what, S3RetryClock clock = S3RetryClock::Real());

  // Starts the next attempt: OK, after the wait before a retry, or the final error when no
  // attempt may start (the attempts are used up, or the wait would end past the deadline).
  absl::Status NextAttempt();
  // The attempt under way: its number (1 for the first), when it started, its time limit
  // (until the deadline, or the throughput floor's limit when that is earlier, at least 1 ms),
  // and whether the floor sets that limit.
  int attempt() const { return attempt_; }
  absl::Time attempt_start() const { return attempt_start_; }
  absl::Duration time_limit() const { return time_limit_; }
  bool floor_limit() const { return floor_limit_; }
  // The floor's least average rate in bytes per second for the transfer callbacks (0: none),
  // and its grace period.
  double min_rate() const;
  absl::Duration grace() const { return settings_.throughput_grace; }

  // The attempt under way failed as `end` says: OK when another attempt may follow (call
  // NextAttempt), otherwise the final error.
  absl::Status AttemptFailed(const S3AttemptEnd& end);

  // The deadline of all attempts, and how long it allows.
  absl::Time deadline() const { return deadline_; }
  absl::Duration allowed() const { return allowed_; }

 private:
  absl::Status PastDeadline() const;
  // Records the attempt's error: `detail` is how it ended, without `what`.
  void Fail(absl::StatusCode code, std::string detail);

  const S3RetrySettings settings_;
  const S3RetryRequest request_;
  const std::string what_;
  const S3RetryClock clock_;
  absl::string_view deadline_name_;
  absl::Duration allowed_;
  absl::Time deadline_;
  int attempt_ = 0;
  int stalls_ = 0;
  bool final_ = false;  // the last attempt's error is final
  absl::Time attempt_start_;
  absl::Duration time_limit_;
  bool floor_limit_ = false;
  absl::Status last_error_;
  std::string last_detail_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_RETRY_H_
