// S3Client::GetRange against testing/lying_s3.py, a fake S3 server on 127.0.0.1 started here
// for each test in one of its modes: answers that name another range, a Content-Length that
// disagrees with the body, a 200 to a range request, an object replaced mid-read (with and
// without If-Match support), a body that drips in, and no answer at all. Each must fail with
// one exact code and a message naming the object and the range, in bounded time.

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/s3/s3_client.h"
#include "lib/testing/test_files.h"
#include "openssl/evp.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

constexpr char kBucket[] = "bucket";
constexpr char kKey[] = "dir/object.bin";
constexpr char kUrl[] = "s3://bucket/dir/object.bin";
constexpr size_t kObjectBytes = 1 << 20;

std::string QuotedMd5(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_md5(), nullptr);
  std::string hex = "\"";
  for (unsigned int i = 0; i < length; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex + "\"";
}

std::string ServerScript() {
  const char* srcdir = ::getenv("TEST_SRCDIR");
  const char* workspace = ::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/",
                      workspace != nullptr ? workspace : "reshard",
                      "/lib/io/s3/testing/lying_s3.py");
}

// lying_s3.py in `mode`, serving kObjectBytes of TestPattern as s3://bucket/dir/object.bin.
class LyingServer {
 public:
  explicit LyingServer(const std::string& mode) : dir_(MakeTempDir(mode)) {
    data_ = TestPattern(kObjectBytes, 7);
    const std::string bucket = absl::StrCat(dir_, "/", kBucket);
    EXPECT_EQ(::system(absl::StrCat("mkdir -p ", bucket, "/dir").c_str()), 0);
    WriteAll(absl::StrCat(bucket, "/", kKey), data_);
    const std::string port_file = absl::StrCat(dir_, "/port");
    const std::string script = ServerScript();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/usr/bin/python3", "python3", script.c_str(), dir_.c_str(), port_file.c_str(),
              mode.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // The port file appears (atomically) once the server listens.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      std::ifstream in(port_file);
      if (in >> port_) return;
      int wstatus = 0;
      if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "lying_s3.py " << mode << " did not start (" << script << ")";
  }
  ~LyingServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  const std::string& data() const { return data_; }
  // What HEAD says: every check of GetRange is on.
  S3ObjectVersion opened() const { return S3ObjectVersion{QuotedMd5(data_), data_.size()}; }
  // The ETag of the replaced object (every byte + 1).
  std::string replaced_etag() const {
    std::string next = data_;
    for (char& c : next) c = static_cast<char>(static_cast<unsigned char>(c) + 1);
    return QuotedMd5(next);
  }

 private:
  std::string dir_;
  std::string data_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// A client with short waits: 3 attempts, a 64 KiB/s floor after 2 s, a 20 s read deadline.
std::unique_ptr<S3Client> MakeClient(const LyingServer& server,
                                     absl::Duration read_deadline = absl::Seconds(20)) {
  S3Client::Options options;
  options.config.endpoint = server.endpoint();
  options.config.credentials.access_key_id = "TESTKEY";
  options.config.credentials.secret_access_key = "TESTSECRET";
  options.retry.max_attempts = 3;
  options.retry.initial_backoff = absl::Milliseconds(10);
  options.retry.max_backoff = absl::Milliseconds(50);
  options.min_throughput = 64 << 10;
  options.throughput_grace = absl::Seconds(2);
  options.read_deadline = read_deadline;
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// One GetRange of `length` bytes at byte 4096 from a server started in `mode`, with every
// check of GetRange on (the version of server.opened()).
struct RangeRead {
  absl::Status status;
  std::string bytes;
  uint64_t requests = 0;
  absl::Duration took;
  std::string expected_bytes;
  std::string etag_at_open;
  std::string replaced_etag;
};

RangeRead ReadFrom(const std::string& mode, size_t length,
                   absl::Duration read_deadline = absl::Seconds(20)) {
  LyingServer server(mode);
  std::unique_ptr<S3Client> client = MakeClient(server, read_deadline);
  RangeRead read;
  if (client == nullptr) return read;
  read.bytes.resize(length);
  const absl::Time start = absl::Now();
  read.status = client->GetRange(kBucket, kKey, 4096, absl::MakeSpan(read.bytes), server.opened());
  read.took = absl::Now() - start;
  read.requests = client->stats().requests;
  read.expected_bytes = server.data().substr(4096, length);
  read.etag_at_open = server.opened().etag;
  read.replaced_etag = server.replaced_etag();
  return read;
}

TEST(S3ClientLiesTest, HonestServerReadsTheRangeAsked) {
  RangeRead read = ReadFrom("honest", 4096);
  ASSERT_TRUE(read.status.ok()) << read.status;
  EXPECT_EQ(read.bytes, read.expected_bytes);
  // A range that runs past the end is the caller's error.
  read = ReadFrom("honest", kObjectBytes);
  EXPECT_EQ(read.status.code(), absl::StatusCode::kOutOfRange) << read.status;
}

// Answers that would misplace bytes: DATA_LOSS naming the range and what the server said, after
// one request (a lie is not retried).
TEST(S3ClientLiesTest, LyingAnswersAreDataLoss) {
  const std::pair<const char*, const char*> cases[] = {
      {"other-range",
       "server answered with another range (bytes 4095-8190/1048576) at offset "
       "4096"},
      {"short-length",
       "body of 4095 bytes (Content-Length 4095) but Content-Range bytes 4096-8191/1048576"},
      {"full-200",
       "server ignored the range (HTTP 200, Content-Length 1048576) and sent more "
       "than the 4096 bytes asked for"},
  };
  for (const auto& [mode, said] : cases) {
    SCOPED_TRACE(mode);
    const RangeRead read = ReadFrom(mode, 4096);
    EXPECT_EQ(read.status.code(), absl::StatusCode::kDataLoss) << read.status;
    EXPECT_EQ(read.status.message(), absl::StrCat("GET ", kUrl, " bytes=4096-8191: ", said));
    EXPECT_EQ(read.requests, 1u);
  }
}

// "replaced": a 412 answers If-Match, and the new ETag comes from a HEAD after it.
// "replaced-no-if-match": the answer's ETag is the new one.
TEST(S3ClientLiesTest, ObjectReplacedMidReadIsFailedPrecondition) {
  for (const char* mode : {"replaced", "replaced-no-if-match"}) {
    SCOPED_TRACE(mode);
    const RangeRead read = ReadFrom(mode, 4096);
    EXPECT_EQ(read.status.code(), absl::StatusCode::kFailedPrecondition) << read.status;
    EXPECT_EQ(
        read.status.message(),
        absl::StrCat(kUrl, " changed while being read: ETag ", read.etag_at_open, " at open, ",
                     read.replaced_etag, " at offset 4096 (GET ", kUrl, " bytes=4096-8191)"));
  }
}

// A drip of 1 KB/s, and a server that never answers, each fail the 64 KiB/s floor in every
// attempt: DEADLINE_EXCEEDED after 3 requests of 2 to 3 s (libcurl checks an idle transfer
// about once a second), naming the range and the rate.
TEST(S3ClientLiesTest, SlowServersFailBelowTheThroughputFloor) {
  for (const auto& [mode, length, range] :
       {std::make_tuple("drip", kObjectBytes / 2, "bytes=4096-528383"),
        std::make_tuple("silent", size_t{4096}, "bytes=4096-8191")}) {
    SCOPED_TRACE(mode);
    const RangeRead read = ReadFrom(mode, length);
    EXPECT_EQ(read.status.code(), absl::StatusCode::kDeadlineExceeded) << read.status;
    const std::string message(read.status.message());
    EXPECT_THAT(message, testing::StartsWith(absl::StrCat("after 3 attempts: GET ", kUrl, " ",
                                                          range, ": received ")));
    EXPECT_THAT(message, testing::EndsWith(" KiB/s, below the 64.0 KiB/s minimum)"));
    if (absl::string_view(mode) == "silent") {
      EXPECT_THAT(message, HasSubstr(": received 0 bytes in "));
    }
    EXPECT_EQ(read.requests, 3u);
    EXPECT_LT(read.took, absl::Seconds(10));
  }
}

TEST(S3ClientLiesTest, ReadDeadlineEndsTheRetries) {
  const RangeRead read = ReadFrom("drip", kObjectBytes / 2, /*read_deadline=*/absl::Seconds(3));
  EXPECT_EQ(read.status.code(), absl::StatusCode::kDeadlineExceeded) << read.status;
  // The second attempt is cut at the deadline, 1 s in: no third.
  EXPECT_THAT(std::string(read.status.message()),
              testing::StartsWith(absl::StrCat(
                  "GET ", kUrl,
                  " bytes=4096-528383: not done within the read deadline of 3s after 2 attempts "
                  "(last: Timeout was reached (curl 28); ")));
  EXPECT_THAT(std::string(read.status.message()), testing::EndsWith(" bytes received)"));
  EXPECT_EQ(read.requests, 2u);
  EXPECT_LT(read.took, absl::Seconds(5));
}

}  // namespace
}  // namespace reshard
