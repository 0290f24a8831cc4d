#include "lib/io/s3/s3_retry.h"

#include <curl/curl.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/random/distributions.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "lib/io/s3/s3_transfer.h"

namespace reshard {

S3RetryClock S3RetryClock::Real() {
  S3RetryClock clock;
  clock.now = [] { return absl::Now(); };
  clock.sleep = [](absl::Duration wait) { absl::SleepFor(wait); };
  clock.jitter = [gen = std::make_shared<absl::BitGen>()] { return absl::Uniform(*gen, 0.0, 1.0); };
  return clock;
}

S3RetryLoop::S3RetryLoop(const S3RetrySettings& settings, const S3RetryRequest& request,
                         absl::string_view what, S3RetryClock clock)
    : settings_(settings), request_(request), what_(what), clock_(std::move(clock)) {
  allowed_ = settings_.read_deadline;
  deadline_name_ = "read";
  if (!request_.throughput_floor) {
    deadline_name_ = "request";
    allowed_ = settings_.request_deadline;
    if (request_.body_bytes > 0 && settings_.min_throughput > 0) {
      // Whole seconds, so that messages read "2m5s".
      allowed_ += absl::Ceil(absl::Seconds(static_cast<double>(request_.body_bytes) /
                                           static_cast<double>(settings_.min_throughput)),
                             absl::Seconds(1));
    }
  }
  deadline_ = clock_.now() + allowed_;
}

double S3RetryLoop::min_rate() const {
  if (!request_.throughput_floor) return 0;
  return static_cast<double>(settings_.min_throughput);
}

absl::Status S3RetryLoop::PastDeadline() const {
  return absl::DeadlineExceededError(
      absl::StrCat(what_, ": not done within the ", deadline_name_, " deadline of ",
                   absl::FormatDuration(allowed_), " after ", attempt_,
                   attempt_ == 1 ? " attempt" : " attempts", " (last: ", last_detail_, ")"));
}

void S3RetryLoop::Fail(absl::StatusCode code, std::string detail) {
  last_error_ = absl::Status(code, absl::StrCat(what_, ": ", detail));
  last_detail_ = std::move(detail);
}

absl::Status S3RetryLoop::NextAttempt() {
  if (final_) return last_error_;
  if (attempt_ > 0) {
    if (attempt_ >= settings_.retry.max_attempts) {
      return Annotate(last_error_,
                      absl::StrCat("after ", settings_.retry.max_attempts, " attempts"));
    }
    const absl::Duration wait = settings_.retry.BackoffAt(attempt_, clock_.jitter());
    if (clock_.now() + wait >= deadline_) return PastDeadline();
    clock_.sleep(wait);
  }
  ++attempt_;
  attempt_start_ = clock_.now();
  time_limit_ = std::max(absl::Milliseconds(1), deadline_ - attempt_start_);
  floor_limit_ = false;
  if (min_rate() > 0) {
    const absl::Duration floor_time =
        settings_.throughput_grace +
        absl::Seconds(static_cast<double>(request_.span_bytes) / min_rate());
    if (floor_time < time_limit_) {
      time_limit_ = floor_time;
      floor_limit_ = true;
    }
  }
  return absl::OkStatus();
}

absl::Status S3RetryLoop::AttemptFailed(const S3AttemptEnd& end) {
  const auto final_error = [this](absl::Status status) {
    final_ = true;
    last_error_ = status;
    return status;
  };
  AttemptOutcome outcome;
  const absl::Duration elapsed = end.ended - attempt_start_;
  bool too_slow = end.too_slow;
  uint64_t slow_bytes = end.slow_bytes;
  absl::Duration slow_elapsed = end.slow_elapsed;
  // Cut by the floor's time limit while below the floor: too slow, as an abort by
  // OnTransferProgress would have found.
  if (!too_slow && end.curl_code == CURLE_OPERATION_TIMEDOUT && floor_limit_ &&
      elapsed >= settings_.throughput_grace &&
      static_cast<double>(end.span_bytes) < min_rate() * absl::ToDoubleSeconds(elapsed)) {
    too_slow = true;
    slow_bytes = end.span_bytes;
    slow_elapsed = elapsed;
  }
  if (too_slow) {
    outcome.transport_error = true;
    const double seconds = absl::ToDoubleSeconds(slow_elapsed);
    Fail(absl::StatusCode::kDeadlineExceeded,
         absl::StrFormat("received %d bytes in %.1f s (%s, below the %s minimum)", slow_bytes,
                         seconds, KiBPerSecond(static_cast<double>(slow_bytes) / seconds),
                         KiBPerSecond(min_rate())));
  } else if (end.curl_code == CURLE_OPERATION_TIMEDOUT) {
    outcome.transport_error = true;
    const std::string transferred =
        absl::StrCat(request_.body_bytes > 0
                         ? absl::StrCat(end.sent, " of ", request_.body_bytes, " bytes sent, ")
                         : std::string(),
                     end.received, " bytes received");
    if (end.ended >= deadline_ - absl::Milliseconds(10)) {  // CURLOPT_TIMEOUT_MS is in ms
      last_detail_ = absl::StrCat(end.curl_error, " (curl ", end.curl_code, "); ", transferred);
      return final_error(PastDeadline());
    }
    if (!end.connected) {
      Fail(
          absl::StatusCode::kUnavailable,
          absl::StrCat("could not connect within ", absl::FormatDuration(settings_.connect_timeout),
                       " (", end.curl_error, ", curl ", end.curl_code, ")"));
    } else if (floor_limit_) {
      Fail(absl::StatusCode::kDeadlineExceeded,
           absl::StrCat("not done within ", absl::FormatDuration(time_limit_), " (", transferred,
                        ")"));
    } else {
      // libcurl's low-speed rule: under 1 KiB/s for stall_timeout.
      ++stalls_;
      Fail(absl::StatusCode::kDeadlineExceeded,
           absl::StrCat("no progress for ", absl::FormatDuration(settings_.stall_timeout), " (",
                        transferred, ")"));
      if (stalls_ >= settings_.max_stalled_attempts) {
        return final_error(
            Annotate(last_error_,
                     absl::StrCat("after ", attempt_, attempt_ == 1 ? " attempt" : " attempts")));
      }
    }
  } else if (end.curl_code != CURLE_OK) {
    outcome.transport_error = true;
    Fail(absl::StatusCode::kUnavailable,
         absl::StrCat(end.curl_error, " (curl ", end.curl_code, ")"));
  } else {
    outcome.http_status = end.http_status;
    outcome.s3_code = end.s3_code;
    absl::string_view detail = end.answer_error.message();
    absl::ConsumePrefix(&detail, absl::StrCat(what_, ": "));
    Fail(end.answer_error.code(), std::string(detail));
  }
  if (!IsRetryable(outcome)) return final_error(last_error_);
  return absl::OkStatus();
}

}  // namespace reshard
