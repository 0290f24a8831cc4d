#include "lib/io/s3/s3_retry.h"

#include <curl/curl.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace {

constexpr char kWhat[] = "GET s3://b/k";

// A clock that moves only when the loop waits or the test says so; the waits are kept.
struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1'000'000);
  std::vector<absl::Duration> waits;
  double jitter = 0.5;

  S3RetryClock Clock() {
    S3RetryClock clock;
    clock.now = [this] { return now; };
    clock.sleep = [this](absl::Duration wait) {
      waits.push_back(wait);
      now += wait;
    };
    clock.jitter = [this] { return jitter; };
    return clock;
  }
};

S3RetrySettings Settings() {
  S3RetrySettings settings;
  settings.retry.max_attempts = 6;
  settings.retry.initial_backoff = absl::Milliseconds(100);
  settings.retry.max_backoff = absl::Milliseconds(500);
  return settings;
}

// An answer with `status` and S3 error `code`, as Send hands it over.
S3AttemptEnd Answer(absl::Time ended, int status, const std::string& code,
                    absl::StatusCode status_code) {
  S3AttemptEnd end;
  end.ended = ended;
  end.http_status = status;
  end.s3_code = code;
  end.answer_error = absl::Status(status_code, absl::StrCat(kWhat, ": HTTP ", status, " ", code));
  return end;
}

S3AttemptEnd CurlError(absl::Time ended, CURLcode code, const std::string& text) {
  S3AttemptEnd end;
  end.ended = ended;
  end.curl_code = code;
  end.curl_error = text;
  return end;
}

// Whether one failed attempt is followed by another, and the final error's code when not.
absl::Status AfterOneAttempt(const S3AttemptEnd& failed) {
  FakeClock time;
  S3RetryLoop loop(Settings(), S3RetryRequest{}, kWhat, time.Clock());
  EXPECT_TRUE(loop.NextAttempt().ok());
  S3AttemptEnd end = failed;
  end.ended = time.now;
  return loop.AttemptFailed(end);
}

TEST(S3RetryLoopTest, WhichEndingsRetry) {
  const absl::Time t;
  // Transport failures.
  EXPECT_TRUE(AfterOneAttempt(CurlError(t, CURLE_COULDNT_CONNECT, "Couldn't connect")).ok());
  EXPECT_TRUE(AfterOneAttempt(CurlError(t, CURLE_RECV_ERROR, "Failure receiving")).ok());
  EXPECT_TRUE(AfterOneAttempt(CurlError(t, CURLE_PARTIAL_FILE, "Transferred a partial")).ok());
  EXPECT_TRUE(AfterOneAttempt(CurlError(t, CURLE_GOT_NOTHING, "Empty reply")).ok());
  // Server errors, throttling and timeouts.
  for (int status : {500, 502, 503, 504}) {
    EXPECT_TRUE(AfterOneAttempt(Answer(t, status, "", absl::StatusCode::kUnavailable)).ok())
        << status;
  }
  EXPECT_TRUE(AfterOneAttempt(Answer(t, 429, "", absl::StatusCode::kUnavailable)).ok());
  EXPECT_TRUE(AfterOneAttempt(Answer(t, 503, "SlowDown", absl::StatusCode::kUnavailable)).ok());
  EXPECT_TRUE(
      AfterOneAttempt(Answer(t, 400, "RequestTimeout", absl::StatusCode::kUnavailable)).ok());
  // Final: the request itself is wrong, or the store is full.
  const absl::Status missing =
      AfterOneAttempt(Answer(t, 404, "NoSuchKey", absl::StatusCode::kNotFound));
  EXPECT_EQ(missing, absl::NotFoundError("GET s3://b/k: HTTP 404 NoSuchKey"));
  EXPECT_EQ(
      AfterOneAttempt(Answer(t, 403, "AccessDenied", absl::StatusCode::kPermissionDenied)).code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      AfterOneAttempt(Answer(t, 507, "InsufficientStorage", absl::StatusCode::kResourceExhausted))
          .code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(AfterOneAttempt(Answer(t, 416, "InvalidRange", absl::StatusCode::kOutOfRange)).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(S3RetryLoopTest, WaitsAreTheJitteredFractionOfACapThatDoublesUpToItsMaximum) {
  FakeClock time;
  time.jitter = 0.5;
  S3RetryLoop loop(Settings(), S3RetryRequest{}, kWhat, time.Clock());
  absl::Status status;
  int attempts = 0;
  while ((status = loop.NextAttempt()).ok()) {
    ++attempts;
    EXPECT_EQ(loop.attempt(), attempts);
    ASSERT_TRUE(
        loop.AttemptFailed(Answer(time.now, 503, "SlowDown", absl::StatusCode::kUnavailable)).ok());
  }
  EXPECT_EQ(attempts, 6);
  // Caps 100, 200, 400, 500, 500 ms; half of each.
  EXPECT_EQ(time.waits,
            (std::vector<absl::Duration>{absl::Milliseconds(50), absl::Milliseconds(100),
                                         absl::Milliseconds(200), absl::Milliseconds(250),
                                         absl::Milliseconds(250)}));
  EXPECT_EQ(status, absl::UnavailableError("after 6 attempts: GET s3://b/k: HTTP 503 SlowDown"));
}

TEST(S3RetryLoopTest, WaitsReachTheCapWithTheHighestDraw) {
  FakeClock time;
  time.jitter = 1.0;
  S3RetryLoop loop(Settings(), S3RetryRequest{}, kWhat, time.Clock());
  while (loop.NextAttempt().ok()) {
    ASSERT_TRUE(loop.AttemptFailed(CurlError(time.now, CURLE_RECV_ERROR, "Failure")).ok());
  }
  EXPECT_EQ(time.waits,
            (std::vector<absl::Duration>{absl::Milliseconds(100), absl::Milliseconds(200),
                                         absl::Milliseconds(400), absl::Milliseconds(500),
                                         absl::Milliseconds(500)}));
}

TEST(S3RetryLoopTest, NoWaitBeginsThatWouldEndPastTheDeadline) {
  FakeClock time;
  time.jitter = 0.9;
  S3RetrySettings settings = Settings();
  settings.retry.initial_backoff = absl::Seconds(1);
  settings.retry.max_backoff = absl::Seconds(10);
  settings.request_deadline = absl::Seconds(2);
  S3RetryLoop loop(settings, S3RetryRequest{}, kWhat, time.Clock());
  EXPECT_EQ(loop.allowed(), absl::Seconds(2));
  ASSERT_TRUE(loop.NextAttempt().ok());
  time.now += absl::Milliseconds(100);
  ASSERT_TRUE(loop.AttemptFailed(CurlError(time.now, CURLE_RECV_ERROR, "Failure receiving")).ok());
  ASSERT_TRUE(loop.NextAttempt().ok());  // waits 0.9 s: ends at 1 s of 2
  time.now += absl::Milliseconds(100);
  ASSERT_TRUE(loop.AttemptFailed(CurlError(time.now, CURLE_RECV_ERROR, "Failure receiving")).ok());
  // The next wait, 1.8 s, would end at 2.9 s.
  EXPECT_EQ(loop.NextAttempt(),
            absl::DeadlineExceededError(
                "GET s3://b/k: not done within the request deadline of 2s after 2 attempts "
                "(last: Failure receiving (curl 56))"));
  EXPECT_EQ(time.waits, std::vector<absl::Duration>{absl::Milliseconds(900)});
}

TEST(S3RetryLoopTest, AnAttemptCutAtTheDeadlineEndsTheRequest) {
  FakeClock time;
  S3RetrySettings settings = Settings();
  settings.request_deadline = absl::Seconds(2);
  S3RetryRequest request;
  request.body_bytes = 100;
  settings.min_throughput = 0;
  S3RetryLoop loop(settings, request, kWhat, time.Clock());
  ASSERT_TRUE(loop.NextAttempt().ok());
  EXPECT_EQ(loop.time_limit(), absl::Seconds(2));
  EXPECT_FALSE(loop.floor_limit());
  time.now += absl::Seconds(2);
  S3AttemptEnd end = CurlError(time.now, CURLE_OPERATION_TIMEDOUT, "Timeout was reached");
  end.sent = 40;
  end.received = 0;
  EXPECT_EQ(loop.AttemptFailed(end),
            absl::DeadlineExceededError(
                "GET s3://b/k: not done within the request deadline of 2s after 1 attempt "
                "(last: Timeout was reached (curl 28); 40 of 100 bytes sent, 0 bytes received)"));
  EXPECT_FALSE(loop.NextAttempt().ok());
}

TEST(S3RetryLoopTest, ABodyAddsItsBytesAtTheFloorInWholeSeconds) {
  FakeClock time;
  S3RetryRequest request;
  request.body_bytes = (8 << 20) + 1;  // 256.00003 s at 32 KiB/s
  S3RetryLoop loop(Settings(), request, kWhat, time.Clock());
  EXPECT_EQ(loop.allowed(), absl::Minutes(2) + absl::Seconds(257));
  EXPECT_EQ(loop.min_rate(), 0) << "only range reads have the floor";
}

TEST(S3RetryLoopTest, StalledAttemptsEndTheRequestAtTheirMaximum) {
  FakeClock time;
  S3RetrySettings settings = Settings();
  settings.max_stalled_attempts = 2;
  settings.stall_timeout = absl::Seconds(60);
  settings.request_deadline = absl::Minutes(10);
  S3RetryLoop loop(settings, S3RetryRequest{}, kWhat, time.Clock());
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_TRUE(loop.NextAttempt().ok());
    time.now += absl::Seconds(60);
    S3AttemptEnd end = CurlError(time.now, CURLE_OPERATION_TIMEDOUT, "Timeout was reached");
    end.received = 7;
    const absl::Status status = loop.AttemptFailed(end);
    if (attempt == 1) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      EXPECT_EQ(status, absl::DeadlineExceededError(
                            "after 2 attempts: GET s3://b/k: no progress for 1m (7 bytes "
                            "received)"));
    }
  }
}

TEST(S3RetryLoopTest, ATimeoutBeforeConnectingIsUnavailableAndRetried) {
  FakeClock time;
  S3RetryLoop loop(Settings(), S3RetryRequest{}, kWhat, time.Clock());
  ASSERT_TRUE(loop.NextAttempt().ok());
  time.now += absl::Seconds(10);
  S3AttemptEnd end = CurlError(time.now, CURLE_OPERATION_TIMEDOUT, "Timeout was reached");
  end.connected = false;
  EXPECT_TRUE(loop.AttemptFailed(end).ok());
  time.jitter = 0;
  ASSERT_TRUE(loop.NextAttempt().ok());
  ASSERT_TRUE(
      loop.AttemptFailed(Answer(time.now, 404, "NoSuchKey", absl::StatusCode::kNotFound)).code() ==
      absl::StatusCode::kNotFound);
}

TEST(S3RetryLoopTest, ARangeReadBelowTheFloorIsCutAtItsLimitAndRetried) {
  FakeClock time;
  S3RetrySettings settings = Settings();
  settings.min_throughput = 32 << 10;
  settings.throughput_grace = absl::Seconds(30);
  settings.read_deadline = absl::Minutes(10);
  S3RetryRequest request;
  request.throughput_floor = true;
  request.span_bytes = 16 << 20;  // 512 s at 32 KiB/s
  S3RetryLoop loop(settings, request, kWhat, time.Clock());
  EXPECT_EQ(loop.allowed(), absl::Minutes(10));
  ASSERT_TRUE(loop.NextAttempt().ok());
  EXPECT_EQ(loop.time_limit(), absl::Seconds(542));
  EXPECT_TRUE(loop.floor_limit());
  EXPECT_EQ(loop.min_rate(), 32 << 10);
  EXPECT_EQ(loop.grace(), absl::Seconds(30));
  // Cut at the floor's limit with 1 MiB of 16: too slow.
  time.now += absl::Seconds(542);
  S3AttemptEnd end = CurlError(time.now, CURLE_OPERATION_TIMEDOUT, "Timeout was reached");
  end.span_bytes = 1 << 20;
  end.received = 1 << 20;
  EXPECT_TRUE(loop.AttemptFailed(end).ok());
  // The next attempt has what is left of the deadline: 58 s minus the wait.
  time.jitter = 0;
  ASSERT_TRUE(loop.NextAttempt().ok());
  EXPECT_EQ(loop.time_limit(), absl::Seconds(58));
  EXPECT_FALSE(loop.floor_limit());
  // Aborted by OnTransferProgress below the floor.
  time.now += absl::Seconds(40);
  end = CurlError(time.now, CURLE_ABORTED_BY_CALLBACK, "Callback aborted");
  end.too_slow = true;
  end.slow_bytes = 1024 * 40;
  end.slow_elapsed = absl::Seconds(40);
  EXPECT_TRUE(loop.AttemptFailed(end).ok());
  time.now += absl::Seconds(18);
  EXPECT_EQ(loop.NextAttempt(),
            absl::DeadlineExceededError(
                "GET s3://b/k: not done within the read deadline of 10m after 2 attempts (last: "
                "received 40960 bytes in 40.0 s (1.0 KiB/s, below the 32.0 KiB/s minimum))"));
}

// A timeout inside the grace period (libcurl's low-speed rule) is not the floor's: the attempt
// is retried, named by the floor's time limit.
TEST(S3RetryLoopTest, ATimeoutInsideTheGraceIsNotTooSlow) {
  FakeClock time;
  S3RetrySettings settings = Settings();
  settings.stall_timeout = absl::Seconds(20);
  S3RetryRequest request;
  request.throughput_floor = true;
  request.span_bytes = 16 << 20;
  S3RetryLoop loop(settings, request, kWhat, time.Clock());
  ASSERT_TRUE(loop.NextAttempt().ok());
  time.now += absl::Seconds(20);
  S3AttemptEnd end = CurlError(time.now, CURLE_OPERATION_TIMEDOUT, "Timeout was reached");
  end.span_bytes = 5;
  end.received = 5;
  EXPECT_TRUE(loop.AttemptFailed(end).ok());
  time.jitter = 0;
  time.now += absl::Minutes(10);
  EXPECT_EQ(loop.NextAttempt(),
            absl::DeadlineExceededError(
                "GET s3://b/k: not done within the read deadline of 10m after 1 attempt (last: "
                "not done within 9m2s (5 bytes received))"));
}

}  // namespace
}  // namespace reshard
