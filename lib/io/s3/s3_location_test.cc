#include "lib/io/s3/s3_location.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

TEST(S3LocationTest, ParsesBucketAndKey) {
  absl::StatusOr<S3Location> location = ParseS3Url("s3://my-bucket/runs/step100/model.safetensors");
  ASSERT_TRUE(location.ok()) << location.status();
  EXPECT_EQ(location->bucket, "my-bucket");
  EXPECT_EQ(location->key, "runs/step100/model.safetensors");
  EXPECT_EQ(location->ToString(), "s3://my-bucket/runs/step100/model.safetensors");
}

TEST(S3LocationTest, BucketOnlyAndTrailingSlash) {
  absl::StatusOr<S3Location> bucket = ParseS3Url("s3://abc");
  ASSERT_TRUE(bucket.ok()) << bucket.status();
  EXPECT_EQ(bucket->key, "");
  EXPECT_EQ(bucket->ToString(), "s3://abc");
  absl::StatusOr<S3Location> folder = ParseS3Url("s3://abc/out/");
  ASSERT_TRUE(folder.ok()) << folder.status();
  EXPECT_EQ(folder->key, "out/");
}

TEST(S3LocationTest, Child) {
  S3Location root{"b12", ""};
  EXPECT_EQ(root.Child("x").ToString(), "s3://b12/x");
  EXPECT_EQ((S3Location{"b12", "p"}).Child("x").key, "p/x");
  EXPECT_EQ((S3Location{"b12", "p/"}).Child("x").key, "p/x");
}

TEST(S3LocationTest, RejectsBadBuckets) {
  for (const char* url :
       {"s3://", "s3://ab", "s3://Upper", "s3://under_score/x", "s3://-lead", "s3://trail-",
        "s3://a..b", "s3://192.168.1.2/k",
        "s3://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}) {
    absl::StatusOr<S3Location> location = ParseS3Url(url);
    ASSERT_FALSE(location.ok()) << url;
    EXPECT_EQ(location.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(location.status().message(), HasSubstr(url));
    EXPECT_THAT(location.status().message(), HasSubstr("bucket"));
  }
}

TEST(S3LocationTest, RejectsBadKeys) {
  for (const char* url : {"s3://bucket//k", "s3://bucket/a//b", "s3://bucket/a/./b",
                          "s3://bucket/a/../b", "s3://bucket/..", "s3://bucket/a\tb"}) {
    absl::StatusOr<S3Location> location = ParseS3Url(url);
    ASSERT_FALSE(location.ok()) << url;
    EXPECT_EQ(location.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(location.status().message(), HasSubstr("key"));
  }
  EXPECT_FALSE(ParseS3Url("s3://bucket/" + std::string(1025, 'k')).ok());
  EXPECT_TRUE(ParseS3Url("s3://bucket/" + std::string(1024, 'k')).ok());
}

TEST(S3LocationTest, NotAnS3Url) {
  absl::StatusOr<S3Location> location = ParseS3Url("gs://bucket/key");
  ASSERT_FALSE(location.ok());
  EXPECT_THAT(location.status().message(), HasSubstr("gs://bucket/key"));
}

}  // namespace
}  // namespace reshard
