#include "server/tls_handshake_log.h"

#include <fcntl.h>
#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

constexpr char kTsiFile[] = "src/core/tsi/ssl_transport_security.cc";

// Sends stderr to a file for the lifetime of the object.
class CapturedStderr {
 public:
  CapturedStderr() : path_(MakeTempDir("tls_handshake_log") + "/stderr") {
    fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CapturedStderr() {
    fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
  }
  std::vector<std::string> Lines() const {
    fflush(stderr);
    return absl::StrSplit(ReadAll(path_), '\n', absl::SkipEmpty());
  }

 private:
  std::string path_;
  int saved_ = -1;
};

TEST(TlsHandshakeLogTest, FirstFailureAtOnceTheRestInOneSummaryPerInterval) {
  // gRPC logs nothing until grpc_init reads GRPC_VERBOSITY (default ERROR).
  grpc_init();
  CapturedStderr captured;
  std::atomic<int> counted{0};
  {
    TlsHandshakeLog log(absl::Milliseconds(300), [&counted] { ++counted; });
    gpr_log(kTsiFile, 1501, GPR_LOG_SEVERITY_ERROR, "Handshake failed with fatal error A.");
    gpr_log("src/core/lib/surface/server.cc", 7, GPR_LOG_SEVERITY_ERROR, "another gRPC line");
    for (int i = 0; i < 3; ++i) {
      gpr_log(kTsiFile, 1501, GPR_LOG_SEVERITY_ERROR, "Handshake failed with fatal error B.");
    }
    // The summary comes when the interval ends, without a Flush.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (captured.Lines().size() < 3 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    const std::vector<std::string> lines = captured.Lines();
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[0],
              "reshardd: a TLS handshake failed (Handshake failed with fatal error A.); "
              "failures in the next 0.3 s are summarized in one line");
    EXPECT_TRUE(absl::StrContains(lines[1], " server.cc:7]")) << lines[1];
    EXPECT_TRUE(absl::EndsWith(lines[1], " another gRPC line")) << lines[1];
    // How many seconds the summary covers depends on when its thread ran.
    EXPECT_TRUE(absl::StartsWith(lines[2], "reshardd: 3 more TLS handshakes failed in the last "))
        << lines[2];
    EXPECT_TRUE(absl::EndsWith(lines[2], " s (the last: Handshake failed with fatal error B.)"))
        << lines[2];
    EXPECT_EQ(counted.load(), 4);
  }
  // Destroyed: gRPC's default output again, nothing counted.
  gpr_log(kTsiFile, 1501, GPR_LOG_SEVERITY_ERROR, "Handshake failed with fatal error C.");
  const std::vector<std::string> lines = captured.Lines();
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_TRUE(absl::StrContains(lines[3], " ssl_transport_security.cc:1501]")) << lines[3];
  EXPECT_TRUE(absl::EndsWith(lines[3], " Handshake failed with fatal error C.")) << lines[3];
  EXPECT_EQ(counted.load(), 4);
  grpc_shutdown();
}

}  // namespace
}  // namespace reshard
