// DetectInputFormat when a probe cannot look at the input: the error reaches the caller with the
// path (not "in no format reshard reads"), locally and from a remote store answering 503; and
// the probes run without the registry's lock.

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/formats/format.h"
#include "lib/formats/safetensors/safetensors_fixture.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(20);  // bound of every wait in these tests

kvstore::MemoryDriver* Store() { return &kvstore::GetMemoryDriver(); }

// A format asked first (priority 100) that claims folders holding a file "block-here" and, while
// probing one, waits until the test says a second detection has finished.
class BlockingInput : public InputFormat {
 public:
  static absl::Notification& probing() {
    static auto* notification = new absl::Notification;
    return *notification;
  }
  static absl::Notification& other_detection_done() {
    static auto* notification = new absl::Notification;
    return *notification;
  }

  absl::string_view id() const override { return "blocking-test"; }
  int probe_priority() const override { return 100; }
  absl::StatusOr<bool> Probe(const std::string& path) const override {
    if (::access(absl::StrCat(path, "/block-here").c_str(), F_OK) != 0) return false;
    probing().Notify();
    return other_detection_done().WaitForNotificationWithTimeout(kWait);
  }
  absl::StatusOr<InputModel> Read(const std::string&, const ReadOptions&) const override {
    return absl::UnimplementedError("blocking-test reads nothing");
  }
};

const InputFormatRegistration<BlockingInput> register_blocking;

TEST(FormatDetectionTest, SymlinkLoopInTheFolderIsAnErrorNamingIt) {
  // A symlink loop cannot be read by root either (unlike a file with mode 000).
  const std::string dir = MakeTempDir("detect_loop");
  const std::string latest = dir + "/latest";
  ASSERT_EQ(::symlink("latest", latest.c_str()), 0);
  absl::StatusOr<const InputFormat*> detected = DetectInputFormat(dir);
  EXPECT_EQ(detected.status().code(), absl::StatusCode::kFailedPrecondition) << detected.status();
  EXPECT_THAT(detected.status().message(),
              HasSubstr(absl::StrCat("stat ", latest, ": Too many levels of symbolic links")));
  EXPECT_THAT(detected.status().message(),
              HasSubstr(absl::StrCat("detecting the format of ", dir)));
}

TEST(FormatDetectionTest, DanglingSymlinkIsNothing) {
  // A symlink to nothing is no file: the folder is a safetensors folder as without it.
  const std::string dir = MakeTempDir("detect_dangling");
  WriteAll(dir + "/model.safetensors",
           SafetensorsFileOf({{"w", DType::kF32, {2}, std::string(8, '\0')}}));
  ASSERT_EQ(::symlink("nowhere", (dir + "/latest").c_str()), 0);
  absl::StatusOr<const InputFormat*> detected = DetectInputFormat(dir);
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_EQ((*detected)->id(), "safetensors");
}

TEST(FormatDetectionTest, RemoteLookupAnswering503IsAnErrorNamingThePath) {
  const std::string url = "mem://b/lookup503";
  Store()->Put(url + "/model.safetensors", "unused");
  Store()->FailLookups(url + "/latest",
                       absl::UnavailableError(absl::StrCat(url, "/latest: HTTP 503 SlowDown")));
  absl::StatusOr<const InputFormat*> detected = DetectInputFormat(url);
  EXPECT_EQ(detected.status().code(), absl::StatusCode::kUnavailable) << detected.status();
  EXPECT_THAT(detected.status().message(), HasSubstr(url + "/latest: HTTP 503 SlowDown"));
  EXPECT_THAT(detected.status().message(),
              HasSubstr(absl::StrCat("detecting the format of ", url)));
}

TEST(FormatDetectionTest, ProbesRunWithoutTheRegistryLock) {
  const std::string blocked = MakeTempDir("detect_blocked");
  WriteAll(blocked + "/block-here", "");
  const std::string other = MakeTempDir("detect_other") + "/model.safetensors";
  WriteAll(other, SafetensorsFileOf({{"w", DType::kF32, {2}, std::string(8, '\0')}}));

  absl::StatusOr<const InputFormat*> first = absl::UnknownError("not run");
  std::thread prober([&] { first = DetectInputFormat(blocked); });
  ASSERT_TRUE(BlockingInput::probing().WaitForNotificationWithTimeout(kWait));
  // The first detection is inside a probe: a second one must not wait for it.
  absl::StatusOr<const InputFormat*> second = DetectInputFormat(other);
  BlockingInput::other_detection_done().Notify();
  prober.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->id(), "safetensors");
  // The probe saw the second detection finish before its bounded wait ran out.
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->id(), "blocking-test");
}

}  // namespace
}  // namespace reshard
