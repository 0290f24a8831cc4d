// The checks RunConversionToObjectStore makes before it reads the input or writes anything.
// The protocol itself runs against a real radosgw in //tests/s3:s3_output_test.

#include "lib/engine/object_store_output.h"

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {
namespace {

// A client of an endpoint where nothing listens, retrying briefly.
std::unique_ptr<S3Client> UnreachableClient() {
  S3Client::Options options;
  options.config.endpoint = "http://127.0.0.1:1";
  options.config.credentials.access_key_id = "KEY";
  options.config.credentials.secret_access_key = "SECRET";
  options.retry.max_attempts = 2;
  options.retry.initial_backoff = absl::Milliseconds(1);
  options.retry.max_backoff = absl::Milliseconds(1);
  options.connect_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

ConversionSpec Consolidate(const std::string& input, const std::string& output) {
  ConversionSpec spec;
  spec.input = input;
  spec.output = output;
  return spec;
}

TEST(ObjectStoreOutputTest, RefusedBeforeAnyRequest) {
  std::unique_ptr<S3Client> client = UnreachableClient();
  ASSERT_NE(client, nullptr);
  struct Case {
    ConversionSpec spec;
    absl::StatusCode code;
    std::string message;
  };
  ConversionSpec partitioned = Consolidate("/in", "s3://bucket/out");
  partitioned.partition_count = 2;
  ConversionSpec latest_of_bucket = Consolidate("/in", "s3://bucket");
  latest_of_bucket.update_latest = true;
  const Case cases[] = {
      {partitioned, absl::StatusCode::kUnimplemented, "partitioned"},
      {Consolidate("/in", "s3://Bad_Bucket/out"), absl::StatusCode::kInvalidArgument, "Bad_Bucket"},
      {Consolidate("/in", "s3://bucket/a/../b"), absl::StatusCode::kInvalidArgument, "a/../b"},
      {latest_of_bucket, absl::StatusCode::kInvalidArgument, "whole bucket"},
      {Consolidate("s3://bucket/out/model", "s3://bucket/out"), absl::StatusCode::kInvalidArgument,
       "contains the input s3://bucket/out/model"},
      {Consolidate("s3://bucket/out", "s3://bucket/out/"), absl::StatusCode::kInvalidArgument,
       "contains the input"},
      {Consolidate("s3://bucket/model", "s3://bucket"), absl::StatusCode::kInvalidArgument,
       "contains the input"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.input + " -> " + c.spec.output);
    absl::StatusOr<ConversionResult> result = RunConversionToObjectStore(c.spec, {}, *client);
    EXPECT_EQ(result.status().code(), c.code) << result.status();
    EXPECT_NE(result.status().message().find(c.message), absl::string_view::npos)
        << result.status();
  }
  EXPECT_EQ(client->stats().requests, 0u);
}

// "s3://bucket/out" and "s3://bucket/output": whole segments, so neither contains the other;
// the listing of the output is the first request, and its failure names the output.
TEST(ObjectStoreOutputTest, SiblingPrefixIsNotInsideAndListingErrorsNameTheOutput) {
  std::unique_ptr<S3Client> client = UnreachableClient();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ConversionResult> result = RunConversionToObjectStore(
      Consolidate("s3://bucket/output/model", "s3://bucket/out"), {}, *client);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(result.status().message().find("checking the output s3://bucket/out"),
            absl::string_view::npos)
      << result.status();
  EXPECT_GT(client->stats().requests, 0u);
}

}  // namespace
}  // namespace reshard
