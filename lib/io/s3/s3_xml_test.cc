#include "lib/io/s3/s3_xml.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(S3XmlTest, ElementsAndText) {
  constexpr absl::string_view kXml =
      "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3\"><IsTruncated>true"
      "</IsTruncated><Contents><Key>a&amp;b</Key><Size>3</Size></Contents>"
      "<Contents><Key>c&#x263A;&#65;</Key><Size>4</Size></Contents></ListBucketResult>";
  std::vector<absl::string_view> contents = XmlElements(kXml, "Contents");
  ASSERT_EQ(contents.size(), 2u);
  EXPECT_EQ(XmlText(contents[0], "Key"), "a&b");
  EXPECT_EQ(XmlText(contents[1], "Key"),
            "c\xE2\x98\xBA"
            "A");
  EXPECT_EQ(XmlText(kXml, "IsTruncated"), "true");
  EXPECT_EQ(XmlText(kXml, "Missing"), std::nullopt);
  EXPECT_THAT(XmlElements("<A>1</A><A>2</A><A>3", "A"), ElementsAre("1", "2"));
}

TEST(S3XmlTest, EscapeRoundTrip) {
  const std::string text = "a<b>&\"c'";
  EXPECT_EQ(XmlEscape(text), "a&lt;b&gt;&amp;&quot;c&apos;");
  EXPECT_EQ(XmlUnescape(XmlEscape(text)), text);
  EXPECT_EQ(XmlUnescape("&bogus; & &#xZZ;"), "&bogus; & &#xZZ;");
}

TEST(S3XmlTest, ParsesErrorBody) {
  S3Error error = ParseS3Error(
      404,
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchKey</Code><Message>The "
      "specified key does not exist.</Message><Key>k</Key><RequestId>tx0001</RequestId></Error>");
  EXPECT_EQ(error.code, "NoSuchKey");
  EXPECT_EQ(error.message, "The specified key does not exist.");
  EXPECT_EQ(error.request_id, "tx0001");
  absl::Status status = S3ErrorToStatus(error, "GET s3://b/k");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("GET s3://b/k: S3 NoSuchKey (HTTP 404)"));
  EXPECT_THAT(status.message(), HasSubstr("tx0001"));
}

TEST(S3XmlTest, MapsCodes) {
  struct Case {
    int http;
    const char* code;
    absl::StatusCode expected;
  };
  for (const Case& c : {
           Case{403, "SignatureDoesNotMatch", absl::StatusCode::kUnauthenticated},
           Case{403, "InvalidAccessKeyId", absl::StatusCode::kUnauthenticated},
           Case{403, "AccessDenied", absl::StatusCode::kPermissionDenied},
           Case{404, "NoSuchBucket", absl::StatusCode::kNotFound},
           Case{404, "NoSuchUpload", absl::StatusCode::kNotFound},
           Case{400, "EntityTooSmall", absl::StatusCode::kInvalidArgument},
           Case{400, "InvalidPart", absl::StatusCode::kInvalidArgument},
           Case{416, "InvalidRange", absl::StatusCode::kOutOfRange},
           Case{503, "SlowDown", absl::StatusCode::kUnavailable},
           Case{409, "BucketAlreadyOwnedByYou", absl::StatusCode::kAlreadyExists},
           Case{403, "QuotaExceeded", absl::StatusCode::kResourceExhausted},
           Case{507, "InsufficientStorage", absl::StatusCode::kResourceExhausted},
           Case{507, "", absl::StatusCode::kResourceExhausted},
           Case{400, "XAmzContentSHA256Mismatch", absl::StatusCode::kDataLoss},
           Case{400, "BadDigest", absl::StatusCode::kDataLoss},
           // HEAD responses carry no body: the HTTP status decides.
           Case{404, "", absl::StatusCode::kNotFound},
           Case{403, "", absl::StatusCode::kPermissionDenied},
           Case{502, "", absl::StatusCode::kUnavailable},
           Case{400, "SomethingNew", absl::StatusCode::kInvalidArgument},
           Case{302, "", absl::StatusCode::kUnknown},
       }) {
    S3Error error;
    error.http_status = c.http;
    error.code = c.code;
    EXPECT_EQ(S3ErrorToStatus(error, "x").code(), c.expected) << c.code << " " << c.http;
  }
}

TEST(S3XmlTest, GarbageBody) {
  S3Error error = ParseS3Error(500, "<html>oops</html>");
  EXPECT_EQ(error.code, "");
  EXPECT_EQ(S3ErrorToStatus(error, "PUT s3://b/k").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace reshard
