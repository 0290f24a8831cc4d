#include "lib/io/s3/s3_transfer.h"

#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

size_t Header(TransferState& state, std::string line) {
  return OnTransferHeader(line.data(), 1, line.size(), &state);
}

TEST(OnTransferHeaderTest, LowercasesNamesTrimsValuesAndStartsOverAtAStatusLine) {
  S3Response response;
  TransferState state;
  state.response = &response;
  EXPECT_EQ(Header(state, "HTTP/1.1 100 Continue\r\n"), 23u);
  EXPECT_EQ(Header(state, "X-Early: 1\r\n"), 12u);
  EXPECT_EQ(Header(state, "HTTP/1.1 206 Partial Content\r\n"), 30u);
  EXPECT_EQ(Header(state, "ETag:  \"abc\" \r\n"), 15u);
  EXPECT_EQ(Header(state, "Content-Range: bytes 0-9/100\r\n"), 30u);
  EXPECT_EQ(Header(state, "\r\n"), 2u);
  EXPECT_EQ(response.headers, (std::map<std::string, std::string>{
                                  {"content-range", "bytes 0-9/100"}, {"etag", "\"abc\""}}));
}

TEST(OnTransferHeaderTest, EndsTheTransferPastTheHeaderCap) {
  S3Response response;
  TransferState state;
  state.response = &response;
  const std::string line = "X-Pad: " + std::string(kMaxHeaderBytes - 9, 'p') + "\r\n";
  EXPECT_EQ(Header(state, line), line.size());
  EXPECT_EQ(Header(state, "X-More: 1\r\n"), 0u);
}

TEST(OnTransferProgressTest, AbortsOnlyPastTheGraceBelowTheFloor) {
  TransferState state;
  state.start = absl::Now() - absl::Seconds(10);
  state.grace = absl::Seconds(5);
  state.min_rate = 1000;  // bytes per second: 10 s need 10,000 bytes
  EXPECT_EQ(OnTransferProgress(&state, 0, 20000, 0, 0), 0);
  EXPECT_FALSE(state.too_slow);
  EXPECT_EQ(OnTransferProgress(&state, 0, 5000, 0, 0), 1);
  EXPECT_TRUE(state.too_slow);
  EXPECT_EQ(state.slow_bytes, 5000u);
  EXPECT_GE(state.slow_elapsed, absl::Seconds(10));

  TransferState early;
  early.start = absl::Now();
  early.grace = absl::Seconds(60);
  early.min_rate = 1000;
  EXPECT_EQ(OnTransferProgress(&early, 0, 0, 0, 0), 0);
  TransferState no_floor;
  no_floor.start = absl::Now() - absl::Seconds(100);
  EXPECT_EQ(OnTransferProgress(&no_floor, 0, 0, 0, 0), 0);
}

TEST(KiBPerSecondTest, OneDecimal) { EXPECT_EQ(KiBPerSecond(2048), "2.0 KiB/s"); }

}  // namespace
}  // namespace reshard
