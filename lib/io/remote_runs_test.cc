// Tests of ReadRemoteRuns: runs of several remote files read with requests in flight at once,
// cut into pieces of 1 to 6 MiB, the bytes landing where they belong, and a failed request
// named by file and offset.

#include "lib/io/remote_runs.h"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/kvstore/memory_driver.h"
#include "lib/io/mapped_file.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

constexpr int kFiles = 4;
constexpr uint64_t kFileBytes = 5 * MappedFile::kRemotePieceBytes;

class RemoteRunsTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    store_ = new kvstore::MemoryDriver("runs");  // registered drivers are never destroyed
    kvstore::RegisterDriver(store_);
  }

  void SetUp() override {
    store_->set_read_delay(absl::ZeroDuration());
    for (int f = 0; f < kFiles; ++f) {
      const std::string url = "runs://b/rank" + std::to_string(f);
      // Files with different contents: a byte from the wrong file shows.
      data_.push_back(TestPattern(kFileBytes, f));
      store_->Put(url, data_.back());
      absl::StatusOr<MappedFile> file = MappedFile::Open(url);
      ASSERT_TRUE(file.ok()) << file.status();
      files_.push_back(*std::move(file));
    }
  }

  // An object of 10000 bytes whose reads fail ("slow down"), opened.
  static absl::StatusOr<MappedFile> Broken(const std::string& url) {
    store_->Put(url, TestPattern(10000));
    absl::StatusOr<MappedFile> file = MappedFile::Open(url);
    store_->Fail(url, absl::UnavailableError("slow down"));
    return file;
  }

  static kvstore::MemoryDriver* store_;
  std::vector<std::string> data_;
  std::vector<MappedFile> files_;
};
kvstore::MemoryDriver* RemoteRunsTest::store_ = nullptr;

// One run of 2.5 MiB + 3 bytes at a different offset of each file (a ZeRO-3 gather's window):
// the requests overlap, 8 at most, each about the 10 MiB over 8 long (two pieces of each run),
// and every byte is right.
TEST_F(RemoteRunsTest, RunsOfSeveralFilesReadInFlightAtOnce) {
  // 40 ms: a loaded CI machine must not make one round look like several.
  store_->set_read_delay(absl::Milliseconds(40));
  const uint64_t length = 5 * MappedFile::kRemotePieceBytes / 2 + 3;
  std::string out(kFiles * length, '\0');
  std::vector<RemoteRun> runs;
  for (int f = 0; f < kFiles; ++f) {
    runs.push_back(RemoteRun{&files_[f], 1000u * f + 7, length,
                             reinterpret_cast<std::byte*>(&out[f * length])});
  }
  const size_t before = store_->ranges().size();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(ReadRemoteRuns(runs).ok());
  const absl::Duration took = absl::Now() - start;
  for (int f = 0; f < kFiles; ++f) {
    EXPECT_EQ(out.substr(f * length, length), data_[f].substr(1000u * f + 7, length)) << f;
  }
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = store_->ranges();
  EXPECT_EQ(ranges.size() - before, kFiles * 2u);
  for (size_t i = before; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i].second, (length + 1) / 2);
  }
  EXPECT_EQ(store_->max_concurrent_reads(), MappedFile::kRemotePiecesInFlight);
  // 8 requests of 40 ms at once: one round, not eight.
  EXPECT_LT(took, absl::Milliseconds(8 * 40 / 2));
}

// Few runs: pieces of kRemotePieceBytes, so that requests still overlap; one request up to
// 1.5 x kMaxRunPieceBytes however few are in flight.
TEST_F(RemoteRunsTest, PiecesBetweenOneAndSixMiB) {
  std::string out(kFileBytes, '\0');
  std::vector<RemoteRun> runs = {
      {&files_[0], 0, 3 * MappedFile::kRemotePieceBytes, reinterpret_cast<std::byte*>(out.data())}};
  size_t before = store_->ranges().size();
  ASSERT_TRUE(ReadRemoteRuns(runs).ok());
  EXPECT_EQ(store_->ranges().size() - before, 3u);
  runs[0].length = kFileBytes;
  before = store_->ranges().size();
  ASSERT_TRUE(ReadRemoteRuns(runs, /*in_flight=*/1).ok());
  EXPECT_EQ(store_->ranges().size() - before, 1u);  // 5 MiB
  EXPECT_EQ(out, data_[0]);
}

TEST_F(RemoteRunsTest, OneRequestAtATimeWhenAskedAndEmptyRunsSkipped) {
  std::string out(300, '\0');
  std::vector<RemoteRun> runs = {
      {&files_[1], 10, 100, reinterpret_cast<std::byte*>(&out[0])},
      {&files_[2], 0, 0, nullptr},
      {&files_[3], 20, 200, reinterpret_cast<std::byte*>(&out[100])},
  };
  const size_t before = store_->ranges().size();
  ASSERT_TRUE(ReadRemoteRuns(runs, /*in_flight=*/1).ok());
  EXPECT_EQ(out.substr(0, 100), data_[1].substr(10, 100));
  EXPECT_EQ(out.substr(100), data_[3].substr(20, 200));
  EXPECT_EQ(store_->ranges().size() - before, 2u);
  EXPECT_TRUE(ReadRemoteRuns({}).ok());
}

TEST_F(RemoteRunsTest, ErrorsNameTheFileAndOffset) {
  absl::StatusOr<MappedFile> broken = Broken("runs://b/broken");
  ASSERT_TRUE(broken.ok()) << broken.status();
  std::string out(200, '\0');
  std::vector<RemoteRun> runs = {
      {&files_[0], 0, 100, reinterpret_cast<std::byte*>(&out[0])},
      {&*broken, 4096, 100, reinterpret_cast<std::byte*>(&out[100])},
  };
  const absl::Status status = ReadRemoteRuns(runs);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("runs://b/broken: reading 100 bytes at byte offset 4096"));
  EXPECT_THAT(status.message(), HasSubstr("slow down"));
  // Past the end of the object: refused without a request.
  std::vector<RemoteRun> past = {{&files_[0], kFileBytes - 10, 11, runs[0].out}};
  const size_t before = store_->ranges().size();
  const absl::Status past_end = ReadRemoteRuns(past);
  EXPECT_TRUE(absl::IsDataLoss(past_end)) << past_end;
  EXPECT_THAT(past_end.message(), HasSubstr("passes the end of the object"));
  EXPECT_EQ(store_->ranges().size(), before);
}

// RemoteRunQueue: batches queued one after the other are read with their requests in flight
// together (4 threads, batches of 2 runs: a batch's requests wait behind none of the batch
// before), each request handed to the batch's callback; Wait(ticket) waits for the requests
// queued before the ticket.
TEST_F(RemoteRunsTest, QueueKeepsRequestsOfSeveralBatchesInFlight) {
  store_->set_read_delay(absl::Milliseconds(200));
  store_->reset_max_concurrent_reads();
  const uint64_t length = 1000;
  std::string out(kFiles * length, '\0');
  std::atomic<int> done{0};
  RemoteRunQueue queue(/*in_flight=*/4);
  for (int batch = 0; batch < 2; ++batch) {
    std::vector<RemoteRun> runs;
    for (int f = 2 * batch; f < 2 * batch + 2; ++f) {
      runs.push_back(
          RemoteRun{&files_[f], 100u * f, length, reinterpret_cast<std::byte*>(&out[f * length])});
    }
    queue.Add(runs, 4, "batch",
              [&done](size_t, uint64_t, uint64_t, const std::byte*) { done.fetch_add(1); });
  }
  EXPECT_EQ(queue.queued(), 4u);
  ASSERT_TRUE(queue.Wait(queue.queued()).ok());
  EXPECT_EQ(done.load(), 4);
  EXPECT_EQ(queue.max_under_way(), 4);
  EXPECT_EQ(store_->max_concurrent_reads(), 4);
  for (int f = 0; f < kFiles; ++f) {
    EXPECT_EQ(out.substr(f * length, length), data_[f].substr(100u * f, length)) << f;
  }
}

// Runs without an output buffer are read into the queue's scratch memory, taken in turns
// around it (1 MiB here for 12 requests of 300 KiB, so places wrap around and wait for the
// requests before them), and converted out of it by the callback; requests are cut at
// multiples of the element size and at most the scratch memory long.
TEST_F(RemoteRunsTest, QueueReadsIntoScratchAroundAndInPieces) {
  const uint64_t scratch = MappedFile::kRemotePieceBytes;
  RemoteRunQueue queue(/*in_flight=*/3, scratch);
  const uint64_t length = 300 << 10;
  std::string out(12 * length, '\0');
  std::vector<std::string> expected;
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<RemoteRun> runs;
    std::vector<uint64_t> places;
    for (int r = 0; r < 4; ++r) {
      const int f = r;
      const uint64_t offset = 4096u * batch + 7u * r;
      runs.push_back(RemoteRun{&files_[f], offset, length, nullptr});
      places.push_back((4u * batch + r) * length);
    }
    // The "conversion": a copy into the run's place.
    queue.Add(runs, 4, "scratch",
              [&out, places](size_t run, uint64_t begin, uint64_t n, const std::byte* data) {
                std::memcpy(&out[places[run] + begin], data, n);
              });
  }
  ASSERT_TRUE(queue.Wait(queue.queued()).ok());
  for (int batch = 0; batch < 3; ++batch) {
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(out.substr((4u * batch + r) * length, length),
                data_[r].substr(4096u * batch + 7u * r, length))
          << batch << " " << r;
    }
  }
  // A run longer than the scratch memory: in pieces of at most that, cut at elements (6 bytes).
  const uint64_t longer = 2 * scratch + 600;
  std::string whole(longer, '\0');
  std::vector<uint64_t> lengths;
  std::vector<RemoteRun> runs = {RemoteRun{&files_[1], 5, longer, nullptr}};
  const size_t before = store_->ranges().size();
  queue.Add(runs, 6, "long", [&](size_t, uint64_t begin, uint64_t n, const std::byte* data) {
    std::memcpy(&whole[begin], data, n);
  });
  ASSERT_TRUE(queue.Wait(queue.queued()).ok());
  EXPECT_EQ(whole, data_[1].substr(5, longer));
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = store_->ranges();
  ASSERT_EQ(ranges.size() - before, 3u);
  for (size_t i = before; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i].second, scratch);
    EXPECT_EQ((ranges[i].first - 5) % 6, 0u);
  }
}

// A failed request is reported by the Waits whose tickets come after it, the first in queue
// order, named by the batch's context, the file, the run's length and byte offset; requests
// queued before it are unaffected.
TEST_F(RemoteRunsTest, QueueErrorsReportedInQueueOrder) {
  absl::StatusOr<MappedFile> broken = Broken("runs://b/queue-broken");
  ASSERT_TRUE(broken.ok()) << broken.status();
  std::string out(300, '\0');
  RemoteRunQueue queue;
  std::vector<RemoteRun> first = {{&files_[0], 0, 100, reinterpret_cast<std::byte*>(&out[0])}};
  queue.Add(first, 1, "tensor \"a\"", nullptr);
  const uint64_t after_first = queue.queued();
  std::vector<RemoteRun> second = {{&*broken, 4096, 100, reinterpret_cast<std::byte*>(&out[100])},
                                   {&files_[1], 0, 100, reinterpret_cast<std::byte*>(&out[200])}};
  queue.Add(second, 1, "tensor \"b\"", nullptr);
  EXPECT_TRUE(queue.Wait(after_first).ok());
  const absl::Status status = queue.Wait(queue.queued());
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(),
              HasSubstr("tensor \"b\": runs://b/queue-broken: reading 100 bytes at byte offset "
                        "4096"));
  EXPECT_THAT(status.message(), HasSubstr("slow down"));
  EXPECT_EQ(out.substr(200), data_[1].substr(0, 100));
}

}  // namespace
}  // namespace reshard
