#include "server/s3_collector.h"

#include <stdlib.h>

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "lib/io/s3/default_client.h"

namespace reshard {
namespace {

std::map<std::string, double> Counters(const S3Collector& collector) {
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : collector.Collect()) {
    EXPECT_EQ(family.type, prometheus::MetricType::Counter) << family.name;
    EXPECT_EQ(family.metric.size(), 1u) << family.name;
    values[family.name] = family.metric.at(0).counter.value;
  }
  return values;
}

TEST(S3CollectorTest, ZeroUntilAClientExistsThenItsCounts) {
  S3Collector collector;
  std::map<std::string, double> before = Counters(collector);
  EXPECT_EQ(before.size(), 2u);
  EXPECT_EQ(before["reshard_s3_requests_total"], 0);
  EXPECT_EQ(before["reshard_s3_retries_total"], 0);

  // A client towards a port nobody listens on: one HEAD, retried, then refused.
  ::setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9", 1);
  absl::StatusOr<S3Client*> client = DefaultS3Client();
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE((*client)->Head("bucket", "key").ok());
  std::map<std::string, double> after = Counters(collector);
  EXPECT_GE(after["reshard_s3_requests_total"], 2);
  EXPECT_EQ(after["reshard_s3_retries_total"], after["reshard_s3_requests_total"] - 1);
}

}  // namespace
}  // namespace reshard
