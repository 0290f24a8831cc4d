// S3Client and S3ObjectWriter against a store that stops answering: a TCP server on 127.0.0.1
// (port 0) run by the test that reads each request whole and then, by mode, never answers or
// answers half a body and stalls. Every call must end within its request deadline, with
// DEADLINE_EXCEEDED naming the operation, the object, the attempts and the last curl error,
// even though each attempt alone would wait the client's 60 s stall time.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/s3/s3_client.h"
#include "lib/io/s3/s3_object_writer.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kBucket[] = "bucket";
constexpr char kKey[] = "dir/object.bin";
constexpr char kUrl[] = "s3://bucket/dir/object.bin";

// How StallingServer answers a request it has read whole.
enum class Mode {
  // Never answers; the connection stays open.
  kSilent,
  // "200 OK" with a Content-Length of 4096 and 2048 bytes of the body, then nothing.
  kHalfBody,
  // Answers CreateMultipartUpload (POST ?uploads=) with an upload id, then is silent.
  kStartsUploadsOnly,
};

// A TCP server on 127.0.0.1, one thread per connection, stopped (every socket shut down) by
// its destructor or Stop.
class StallingServer {
 public:
  explicit StallingServer(Mode mode) : mode_(mode) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (listen_fd_ < 0 ||
        ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1: " << ::strerror(errno);
      return;
    }
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~StallingServer() { Stop(); }

  // Shuts every connection down: a client still waiting gets a closed connection.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    }
    if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    for (std::thread& thread : handlers_) thread.join();
    absl::MutexLock lock(&mu_);
    for (int fd : connections_) ::close(fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }

  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }

  // Requests read whole so far, as "METHOD /path?query".
  std::vector<std::string> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      pollfd poll_fd{listen_fd_, POLLIN, 0};
      ::poll(&poll_fd, 1, 100);
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      if ((poll_fd.revents & POLLIN) == 0) continue;
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      connections_.push_back(fd);
      handlers_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  // Reads requests (headers, then Content-Length bytes of body) and answers by mode until the
  // connection closes or the server stops.
  void Serve(int fd) {
    std::string pending;
    char chunk[64 << 10];
    while (true) {
      const size_t header_end = pending.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        const std::string head = pending.substr(0, header_end);
        uint64_t body_bytes = 0;
        for (absl::string_view line : absl::StrSplit(head, "\r\n")) {
          if (absl::StartsWithIgnoreCase(line, "content-length:")) {
            absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(15)), &body_bytes);
          }
          if (absl::StartsWithIgnoreCase(line, "expect: 100-continue")) {
            Send(fd, "HTTP/1.1 100 Continue\r\n\r\n");
          }
        }
        if (pending.size() >= header_end + 4 + body_bytes) {
          const std::string request_line = head.substr(0, head.find(' ', head.find(' ') + 1));
          pending.erase(0, header_end + 4 + body_bytes);
          {
            absl::MutexLock lock(&mu_);
            requests_.push_back(request_line);
          }
          Answer(fd, request_line);
          continue;
        }
      }
      const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
      if (n <= 0) return;
      pending.append(chunk, static_cast<size_t>(n));
    }
  }

  void Answer(int fd, const std::string& request_line) {
    switch (mode_) {
      case Mode::kSilent:
        return;
      case Mode::kHalfBody:
        Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n",
                              std::string(2048, ' ')));
        return;
      case Mode::kStartsUploadsOnly:
        if (absl::StartsWith(request_line, "POST ") && absl::EndsWith(request_line, "?uploads=")) {
          const std::string body =
              "<InitiateMultipartUploadResult><UploadId>u-1</UploadId>"
              "</InitiateMultipartUploadResult>";
          Send(fd, absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", body.size(), "\r\n\r\n",
                                body));
        }
        return;
    }
  }

  static void Send(int fd, absl::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  const Mode mode_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> connections_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> handlers_;  // written by the acceptor only, joined after it
  std::vector<std::string> requests_ ABSL_GUARDED_BY(mu_);
};

// The default stall time (60 s of no progress per attempt) and attempts (6); a request
// deadline of `deadline` whatever the body.
std::unique_ptr<S3Client> MakeClient(const StallingServer& server, absl::Duration deadline) {
  S3Client::Options options;
  options.config.endpoint = server.endpoint();
  options.config.credentials.access_key_id = "TESTKEY";
  options.config.credentials.secret_access_key = "TESTSECRET";
  options.request_deadline = deadline;
  // No time for a body's bytes on top of the deadline (the floor of slow links).
  options.min_throughput = 0;
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Runs `call` on a thread and waits for it at most `bound`. A call still running then fails
// the test; the server is stopped so that the call ends and the thread can be joined.
absl::Duration RunBounded(StallingServer& server, absl::Duration bound,
                          const std::function<void()>& call) {
  absl::Notification done;
  const absl::Time start = absl::Now();
  std::thread thread([&] {
    call();
    done.Notify();
  });
  const bool in_time = done.WaitForNotificationWithTimeout(bound);
  const absl::Duration took = absl::Now() - start;
  if (!in_time) ADD_FAILURE() << "the call did not return within " << bound;
  server.Stop();
  thread.join();
  return took;
}

// An UploadPart the server reads whole and never answers.
TEST(S3ClientStallTest, UnansweredUploadPartEndsAtTheRequestDeadline) {
  StallingServer server(Mode::kSilent);
  std::unique_ptr<S3Client> client = MakeClient(server, absl::Seconds(2));
  ASSERT_NE(client, nullptr);
  const std::string part(1 << 20, 'x');
  absl::StatusOr<std::string> etag;
  const absl::Duration took = RunBounded(server, absl::Seconds(20), [&] {
    etag = client->UploadPart(kBucket, kKey, "u-1", 3, part);
  });
  EXPECT_EQ(etag.status().code(), absl::StatusCode::kDeadlineExceeded) << etag.status();
  EXPECT_EQ(etag.status().message(),
            absl::StrCat("UploadPart ", kUrl,
                         " part 3: not done within the request deadline of 2s after 1 attempt "
                         "(last: Timeout was reached (curl 28); 1048576 of 1048576 bytes sent, "
                         "0 bytes received)"));
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(server.requests().size(), 1u);
}

// A CompleteMultipartUpload answered with half its body, then nothing.
TEST(S3ClientStallTest, HalfAnsweredCompletionEndsAtTheRequestDeadline) {
  StallingServer server(Mode::kHalfBody);
  std::unique_ptr<S3Client> client = MakeClient(server, absl::Seconds(2));
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> etag;
  const absl::Duration took = RunBounded(server, absl::Seconds(20), [&] {
    etag = client->CompleteMultipartUpload(kBucket, kKey, "u-1", {{1, "\"e1\""}});
  });
  EXPECT_EQ(etag.status().code(), absl::StatusCode::kDeadlineExceeded) << etag.status();
  EXPECT_EQ(etag.status().message(),
            absl::StrCat("CompleteMultipartUpload ", kUrl,
                         ": not done within the request deadline of 2s after 1 attempt "
                         "(last: Timeout was reached (curl 28); 117 of 117 bytes sent, "
                         "2048 bytes received)"));
  EXPECT_LT(took, absl::Seconds(5));
}

// With a deadline far off, the stall rule ends it: an attempt in which nothing moves for
// stall_timeout (1 s here) is cut, and the second such attempt is the last. libcurl's rate is
// an average over its last 5 s, so an attempt that sent 1 MiB stalls 5 to 7 s after that.
TEST(S3ClientStallTest, SecondStalledAttemptIsTheLast) {
  StallingServer server(Mode::kSilent);
  S3Client::Options options;
  options.config.endpoint = server.endpoint();
  options.config.credentials.access_key_id = "TESTKEY";
  options.config.credentials.secret_access_key = "TESTSECRET";
  options.stall_timeout = absl::Seconds(1);
  options.retry.initial_backoff = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<S3Client>> client = S3Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string part(1 << 20, 'x');
  absl::StatusOr<std::string> etag;
  const absl::Duration took = RunBounded(server, absl::Seconds(30), [&] {
    etag = (*client)->UploadPart(kBucket, kKey, "u-1", 3, part);
  });
  EXPECT_EQ(etag.status().code(), absl::StatusCode::kDeadlineExceeded) << etag.status();
  EXPECT_EQ(etag.status().message(),
            absl::StrCat("after 2 attempts: UploadPart ", kUrl,
                         " part 3: no progress for 1s (1048576 of 1048576 bytes sent, 0 bytes "
                         "received)"));
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_EQ((*client)->stats().requests, 2u);
}

// A multipart upload whose parts are never answered: Close fails naming the part within one
// deadline, and the writer leaves the upload to the rerun's cleanup rather than wait a second
// deadline on an abort the store would not answer either.
TEST(S3ClientStallTest, WriterOfAStalledStoreFailsAndIsDestroyedInBoundedTime) {
  StallingServer server(Mode::kStartsUploadsOnly);
  std::unique_ptr<S3Client> client = MakeClient(server, absl::Seconds(2));
  ASSERT_NE(client, nullptr);
  absl::Status closed;
  const absl::Duration took = RunBounded(server, absl::Seconds(30), [&] {
    S3ObjectWriter::Options options;
    options.part_bytes = S3Client::kMinPartBytes;
    options.parts_in_flight = 2;
    absl::StatusOr<std::unique_ptr<S3ObjectWriter>> writer =
        S3ObjectWriter::Create(client.get(), kBucket, kKey, options);
    if (!writer.ok()) {
      closed = writer.status();
      return;
    }
    closed = (*writer)->Write(std::string(S3Client::kMinPartBytes + 4096, 'y'));
    if (closed.ok()) closed = (*writer)->Close();
  });
  EXPECT_EQ(closed.code(), absl::StatusCode::kDeadlineExceeded) << closed;
  EXPECT_THAT(std::string(closed.message()), StartsWith("uploading part "));
  EXPECT_THAT(std::string(closed.message()),
              HasSubstr(absl::StrCat(" of ", kUrl, ": UploadPart ", kUrl, " part ")));
  EXPECT_THAT(std::string(closed.message()),
              HasSubstr(": not done within the request deadline of 2s after 1 attempt"));
  // Two parts at once: one deadline and a little.
  EXPECT_LT(took, absl::Seconds(4));
  const std::vector<std::string> requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0], "POST /bucket/dir/object.bin?uploads=");
  EXPECT_THAT(requests[1], StartsWith("PUT /bucket/dir/object.bin?partNumber="));
  EXPECT_THAT(requests[2], StartsWith("PUT /bucket/dir/object.bin?partNumber="));
}

}  // namespace
}  // namespace reshard
