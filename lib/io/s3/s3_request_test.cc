#include "lib/io/s3/s3_request.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

S3Config Endpoint(const std::string& endpoint, bool path_style) {
  S3Config config;
  config.endpoint = endpoint;
  config.path_style = path_style;
  return config;
}

TEST(S3UriEncodeTest, KeepsUnreservedCharactersAndTheSlashOfPaths) {
  EXPECT_EQ(S3UriEncode("a-Z_0.~/b c+d", /*keep_slash=*/true), "a-Z_0.~/b%20c%2Bd");
  EXPECT_EQ(S3UriEncode("a/b=c&\xff", /*keep_slash=*/false), "a%2Fb%3Dc%26%FF");
}

TEST(S3RequestUrlTest, PathStyleNamesTheBucketInThePath) {
  const S3Config config = Endpoint("http://127.0.0.1:7480", /*path_style=*/true);
  EXPECT_EQ(S3RequestUrl(config, "bench", "model/a b.safetensors", ""),
            "http://127.0.0.1:7480/bench/model/a%20b.safetensors");
  EXPECT_EQ(S3RequestUrl(config, "bench", "", "list-type=2&prefix=m"),
            "http://127.0.0.1:7480/bench?list-type=2&prefix=m");
}

TEST(S3RequestUrlTest, VirtualHostedStyleNamesTheBucketInTheHost) {
  const S3Config config = Endpoint("https://s3.eu-west-1.amazonaws.com", /*path_style=*/false);
  EXPECT_EQ(S3RequestUrl(config, "bench", "k/x", "uploads="),
            "https://bench.s3.eu-west-1.amazonaws.com/k/x?uploads=");
  EXPECT_EQ(S3RequestUrl(config, "bench", "", ""), "https://bench.s3.eu-west-1.amazonaws.com/");
}

TEST(ParseObjectSizeTest, TakesSizesUpTo5TiBAndNamesWhatSentOthers) {
  absl::StatusOr<uint64_t> size = ParseObjectSize("5497558138880", "HEAD s3://b/k");
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, kS3MaxObjectBytes);
  for (const char* bad : {"5497558138881", "-1", "12x", ""}) {
    const absl::StatusOr<uint64_t> refused = ParseObjectSize(bad, "HEAD s3://b/k");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(refused.status().message(),
              absl::StrCat("HEAD s3://b/k: server sent an invalid object size \"", bad, "\""));
  }
}

TEST(ResponseHeaderTest, EmptyWhenAbsent) {
  S3Response response;
  response.headers["etag"] = "\"abc\"";
  EXPECT_EQ(ResponseHeader(response, "etag"), "\"abc\"");
  EXPECT_EQ(ResponseHeader(response, "content-length"), "");
}

}  // namespace
}  // namespace reshard
