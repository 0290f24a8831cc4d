#include "lib/io/s3/retry_policy.h"

#include "gtest/gtest.h"

namespace reshard {
namespace {

TEST(RetryPolicyTest, Classification) {
  EXPECT_TRUE(IsRetryable({.transport_error = true}));
  EXPECT_TRUE(IsRetryable({.http_status = 500}));
  EXPECT_TRUE(IsRetryable({.http_status = 503, .s3_code = "SlowDown"}));
  EXPECT_TRUE(IsRetryable({.http_status = 429}));
  EXPECT_TRUE(IsRetryable({.http_status = 400, .s3_code = "RequestTimeout"}));
  EXPECT_FALSE(IsRetryable({.http_status = 404, .s3_code = "NoSuchKey"}));
  EXPECT_FALSE(IsRetryable({.http_status = 403, .s3_code = "SignatureDoesNotMatch"}));
  EXPECT_FALSE(IsRetryable({.http_status = 400, .s3_code = "EntityTooSmall"}));
  EXPECT_FALSE(IsRetryable({.http_status = 416}));
  // Out of space or over a quota: resending the bytes cannot help.
  EXPECT_FALSE(IsRetryable({.http_status = 403, .s3_code = "QuotaExceeded"}));
  EXPECT_FALSE(IsRetryable({.http_status = 507, .s3_code = "InsufficientStorage"}));
  EXPECT_FALSE(IsRetryable({.http_status = 507}));
}

TEST(RetryPolicyTest, BackoffGrowsAndIsCapped) {
  RetryPolicy policy;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Seconds(1);
  EXPECT_EQ(policy.BackoffCap(1), absl::Milliseconds(100));
  EXPECT_EQ(policy.BackoffCap(2), absl::Milliseconds(200));
  EXPECT_EQ(policy.BackoffCap(4), absl::Milliseconds(800));
  EXPECT_EQ(policy.BackoffCap(5), absl::Seconds(1));
  EXPECT_EQ(policy.BackoffCap(60), absl::Seconds(1));
}

TEST(RetryPolicyTest, BackoffIsJitteredWithinCap) {
  RetryPolicy policy;
  absl::BitGen gen;
  absl::Duration min = absl::InfiniteDuration(), max = absl::ZeroDuration();
  for (int i = 0; i < 1000; ++i) {
    const absl::Duration wait = policy.Backoff(3, gen);
    ASSERT_GE(wait, absl::ZeroDuration());
    ASSERT_LE(wait, policy.BackoffCap(3));
    min = std::min(min, wait);
    max = std::max(max, wait);
  }
  // Full jitter spreads the waits over the whole interval.
  EXPECT_LT(min, policy.BackoffCap(3) / 4);
  EXPECT_GT(max, policy.BackoffCap(3) * 3 / 4);
}

}  // namespace
}  // namespace reshard
