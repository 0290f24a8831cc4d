// The fixture of the "safetensors" input format (see lib/formats/format_fixture.h): one
// model.safetensors written with the output writer's own header encoder.

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lib/core/dtype.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/safetensors/header.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

BuiltFixture BuildSafetensorsFixture(const std::string& dir) {
  using Kind = FixtureDamage::Kind;
  const std::string data =
      FixtureF32Bytes(12, 1.5f) + FixtureBF16Bytes(3, -2.0f) + FixtureI64Bytes(2, 7);
  const std::vector<SafetensorsTensorEntry> entries = {
      {"embed.weight", DType::kF32, {4, 3}, 0, 48},
      {"ln.weight", DType::kBF16, {3}, 48, 54},
      {"steps", DType::kI64, {2}, 54, 70},
  };
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, {});
  EXPECT_TRUE(header.ok()) << header.status();
  if (!header.ok()) return {};
  WriteAll(dir + "/model.safetensors", *header + data);

  const std::string file = "model.safetensors";
  const uint64_t json = 8;  // the header JSON follows its 8-byte length
  const uint64_t data_begin = header->size();
  const uint64_t offsets = header->find("\"data_offsets\":[");
  const uint64_t end_offset = header->find(',', offsets) + 1;  // the first tensor's end
  EXPECT_NE(offsets, std::string::npos) << *header;
  BuiltFixture fixture;
  fixture.input = dir + "/" + file;
  fixture.damages = {
      {"truncated to 0 bytes", file, Kind::kTruncate, 0},
      {"truncated inside the header length", file, Kind::kTruncate, 4},
      {"truncated inside the header JSON", file, Kind::kTruncate, json + (data_begin - json) / 2},
      {"truncated inside tensor data", file, Kind::kTruncate, data_begin + data.size() / 2},
      {"one byte short", file, Kind::kTruncate, data_begin + data.size() - 1},
      {"flipped byte in the header JSON", file, Kind::kFlip, json},
      {"flipped byte in the header length", file, Kind::kFlip, 0},
      {"flipped digit of a tensor's data_offsets", file, Kind::kFlip, end_offset},
      // safetensors keeps no checksum: nothing can notice a changed data byte.
      {"flipped byte in tensor data (no checksum to catch it)", file, Kind::kFlip, data_begin + 5,
       /*in_checksummed_data=*/false, /*undetectable=*/true},
  };
  return fixture;
}

const FormatFixtureRegistration register_fixture("safetensors", BuildSafetensorsFixture);

}  // namespace
}  // namespace reshard
