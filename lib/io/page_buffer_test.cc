#include "lib/io/page_buffer.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace reshard {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

TEST(PageBufferTest, LargeBuffersAreHugePageAligned) {
  for (size_t size : {kHugePage, kHugePage + 1, size_t{16} << 20, (size_t{16} << 20) + 4096}) {
    PageBuffer buffer(size);
    ASSERT_NE(buffer.data(), nullptr);
    EXPECT_EQ(buffer.size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kHugePage, 0u) << size;
    // Every byte is usable, first to last.
    std::memset(buffer.data(), 0x5a, size);
    EXPECT_EQ(buffer.data()[size - 1], 0x5a);
  }
}

TEST(PageBufferTest, SmallBuffersArePageAligned) {
  PageBuffer buffer(4096 + 17);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % 4096, 0u);
  std::memset(buffer.data(), 1, buffer.size());
}

// The mapping is returned whole at destruction (the daemon runs many jobs): VmSize goes back.
uint64_t VmSizeKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7));
  }
  return 0;
}

TEST(PageBufferTest, MovesAndReturnsItsMapping) {
  const uint64_t before = VmSizeKiB();
  {
    PageBuffer a(size_t{32} << 20);
    char* data = a.data();
    PageBuffer b(std::move(a));
    EXPECT_EQ(b.data(), data);
    EXPECT_EQ(a.data(), nullptr);
    PageBuffer c;
    c = std::move(b);
    EXPECT_EQ(c.data(), data);
    EXPECT_GE(VmSizeKiB(), before + (32 << 10));
  }
  EXPECT_LE(VmSizeKiB(), before + 1024) << "the mapping (and its alignment slack) was unmapped";
}

}  // namespace
}  // namespace reshard
