#include "lib/io/crc32.h"

#include <zlib.h>

#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace reshard {
namespace {

uint32_t Zlib(uint32_t crc, const std::string& data, size_t offset, size_t length) {
  return static_cast<uint32_t>(
      ::crc32_z(crc, reinterpret_cast<const Bytef*>(data.data() + offset), length));
}

TEST(Crc32Test, MatchesZlibForEveryLengthAlignmentAndStart) {
  std::mt19937_64 random(7);
  std::string data(70000, '\0');
  for (char& c : data) c = static_cast<char>(random());
  // Every length around the 16- and 64-byte block sizes, at every alignment.
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t length = 0; length <= 300; ++length) {
      for (uint32_t start : {0u, 0xFFFFFFFFu, 0x12345678u}) {
        ASSERT_EQ(Crc32(start, data.data() + offset, length), Zlib(start, data, offset, length))
            << "offset " << offset << " length " << length << " start " << start;
      }
    }
  }
  for (size_t length : {4096u, 65536u, 65537u, 69983u}) {
    EXPECT_EQ(Crc32(0, data.data() + 3, length), Zlib(0, data, 3, length)) << length;
  }
  // All zeros and all ones (the folding's edge values).
  for (char fill : {'\0', '\xff'}) {
    const std::string same(1000, fill);
    EXPECT_EQ(Crc32(0, same.data(), same.size()), Zlib(0, same, 0, same.size()));
  }
  // Known value: CRC-32 of "123456789".
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
}

TEST(Crc32Test, ContinuesAndCombines) {
  std::mt19937_64 random(9);
  std::string data(5000, '\0');
  for (char& c : data) c = static_cast<char>(random());
  const uint32_t whole = Crc32(0, data.data(), data.size());
  for (size_t split : {0u, 1u, 63u, 64u, 1000u, 4999u, 5000u}) {
    const uint32_t a = Crc32(0, data.data(), split);
    EXPECT_EQ(Crc32(a, data.data() + split, data.size() - split), whole) << split;
    const uint32_t b = Crc32(0, data.data() + split, data.size() - split);
    EXPECT_EQ(Crc32Combine(a, b, data.size() - split), whole) << split;
  }
}

}  // namespace
}  // namespace reshard
