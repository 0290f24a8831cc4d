// Pickle bombs: small pickles whose opcodes would make the VM allocate far more than their size
// (one EMPTY_LIST byte is a ~230-byte value). Each is run with a byte cap of 32 MiB and must be
// refused with ResourceExhausted naming the opcode and its byte offset, while the process grows
// by less than 64 MiB (peak RSS from /proc/self/status, reset before each parse).

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/torch/pickle.h"

namespace reshard {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kCap = 32 * kMiB;
constexpr uint64_t kGrowthBound = 64 * kMiB;
constexpr uint64_t kBombBytes = 16 * kMiB;

const std::string kProto2("\x80\x02", 2);

std::string U32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}

// A field of /proc/self/status in bytes ("VmHWM", "VmRSS").
uint64_t StatusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, field + ":")) {
      uint64_t kib = 0;
      std::string number = line.substr(field.size() + 1);
      number.erase(number.find("kB"));
      EXPECT_TRUE(absl::SimpleAtoi(number, &kib)) << line;
      return kib * 1024;
    }
  }
  ADD_FAILURE() << "no " << field << " in /proc/self/status";
  return 0;
}

// Makes VmHWM restart from the current RSS.
void ResetPeakRss() {
  const int fd = ::open("/proc/self/clear_refs", O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "5", 1), 1);
  ::close(fd);
}

struct Bounded {
  absl::Status status;
  uint64_t growth = 0;  // peak RSS during the parse over RSS before it
};

// Parses `data` with max_bytes `cap` and measures how far the process grew meanwhile.
Bounded ParseMeasured(const std::string& data, uint64_t cap = kCap) {
  PickleLimits limits;
  limits.max_bytes = cap;
  ResetPeakRss();
  const uint64_t before = StatusBytes("VmRSS");
  Bounded out;
  {
    PickleArena arena;
    out.status = ParsePickle(data, arena, /*persistent_load=*/{}, limits).status();
  }
  out.growth = StatusBytes("VmHWM") - before;
  return out;
}

// `data` refused with ResourceExhausted at `opcode` (its name and value) at a byte offset
// within the pickle, naming `cap_text`, within the memory bound.
void ExpectRefused(const Bounded& parsed, const std::string& opcode, const std::string& cap_text,
                   uint64_t size) {
  EXPECT_EQ(parsed.status.code(), absl::StatusCode::kResourceExhausted) << parsed.status;
  const std::string message(parsed.status.message());
  const std::string prefix = absl::StrCat("pickle: ", opcode, " at byte offset ");
  ASSERT_TRUE(absl::StartsWith(message, prefix)) << message;
  const std::string rest = message.substr(prefix.size());
  uint64_t offset = 0;
  ASSERT_TRUE(absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &offset)) << message;
  EXPECT_GE(offset, 2u) << message;
  EXPECT_LT(offset, size) << message;
  EXPECT_NE(message.find(cap_text), std::string::npos) << message;
  EXPECT_LT(parsed.growth, kGrowthBound) << "grew by " << parsed.growth << " bytes: " << message;
}

TEST(PickleBombTest, EmptyContainers) {
  for (const auto& [op, name] : {std::pair<char, std::string>{']', "EMPTY_LIST (0x5d)"},
                                 {'}', "EMPTY_DICT (0x7d)"},
                                 {')', "EMPTY_TUPLE (0x29)"}}) {
    const std::string bomb = kProto2 + std::string(kBombBytes, op) + ".";
    ExpectRefused(ParseMeasured(bomb), name, "the cap of 32 MiB on values built", bomb.size());
  }
}

TEST(PickleBombTest, MarkTuplePushes) {
  std::string bomb = kProto2;
  for (uint64_t i = 0; i < kBombBytes / 2; ++i) bomb += "(t";
  bomb += ".";
  ExpectRefused(ParseMeasured(bomb), "TUPLE (0x74)", "the cap of 32 MiB on values built",
                bomb.size());
}

TEST(PickleBombTest, MemoGrowth) {
  // MEMOIZE of the same value: a new index each time.
  const std::string memoize = kProto2 + "N" + std::string(kBombBytes, '\x94') + ".";
  ExpectRefused(ParseMeasured(memoize), "MEMOIZE (0x94)", "the cap of 32 MiB on values built",
                memoize.size());
  // LONG_BINPUT of distinct indexes.
  std::string put = kProto2 + "N";
  for (uint32_t i = 0; i < kBombBytes / 5; ++i) put += "r" + U32(i * 7u);
  put += ".";
  ExpectRefused(ParseMeasured(put), "LONG_BINPUT (0x72)", "the cap of 32 MiB on values built",
                put.size());
}

TEST(PickleBombTest, LongStrings) {
  // A length claimed beyond the input is malformed: DataLoss, nothing allocated.
  const std::string claimed = kProto2 + "X" + U32(0xFFFFFFF0u) + "abc.";
  const Bounded c = ParseMeasured(claimed);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kDataLoss) << c.status;
  EXPECT_EQ(c.status.message(),
            "pickle: opcode 0x58 at byte offset 2: needs 4294967280 more bytes but only 4 remain");
  EXPECT_LT(c.growth, 8 * kMiB);
  // A real string beyond the cap is refused before it is copied.
  const std::string big = kProto2 + "B" + U32(40 * kMiB) + std::string(40 * kMiB, 'x') + ".";
  const Bounded b = ParseMeasured(big);
  EXPECT_EQ(b.status.code(), absl::StatusCode::kResourceExhausted) << b.status;
  EXPECT_EQ(b.status.message(),
            "pickle: BINBYTES (0x42) at byte offset 2 would exceed the cap of 32 MiB on values "
            "built (0 bytes built so far)");
  EXPECT_LT(b.growth, 8 * kMiB);
  // One just under the cap parses.
  const std::string fits = kProto2 + "X" + U32(30 * kMiB) + std::string(30 * kMiB, 'y') + ".";
  const Bounded f = ParseMeasured(fits);
  EXPECT_TRUE(f.status.ok()) << f.status;
  EXPECT_LT(f.growth, kGrowthBound);
}

TEST(PickleBombTest, NestingIsCheckedOnPush) {
  // MARKs are counted as they are pushed, before anything is built on them.
  const std::string marks = kProto2 + std::string(kBombBytes, '(') + ".";
  const Bounded m = ParseMeasured(marks);
  EXPECT_EQ(m.status.code(), absl::StatusCode::kResourceExhausted) << m.status;
  EXPECT_EQ(m.status.message(),
            "pickle: MARK (0x28) at byte offset 2050 would open more than 2048 MARKs");
  EXPECT_LT(m.growth, 8 * kMiB);
  // Lists pushed in a row are bounded by the bytes they take; appending them into each other
  // is refused at the first append past the depth cap.
  std::string lists = kProto2 + std::string(2000, ']') + std::string(1999, 'a') + ".";
  const Bounded l = ParseMeasured(lists);
  EXPECT_EQ(l.status.code(), absl::StatusCode::kResourceExhausted) << l.status;
  EXPECT_EQ(l.status.message(),
            "pickle: APPEND (0x61) at byte offset 2513 would nest values deeper than 512 levels");
}

TEST(PickleAllowanceTest, ArenasShareAndReturnTheAllowance) {
  auto allowance = std::make_shared<MetadataAllowance>(4 * kMiB);
  ScopedMetadataAllowance scoped(allowance);
  const std::string strings = kProto2 + "X" + U32(3 * kMiB) + std::string(3 * kMiB, 'a') + ".";
  auto first = std::make_unique<PickleArena>();
  ASSERT_TRUE(ParsePickle(strings, *first, {}).ok());
  EXPECT_GT(allowance->used(), 3 * kMiB);
  // The first arena still holds its 3 MiB: a second parse of the same does not fit.
  {
    PickleArena second;
    const absl::Status refused = ParsePickle(strings, second, {}).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    EXPECT_TRUE(absl::StartsWith(refused.message(),
                                 "pickle: BINUNICODE (0x58) at byte offset 2 would exceed the "
                                 "metadata allowance of 4 MiB ("))
        << refused;
  }
  first.reset();
  EXPECT_EQ(allowance->used(), 0u);
  PickleArena third;
  EXPECT_TRUE(ParsePickle(strings, third, {}).ok());
}

}  // namespace
}  // namespace reshard
