// S3Client against a real Ceph radosgw (started by s3_client_rgw_test.sh, which sets
// S3_TEST_ENDPOINT, S3_TEST_PROXY_ENDPOINT and S3_TEST_PROXY_STATS). The proxy is
// testing/flaky_proxy.py: it answers some requests with 503 SlowDown and drops others.

#include <stdlib.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/s3/s3_client.h"
#include "lib/io/s3/s3_object_writer.h"
#include "lib/testing/test_files.h"
#include "openssl/evp.h"

namespace reshard {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

std::string RequiredEnv(const char* name) {
  const char* value = ::getenv(name);
  if (value == nullptr || *value == '\0') {
    ADD_FAILURE() << name << " is not set: run this test through s3_client_rgw_test.sh";
    return "";
  }
  return value;
}

std::unique_ptr<S3Client> MakeClient(const std::string& endpoint,
                                     const std::string& key = "TESTKEY",
                                     const std::string& secret = "TESTSECRET") {
  S3Client::Options options;
  options.config.endpoint = endpoint;
  options.config.credentials.access_key_id = key;
  options.config.credentials.secret_access_key = secret;
  options.retry.initial_backoff = absl::Milliseconds(20);
  options.retry.max_backoff = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Deterministic, position-dependent bytes, so a misplaced range shows up.
std::string Pattern(size_t size, uint32_t seed) { return TestPattern(size, seed); }

class RgwTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    client_ = MakeClient(RequiredEnv("S3_TEST_ENDPOINT")).release();
    ASSERT_NE(client_, nullptr);
    absl::Status status = client_->CreateBucket(kBucket);
    ASSERT_TRUE(status.ok() || absl::IsAlreadyExists(status)) << status;
  }
  static void TearDownTestSuite() { delete client_; }

  static constexpr char kBucket[] = "reshard-test";
  static S3Client* client_;
};
S3Client* RgwTest::client_ = nullptr;

TEST_F(RgwTest, PutGetRangeHead) {
  const std::string data = Pattern(100000, 1);
  absl::StatusOr<std::string> etag = client_->Put(kBucket, "small/obj.bin", data);
  ASSERT_TRUE(etag.ok()) << etag.status();

  absl::StatusOr<S3ObjectInfo> info = client_->Head(kBucket, "small/obj.bin");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, data.size());
  EXPECT_EQ(info->etag, *etag);

  std::string whole(data.size(), '\0');
  ASSERT_TRUE(client_->GetRange(kBucket, "small/obj.bin", 0, absl::MakeSpan(whole), {}).ok());
  EXPECT_EQ(whole, data);

  std::string middle(1000, '\0');
  ASSERT_TRUE(client_->GetRange(kBucket, "small/obj.bin", 4321, absl::MakeSpan(middle), {}).ok());
  EXPECT_EQ(middle, data.substr(4321, 1000));

  char last = 0;
  ASSERT_TRUE(
      client_->GetRange(kBucket, "small/obj.bin", data.size() - 1, absl::MakeSpan(&last, 1), {})
          .ok());
  EXPECT_EQ(last, data.back());

  // A range that runs past the end, and one that starts past it.
  std::string across(10, '\0');
  absl::Status status =
      client_->GetRange(kBucket, "small/obj.bin", data.size() - 5, absl::MakeSpan(across), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_THAT(status.message(), HasSubstr("s3://reshard-test/small/obj.bin"));
  status =
      client_->GetRange(kBucket, "small/obj.bin", data.size() + 10, absl::MakeSpan(across), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << status;
  EXPECT_THAT(status.message(), HasSubstr("InvalidRange"));
}

TEST_F(RgwTest, MissingKeyAndBucket) {
  char byte;
  absl::Status status = client_->GetRange(kBucket, "no/such/key", 0, absl::MakeSpan(&byte, 1), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("s3://reshard-test/no/such/key"));
  EXPECT_THAT(status.message(), HasSubstr("NoSuchKey"));

  absl::StatusOr<S3ObjectInfo> info = client_->Head(kBucket, "no/such/key");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound) << info.status();
  EXPECT_THAT(info.status().message(), HasSubstr("no/such/key"));

  absl::StatusOr<std::vector<S3ObjectInfo>> list = client_->List("no-such-bucket-x", "");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kNotFound) << list.status();
  EXPECT_THAT(list.status().message(), HasSubstr("NoSuchBucket"));
}

TEST_F(RgwTest, ListWithPrefixAndPagination) {
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(client_->Put(kBucket, absl::StrCat("list/a/", i), absl::StrCat("v", i)).ok());
  }
  ASSERT_TRUE(client_->Put(kBucket, "list/b/other", "x").ok());
  ASSERT_TRUE(client_->Put(kBucket, "list/weird key+&=?.bin", "xyz").ok());

  absl::StatusOr<std::vector<S3ObjectInfo>> page2 = client_->List(kBucket, "list/a/", 2);
  ASSERT_TRUE(page2.ok()) << page2.status();
  ASSERT_EQ(page2->size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ((*page2)[i].key, absl::StrCat("list/a/", i));
    EXPECT_EQ((*page2)[i].size, 2u);
  }
  absl::StatusOr<std::vector<S3ObjectInfo>> all = client_->List(kBucket, "list/");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 9u);
  absl::StatusOr<std::vector<S3ObjectInfo>> weird = client_->List(kBucket, "list/weird key+", 1);
  ASSERT_TRUE(weird.ok()) << weird.status();
  ASSERT_EQ(weird->size(), 1u);
  EXPECT_EQ((*weird)[0].key, "list/weird key+&=?.bin");

  ASSERT_TRUE(client_->Delete(kBucket, "list/b/other").ok());
  ASSERT_TRUE(client_->Delete(kBucket, "list/b/other").ok());  // Missing: still OK.
  absl::StatusOr<std::vector<S3ObjectInfo>> b = client_->List(kBucket, "list/b/");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->empty());
}

// Uploads `data` in 8 MiB parts with `in_flight` threads; returns the parts.
std::vector<S3CompletedPart> UploadParts(S3Client& client, const std::string& key,
                                         const std::string& upload_id, const std::string& data,
                                         int in_flight) {
  constexpr size_t kPart = 8 << 20;
  const int parts = static_cast<int>((data.size() + kPart - 1) / kPart);
  std::vector<S3CompletedPart> completed(parts);
  std::vector<absl::Status> statuses(parts);
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < in_flight; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < parts; i = next++) {
        absl::string_view part = absl::string_view(data).substr(i * kPart, kPart);
        absl::StatusOr<std::string> etag =
            client.UploadPart("reshard-test", key, upload_id, i + 1, part);
        statuses[i] = etag.status();
        if (etag.ok()) completed[i] = S3CompletedPart{i + 1, *etag};
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : statuses) EXPECT_TRUE(status.ok()) << status;
  return completed;
}

TEST_F(RgwTest, MultipartUploadThreeInFlight) {
  const std::string data = Pattern((20 << 20) + 12345, 7);
  const std::string key = "mp/model-00001.safetensors";
  absl::StatusOr<std::string> upload_id =
      client_->CreateMultipartUpload(kBucket, key, {{"reshard-job", "job-1"}});
  ASSERT_TRUE(upload_id.ok()) << upload_id.status();
  std::vector<S3CompletedPart> parts = UploadParts(*client_, key, *upload_id, data, 3);
  ASSERT_EQ(parts.size(), 3u);
  absl::StatusOr<std::string> etag =
      client_->CompleteMultipartUpload(kBucket, key, *upload_id, parts);
  ASSERT_TRUE(etag.ok()) << etag.status();
  EXPECT_THAT(*etag, HasSubstr("-3"));

  absl::StatusOr<S3ObjectInfo> info = client_->Head(kBucket, key);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, data.size());
  // Verify by range reads across part boundaries and at the very end.
  for (uint64_t offset : {uint64_t{0}, uint64_t{(8 << 20) - 100}, uint64_t{(16 << 20) - 7},
                          uint64_t{data.size() - 5000}}) {
    std::string got(5000, '\0');
    ASSERT_TRUE(client_->GetRange(kBucket, key, offset, absl::MakeSpan(got), {}).ok()) << offset;
    EXPECT_EQ(got, data.substr(offset, 5000)) << offset;
  }
  std::string whole(data.size(), '\0');
  ASSERT_TRUE(client_->GetRange(kBucket, key, 0, absl::MakeSpan(whole), {}).ok());
  EXPECT_TRUE(whole == data);
}

TEST_F(RgwTest, MultipartErrorsAbortAndStaleUploads) {
  const std::string key = "stale/out.bin";
  absl::StatusOr<std::string> first = client_->CreateMultipartUpload(kBucket, key);
  absl::StatusOr<std::string> second = client_->CreateMultipartUpload(kBucket, "stale/other.bin");
  ASSERT_TRUE(first.ok() && second.ok());
  absl::StatusOr<std::string> small = client_->UploadPart(kBucket, key, *first, 1, "tiny");
  ASSERT_TRUE(small.ok()) << small.status();
  absl::StatusOr<std::string> small2 = client_->UploadPart(kBucket, key, *first, 2, "tiny");
  ASSERT_TRUE(small2.ok()) << small2.status();

  // Parts under 5 MiB other than the last: EntityTooSmall.
  absl::StatusOr<std::string> too_small =
      client_->CompleteMultipartUpload(kBucket, key, *first, {{1, *small}, {2, *small2}});
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument) << too_small.status();
  EXPECT_THAT(too_small.status().message(), HasSubstr("EntityTooSmall"));
  // An ETag the server never gave out: InvalidPart.
  absl::StatusOr<std::string> invalid =
      client_->CompleteMultipartUpload(kBucket, key, *first, {{1, "\"0000\""}});
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument) << invalid.status();
  EXPECT_THAT(invalid.status().message(), HasSubstr("InvalidPart"));

  absl::StatusOr<std::vector<S3UploadInfo>> stale =
      client_->ListMultipartUploads(kBucket, "stale/");
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_EQ(stale->size(), 2u);
  for (const S3UploadInfo& upload : *stale) {
    EXPECT_FALSE(upload.initiated.empty());
    ASSERT_TRUE(client_->AbortMultipartUpload(kBucket, upload.key, upload.upload_id).ok());
  }
  stale = client_->ListMultipartUploads(kBucket, "stale/");
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty());
  absl::StatusOr<std::vector<S3ObjectInfo>> objects = client_->List(kBucket, "stale/");
  ASSERT_TRUE(objects.ok());
  EXPECT_TRUE(objects->empty());
  // The aborted upload is gone.
  absl::Status status = client_->AbortMultipartUpload(kBucket, key, *first);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("NoSuchUpload"));
}

TEST_F(RgwTest, WrongCredentials) {
  std::unique_ptr<S3Client> bad_secret =
      MakeClient(RequiredEnv("S3_TEST_ENDPOINT"), "TESTKEY", "WRONGSECRET");
  absl::StatusOr<S3ObjectInfo> info = bad_secret->Head(kBucket, "small/obj.bin");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied) << info.status();
  absl::StatusOr<std::string> put = bad_secret->Put(kBucket, "denied", "x");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnauthenticated) << put.status();
  EXPECT_THAT(put.status().message(), HasSubstr("SignatureDoesNotMatch"));
  EXPECT_THAT(put.status().message(), HasSubstr("s3://reshard-test/denied"));
  EXPECT_EQ(bad_secret->stats().retries, 0u);

  std::unique_ptr<S3Client> bad_key = MakeClient(RequiredEnv("S3_TEST_ENDPOINT"), "NOKEY", "x");
  put = bad_key->Put(kBucket, "denied", "x");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnauthenticated) << put.status();
  EXPECT_THAT(put.status().message(), HasSubstr("InvalidAccessKeyId"));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST_F(RgwTest, RetriesThroughFlakyProxy) {
  std::unique_ptr<S3Client> flaky = MakeClient(RequiredEnv("S3_TEST_PROXY_ENDPOINT"));
  ASSERT_NE(flaky, nullptr);
  const std::string data = Pattern(300000, 3);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(flaky->Put(kBucket, absl::StrCat("flaky/", i), data).ok()) << i;
  }
  for (int i = 0; i < 6; ++i) {
    std::string got(1000, '\0');
    absl::Status status =
        flaky->GetRange(kBucket, absl::StrCat("flaky/", i), 1000 * i, absl::MakeSpan(got), {});
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(got, data.substr(1000 * i, 1000));
  }
  absl::StatusOr<std::vector<S3ObjectInfo>> list = flaky->List(kBucket, "flaky/", 2);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 6u);

  const std::string big = Pattern((16 << 20) + 1, 9);
  absl::StatusOr<std::string> upload_id = flaky->CreateMultipartUpload(kBucket, "flaky/mp");
  ASSERT_TRUE(upload_id.ok()) << upload_id.status();
  std::vector<S3CompletedPart> parts = UploadParts(*flaky, "flaky/mp", *upload_id, big, 3);
  absl::StatusOr<std::string> etag =
      flaky->CompleteMultipartUpload(kBucket, "flaky/mp", *upload_id, parts);
  ASSERT_TRUE(etag.ok()) << etag.status();
  std::string tail(100, '\0');
  ASSERT_TRUE(
      flaky->GetRange(kBucket, "flaky/mp", big.size() - 100, absl::MakeSpan(tail), {}).ok());
  EXPECT_EQ(tail, big.substr(big.size() - 100));

  // A missing key is final even through the proxy: NotFound, not retried into Unavailable.
  char byte;
  absl::Status missing = flaky->GetRange(kBucket, "flaky/none", 0, absl::MakeSpan(&byte, 1), {});
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;

  const std::string stats = ReadFile(RequiredEnv("S3_TEST_PROXY_STATS"));
  std::cerr << "proxy: " << stats << "; client: " << flaky->stats().requests << " requests, "
            << flaky->stats().retries << " retries\n";
  EXPECT_THAT(stats, ::testing::ContainsRegex("\"failed_503\": [1-9]"));
  EXPECT_THAT(stats, ::testing::ContainsRegex("\"dropped\": [1-9]"));
  EXPECT_GE(flaky->stats().retries, 5u);
}

// S3ObjectWriter: odd-sized writes become 8 MiB parts, 4 in flight; the object is invisible
// until Close, then equal to what was written.
// The ETags S3 gives the parts `data` is cut into (hex MD5 of each `part_bytes` slice).
std::vector<S3CompletedPart> PartETagsOf(absl::string_view data, size_t part_bytes) {
  std::vector<S3CompletedPart> parts;
  for (size_t at = 0; at < data.size(); at += part_bytes) {
    const absl::string_view part = data.substr(at, part_bytes);
    unsigned char md5[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_Digest(part.data(), part.size(), md5, &size, EVP_md5(), nullptr);
    std::string hex;
    for (unsigned int i = 0; i < size; ++i)
      absl::StrAppend(&hex, absl::Hex(md5[i], absl::kZeroPad2));
    parts.push_back({static_cast<int>(parts.size()) + 1, hex});
  }
  return parts;
}

TEST_F(RgwTest, ObjectWriterStreamsPartsAndCompletesOnClose) {
  const std::string data = Pattern((50 << 20) + 321, 11);
  const std::string key = "writer/model-00001-of-00002.safetensors";
  S3ObjectWriter::Options options;
  options.metadata = {{"reshard-job", "job-7"}};
  absl::StatusOr<std::unique_ptr<S3ObjectWriter>> writer =
      S3ObjectWriter::Create(client_, kBucket, key, options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (size_t at = 0; at < data.size(); at += (1 << 20) + 7) {
    const size_t n = std::min<size_t>((1 << 20) + 7, data.size() - at);
    ASSERT_TRUE((*writer)->Write(absl::string_view(data).substr(at, n)).ok());
  }
  EXPECT_EQ((*writer)->pos(), data.size());
  EXPECT_TRUE(absl::IsNotFound(client_->Head(kBucket, key).status()))
      << "a multipart object must not be visible before it is completed";
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->parts_uploaded(), 7);
  writer->reset();
  absl::StatusOr<S3ObjectInfo> info = client_->Head(kBucket, key);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, data.size());
  EXPECT_THAT(info->etag, HasSubstr("-7"));
  // The ETag the writer expects of its object when a completion answer was lost is the one
  // radosgw gives it.
  absl::StatusOr<std::string> expected = MultipartETag(PartETagsOf(data, options.part_bytes));
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(info->etag, absl::StrCat("\"", *expected, "\"")) << "or unquoted:" << *expected;
  std::string whole(data.size(), '\0');
  ASSERT_TRUE(client_->GetRange(kBucket, key, 0, absl::MakeSpan(whole), {}).ok());
  EXPECT_TRUE(whole == data);
  absl::StatusOr<std::vector<S3UploadInfo>> left =
      client_->ListMultipartUploads(kBucket, "writer/");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty());
}

// A writer given up before Close (an error upstream, a cancelled job) leaves no object and no
// unfinished upload.
TEST_F(RgwTest, ObjectWriterDestroyedUnclosedLeavesNothing) {
  const std::string key = "abandoned/model.safetensors";
  {
    absl::StatusOr<std::unique_ptr<S3ObjectWriter>> writer =
        S3ObjectWriter::Create(client_, kBucket, key, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Write(Pattern((20 << 20) + 5, 12)).ok());
  }
  EXPECT_TRUE(absl::IsNotFound(client_->Head(kBucket, key).status()));
  absl::StatusOr<std::vector<S3UploadInfo>> left =
      client_->ListMultipartUploads(kBucket, "abandoned/");
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_TRUE(left->empty()) << left->size() << " unfinished uploads left";
}

// An upload aborted by someone else (a concurrent rerun's AbortStaleUploads) before Close: Close
// fails, and an older object of the same size under the key is not taken for the new one.
TEST_F(RgwTest, ObjectWriterUploadAbortedFromOutsideFailsClose) {
  const std::string key = "aborted-outside/model.safetensors";
  const std::string older = Pattern((12 << 20) + 9, 21);
  ASSERT_TRUE(client_->Put(kBucket, key, older).ok());
  absl::StatusOr<std::unique_ptr<S3ObjectWriter>> writer =
      S3ObjectWriter::Create(client_, kBucket, key, {});
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(Pattern(older.size(), 22)).ok());
  absl::StatusOr<std::vector<S3UploadInfo>> uploads =
      client_->ListMultipartUploads(kBucket, "aborted-outside/");
  ASSERT_TRUE(uploads.ok()) << uploads.status();
  ASSERT_EQ(uploads->size(), 1u);
  ASSERT_TRUE(client_->AbortMultipartUpload(kBucket, key, (*uploads)[0].upload_id).ok());
  absl::Status closed = (*writer)->Close();
  EXPECT_FALSE(closed.ok()) << "an aborted upload was taken for a completed one";
  EXPECT_THAT(std::string(closed.message()), HasSubstr(key));
  writer->reset();
  std::string now(older.size(), '\0');
  ASSERT_TRUE(client_->GetRange(kBucket, key, 0, absl::MakeSpan(now), {}).ok());
  EXPECT_TRUE(now == older) << "the older object changed";
}

// Empty objects, a missing bucket, options out of range, writes after Close.
TEST_F(RgwTest, ObjectWriterEdgesAndErrors) {
  absl::StatusOr<std::unique_ptr<S3ObjectWriter>> empty =
      S3ObjectWriter::Create(client_, kBucket, "edges/empty.json", {});
  ASSERT_TRUE(empty.ok()) << empty.status();
  ASSERT_TRUE((*empty)->Close().ok());
  absl::StatusOr<S3ObjectInfo> info = client_->Head(kBucket, "edges/empty.json");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, 0u);
  EXPECT_EQ((*empty)->Write("x").code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<std::unique_ptr<S3ObjectWriter>> missing =
      S3ObjectWriter::Create(client_, "no-such-bucket-here", "k", {});
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("s3://no-such-bucket-here/k"));

  S3ObjectWriter::Options small;
  small.part_bytes = 1 << 20;
  EXPECT_EQ(S3ObjectWriter::Create(client_, kBucket, "edges/k", small).status().code(),
            absl::StatusCode::kInvalidArgument);
  S3ObjectWriter::Options many;
  many.parts_in_flight = 0;
  EXPECT_EQ(S3ObjectWriter::Create(client_, kBucket, "edges/k", many).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// What a killed run leaves (uploads started, never completed or aborted) is found by prefix and
// aborted on the rerun; uploads under other prefixes are left alone.
TEST_F(RgwTest, AbortStaleUploadsFindsAKilledRunsUploads) {
  for (const char* key : {"killed/a.safetensors", "killed/sub/b.safetensors"}) {
    absl::StatusOr<std::string> id = client_->CreateMultipartUpload(kBucket, key);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(client_->UploadPart(kBucket, key, *id, 1, Pattern(1000, 3)).ok());
  }
  absl::StatusOr<std::string> other = client_->CreateMultipartUpload(kBucket, "kept/c");
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<int> aborted = AbortStaleUploads(*client_, kBucket, "killed/");
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  EXPECT_EQ(*aborted, 2);
  absl::StatusOr<std::vector<S3UploadInfo>> killed =
      client_->ListMultipartUploads(kBucket, "killed/");
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_TRUE(killed->empty());
  absl::StatusOr<std::vector<S3UploadInfo>> kept = client_->ListMultipartUploads(kBucket, "kept/");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->size(), 1u);
  EXPECT_TRUE(client_->AbortMultipartUpload(kBucket, "kept/c", *other).ok());
}

// Through the proxy that answers 503 or drops connections: every part is retried until it is
// in, and the object is whole.
TEST_F(RgwTest, ObjectWriterRetriesThroughFlakyProxy) {
  std::unique_ptr<S3Client> flaky = MakeClient(RequiredEnv("S3_TEST_PROXY_ENDPOINT"));
  ASSERT_NE(flaky, nullptr);
  const std::string data = Pattern((30 << 20) + 99, 13);
  const std::string key = "flaky-writer/model.safetensors";
  absl::StatusOr<std::unique_ptr<S3ObjectWriter>> writer =
      S3ObjectWriter::Create(flaky.get(), kBucket, key, {});
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Write(data).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  writer->reset();
  std::string whole(data.size(), '\0');
  ASSERT_TRUE(client_->GetRange(kBucket, key, 0, absl::MakeSpan(whole), {}).ok());
  EXPECT_TRUE(whole == data);
  EXPECT_GT(flaky->stats().retries, 0u);
}

}  // namespace
}  // namespace reshard
