// What S3ObjectWriter decides without a server: the ETag a completed multipart object must
// have, and the objects it refuses to start. Uploads are tested against radosgw in
// s3_client_rgw_test.

#include "lib/io/s3/s3_object_writer.h"

#include <memory>

#include "gtest/gtest.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {
namespace {

// MD5s of "hello" and "world"; the expected values were computed with Python's hashlib
// (md5(bytes.fromhex(a) + bytes.fromhex(b)).hexdigest() + "-2").
constexpr char kHelloMd5[] = "5d41402abc4b2a76b9719d911017c592";
constexpr char kWorldMd5[] = "7d793037a0760186574b0282f2f435e7";

TEST(MultipartETagTest, IsTheMd5OfThePartMd5sAndTheirCount) {
  auto two = MultipartETag({{1, kHelloMd5}, {2, kWorldMd5}});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, "065947336a2f2a95ba8899f3675c3be6-2");
  auto one = MultipartETag({{1, kHelloMd5}});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, "62109206880d38a4010a98e11243924a-1");
}

TEST(MultipartETagTest, TakesQuotedAndUpperCasePartETags) {
  auto quoted = MultipartETag({{1, "\"5D41402ABC4B2A76B9719D911017C592\""}, {2, kWorldMd5}});
  ASSERT_TRUE(quoted.ok()) << quoted.status();
  EXPECT_EQ(*quoted, "065947336a2f2a95ba8899f3675c3be6-2");
}

TEST(MultipartETagTest, OrderMatters) {
  auto swapped = MultipartETag({{1, kWorldMd5}, {2, kHelloMd5}});
  ASSERT_TRUE(swapped.ok());
  EXPECT_NE(*swapped, "065947336a2f2a95ba8899f3675c3be6-2");
}

TEST(MultipartETagTest, RefusesPartETagsThatAreNotMd5s) {
  EXPECT_TRUE(absl::IsFailedPrecondition(MultipartETag({{1, "abc"}}).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      MultipartETag({{1, "zz41402abc4b2a76b9719d911017c592"}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(MultipartETag({}).status()));
}

// A client whose endpoint nobody listens on: the refusals below must come before any request.
std::unique_ptr<S3Client> UnreachableClient() {
  S3Client::Options options;
  options.config.credentials = {"AKID", "secret", "", "test"};
  options.config.endpoint = "http://127.0.0.1:9";
  options.config.path_style = true;
  options.retry.max_attempts = 1;
  auto client = S3Client::Create(std::move(options));
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

TEST(S3ObjectWriterTest, RefusesKeysThatAreNotObjects) {
  std::unique_ptr<S3Client> client = UnreachableClient();
  for (const auto& [bucket, key] : std::vector<std::pair<std::string, std::string>>{
           {"bucket", ""}, {"bucket", "folder/"}, {"", "key"}}) {
    auto writer = S3ObjectWriter::Create(client.get(), bucket, key, {});
    ASSERT_FALSE(writer.ok()) << bucket << "/" << key;
    EXPECT_TRUE(absl::IsInvalidArgument(writer.status())) << writer.status();
    EXPECT_NE(writer.status().message().find("s3://" + bucket + "/" + key), std::string::npos)
        << writer.status();
  }
}

TEST(S3ObjectWriterTest, RefusesPartSizesS3Refuses) {
  std::unique_ptr<S3Client> client = UnreachableClient();
  S3ObjectWriter::Options small;
  small.part_bytes = 1 << 20;
  EXPECT_TRUE(absl::IsInvalidArgument(
      S3ObjectWriter::Create(client.get(), "bucket", "key", small).status()));
  S3ObjectWriter::Options none_in_flight;
  none_in_flight.parts_in_flight = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(
      S3ObjectWriter::Create(client.get(), "bucket", "key", none_in_flight).status()));
}

// A budget that holds the default 8 MiB parts with their 4 in flight keeps them; a tighter one
// gets parts of S3's least size, as many in flight as fit beside the one filling.
TEST(S3ObjectWriterOptionsTest, TightBudgetsGetTheLeastPartSize) {
  constexpr uint64_t kMiB = 1 << 20;
  const S3ObjectWriter::Options roomy = S3ObjectWriter::OptionsFor(20'000'000, 40 * kMiB);
  EXPECT_EQ(roomy.part_bytes, 8 * kMiB);
  EXPECT_EQ(roomy.parts_in_flight, 4);
  const S3ObjectWriter::Options tight = S3ObjectWriter::OptionsFor(20'000'000, 16 * kMiB);
  EXPECT_EQ(tight.part_bytes, S3Client::kMinPartBytes);
  EXPECT_EQ(tight.parts_in_flight, 2);
  // Below the least, the least: one part in flight and one filling.
  const S3ObjectWriter::Options least = S3ObjectWriter::OptionsFor(20'000'000, 1);
  EXPECT_EQ(least.part_bytes, S3Client::kMinPartBytes);
  EXPECT_EQ(least.parts_in_flight, 1);
  EXPECT_EQ(S3ObjectWriter::MemoryBound(least), 2 * S3Client::kMinPartBytes);
}

}  // namespace
}  // namespace reshard
