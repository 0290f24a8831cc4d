// The fixture of the "olmo-safetensors" input format (see lib/formats/format_fixture.h): one
// model.safetensors holding a model and optimizer state dict as OLMo's
// state_dict_to_safetensors_file writes it.

#include "lib/formats/olmo/olmo_fixture.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/safetensors/header.h"
#include "lib/formats/safetensors/safetensors_format.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/testing/test_files.h"

namespace reshard {

OlmoFixtureEntry OlmoPickledEntry(std::vector<StructureNode> keys, std::string pickle) {
  OlmoFixtureEntry entry;
  entry.key.keys = std::move(keys);
  entry.key.value_is_pickled = true;
  entry.dtype = DType::kU8;
  entry.shape = {static_cast<int64_t>(pickle.size())};
  entry.bytes = std::move(pickle);
  return entry;
}

std::string OlmoSafetensorsFileOf(const std::vector<OlmoFixtureEntry>& entries) {
  std::vector<SafetensorsTensorEntry> header;
  std::string data;
  for (const OlmoFixtureEntry& entry : entries) {
    absl::StatusOr<std::string> name = EncodeOlmoKey(entry.key);
    EXPECT_TRUE(name.ok()) << name.status();
    if (!name.ok()) return "";
    header.push_back(
        {*name, entry.dtype, entry.shape, data.size(), data.size() + entry.bytes.size()});
    data += entry.bytes;
  }
  absl::StatusOr<std::string> encoded = EncodeSafetensorsHeader(header, {});
  EXPECT_TRUE(encoded.ok()) << encoded.status();
  if (!encoded.ok()) return "";
  return *encoded + data;
}

std::vector<OlmoFixtureEntry> OlmoFixtureEntries() {
  using S = StructureNode;
  const std::vector<FixtureTensor> tensors =
      ThreeFixtureTensors({"model.embed.weight", "model.ln.weight", "optim.state.0.step"});
  const std::vector<std::vector<StructureNode>> paths = {
      {S::String("model"), S::String("embed.weight")},
      {S::String("model"), S::String("ln.weight")},
      {S::String("optim"), S::String("state"), S::Int(0), S::String("step")},
  };
  std::vector<OlmoFixtureEntry> entries;
  for (size_t i = 0; i < tensors.size(); ++i) {
    OlmoFixtureEntry entry;
    entry.key.keys = paths[i];
    entry.dtype = tensors[i].dtype;
    entry.shape = tensors[i].shape;
    entry.bytes = tensors[i].bytes;
    entries.push_back(std::move(entry));
  }
  PickleWriter groups;
  groups.BeginList();
  groups.BeginDict(/*ordered=*/false);
  groups.String("lr");
  groups.Float(0.001);
  groups.String("params");
  groups.BeginList();
  groups.Int(0);
  groups.EndList();
  groups.EndDict();
  groups.EndList();
  entries.push_back(
      OlmoPickledEntry({S::String("optim"), S::String("param_groups")}, groups.Finish()));
  return entries;
}

namespace {

BuiltFixture BuildOlmoFixture(const std::string& dir) {
  using Kind = FixtureDamage::Kind;
  const std::vector<OlmoFixtureEntry> entries = OlmoFixtureEntries();
  const std::string bytes = OlmoSafetensorsFileOf(entries);
  const std::string file = "model.safetensors";
  WriteAll(dir + "/" + file, bytes);
  uint64_t data_size = 0;
  for (const OlmoFixtureEntry& entry : entries) data_size += entry.bytes.size();
  const uint64_t data_begin = bytes.size() - data_size;
  const uint64_t first_key = bytes.find("\"gASV") + 1;
  const uint64_t pickle_begin = bytes.size() - entries.back().bytes.size();
  BuiltFixture fixture;
  fixture.input = dir + "/" + file;
  fixture.expected =
      ThreeFixtureTensors({"model.embed.weight", "model.ln.weight", "optim.state.0.step"});
  fixture.damages = {
      {"truncated to 0 bytes", file, Kind::kTruncate, 0},
      {"truncated inside the header JSON", file, Kind::kTruncate, data_begin / 2},
      {"truncated inside tensor data", file, Kind::kTruncate, data_begin + 7},
      {"truncated inside the pickled value", file, Kind::kTruncate, pickle_begin + 4},
      {"flipped byte in the header length", file, Kind::kFlip, 0},
      // "gASV" -> "fASV": the key no longer decodes to a pickle.
      {"flipped first byte of an encoded key", file, Kind::kFlip, first_key},
      // PROTO 2 -> an opcode the pickle reader refuses.
      {"flipped first byte of the pickled value", file, Kind::kFlip, pickle_begin},
      {"flipped byte in tensor data (no checksum to catch it)", file, Kind::kFlip, data_begin + 5,
       /*in_checksummed_data=*/false, /*undetectable=*/true},
  };
  return fixture;
}

const FormatFixtureRegistration register_fixture("olmo-safetensors", BuildOlmoFixture);

}  // namespace
}  // namespace reshard
