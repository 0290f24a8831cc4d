// The fixture of the "safetensors" input format (see lib/formats/format_fixture.h): one
// model.safetensors written with the output writer's own header encoder.

#include "lib/formats/safetensors/safetensors_fixture.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/core/dtype.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/safetensors/header.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/testing/test_files.h"

namespace reshard {

std::string SafetensorsFileOf(const std::vector<FixtureTensor>& tensors) {
  std::vector<SafetensorsTensorEntry> entries;
  std::string data;
  for (const FixtureTensor& tensor : tensors) {
    entries.push_back(
        {tensor.name, tensor.dtype, tensor.shape, data.size(), data.size() + tensor.bytes.size()});
    data += tensor.bytes;
  }
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(entries, {});
  EXPECT_TRUE(header.ok()) << header.status();
  if (!header.ok()) return "";
  return *header + data;
}

namespace {

BuiltFixture BuildSafetensorsFixture(const std::string& dir) {
  using Kind = FixtureDamage::Kind;
  const std::vector<FixtureTensor> tensors =
      ThreeFixtureTensors({"embed.weight", "ln.weight", "steps"});
  const std::string bytes = SafetensorsFileOf(tensors);
  WriteAll(dir + "/model.safetensors", bytes);
  uint64_t data_size = 0;
  for (const FixtureTensor& tensor : tensors) data_size += tensor.bytes.size();
  // The 8-byte header length, the header JSON (padded), the data.
  const std::string file = "model.safetensors";
  const uint64_t json = 8;
  const uint64_t data_begin = bytes.size() - data_size;
  const uint64_t offsets = bytes.find("\"data_offsets\":[");
  EXPECT_LT(offsets, data_begin) << bytes;
  const uint64_t end_offset = bytes.find(',', offsets) + 1;  // the first tensor's end
  BuiltFixture fixture;
  fixture.input = dir + "/" + file;
  fixture.expected = tensors;
  fixture.damages = {
      {"truncated to 0 bytes", file, Kind::kTruncate, 0},
      {"truncated inside the header length", file, Kind::kTruncate, 4},
      {"truncated inside the header JSON", file, Kind::kTruncate, json + (data_begin - json) / 2},
      {"truncated inside tensor data", file, Kind::kTruncate, data_begin + data_size / 2},
      {"one byte short", file, Kind::kTruncate, data_begin + data_size - 1},
      {"flipped byte in the header JSON", file, Kind::kFlip, json},
      {"flipped byte in the header length", file, Kind::kFlip, 0},
      {"flipped digit of a tensor's data_offsets", file, Kind::kFlip, end_offset},
      // safetensors keeps no checksum: nothing can notice a changed data byte.
      {"flipped byte in tensor data (no checksum to catch it)", file, Kind::kFlip, data_begin + 5,
       /*in_checksummed_data=*/false, /*undetectable=*/true},
  };
  return fixture;
}

// A Hugging Face sharded folder: embed.weight in model-00001-of-00002.safetensors, ln.weight and
// steps in model-00002-of-00002.safetensors, model.safetensors.index.json mapping them.
BuiltFixture BuildShardedSafetensorsFixture(const std::string& dir) {
  using Kind = FixtureDamage::Kind;
  const std::vector<FixtureTensor> tensors =
      ThreeFixtureTensors({"embed.weight", "ln.weight", "steps"});
  const std::string first = "model-00001-of-00002.safetensors";
  const std::string second = "model-00002-of-00002.safetensors";
  const std::string first_bytes = SafetensorsFileOf({tensors[0]});
  const std::string second_bytes = SafetensorsFileOf({tensors[1], tensors[2]});
  WriteAll(dir + "/" + first, first_bytes);
  WriteAll(dir + "/" + second, second_bytes);
  const uint64_t total =
      tensors[0].bytes.size() + tensors[1].bytes.size() + tensors[2].bytes.size();
  const std::string index = absl::StrCat(
      "{\"metadata\": {\"total_size\": ", total, "}, \"weight_map\": {\"embed.weight\": \"", first,
      "\", \"ln.weight\": \"", second, "\", \"steps\": \"", second, "\"}}");
  WriteAll(dir + "/" + std::string(kSafetensorsIndexName), index);
  const std::string index_name = kSafetensorsIndexName;
  BuiltFixture fixture;
  fixture.input = dir;
  fixture.expected = tensors;
  fixture.damages = {
      {"index truncated halfway", index_name, Kind::kTruncate, index.size() / 2},
      {"flipped byte in the index JSON", index_name, Kind::kFlip, 0},
      {"shard 2 missing", second, Kind::kRemove, 0},
      {"shard 1 truncated inside tensor data", first, Kind::kTruncate,
       first_bytes.size() - tensors[0].bytes.size() / 2},
      {"flipped byte in shard 2's header length", second, Kind::kFlip, 0},
  };
  // "model-00002-of-00002" -> "model-00003-of-00002": a shard that does not exist.
  FixtureDamage renamed{"flipped byte in a shard name in the index", index_name, Kind::kFlip,
                        index.find(second) + 10};
  renamed.names_missing_file = true;
  fixture.damages.push_back(renamed);
  return fixture;
}

const FormatFixtureRegistration register_fixture("safetensors", "single-file",
                                                 BuildSafetensorsFixture);
const FormatFixtureRegistration register_sharded("safetensors", "sharded",
                                                 BuildShardedSafetensorsFixture);

}  // namespace
}  // namespace reshard
