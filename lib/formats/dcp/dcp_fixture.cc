#include "lib/formats/dcp/dcp_fixture.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/formats/format_fixture.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace dcp_testing {

std::string Str(const std::string& s) {
  std::string out = "X";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((s.size() >> (8 * i)) & 0xFF));
  return out + s;
}
std::string Int(int64_t v) {
  std::string out = "J";
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}
std::string None() { return "N"; }
std::string Global(const std::string& module, const std::string& name) {
  return Str(module) + Str(name) + "\x93";
}
std::string Tuple(const std::vector<std::string>& items) {
  std::string out = "(";
  for (const std::string& item : items) out += item;
  return out + "t";
}
std::string List(const std::vector<std::string>& items) {
  std::string out = "](";
  for (const std::string& item : items) out += item;
  return out + "e";
}
std::string Dict(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out = "}(";
  for (const auto& [key, value] : entries) out += key + value;
  return out + "u";
}
std::string Size(const std::vector<int64_t>& dims) {
  std::vector<std::string> items;
  for (int64_t d : dims) items.push_back(Int(d));
  return Global("torch", "Size") + Tuple(items) + "\x85R";
}
// A dataclass instance: cls.__new__(cls) then BUILD with `state` (omitted when empty).
std::string Object(const std::string& module, const std::string& name, const std::string& state) {
  return Global(module, name) + ")\x81" + (state.empty() ? "" : state + "b");
}
std::string Pickle(const std::string& value) { return std::string("\x80\x04", 2) + value + "."; }

// TensorProperties as torch pickles it: the 5-tuple state of __getstate__.
std::string Properties(const std::string& dtype, const std::string& module) {
  const std::string encoding = module == kOldTp ? "MEM_FORMAT_ENCODING" : "_MEM_FORMAT_ENCODING";
  return Object(
      module, "TensorProperties",
      Tuple({Global("torch", dtype),
             Global("torch.serialization", "_get_layout") + Tuple({Str("torch.strided")}) + "R",
             "\x89", Global(module, encoding) + Tuple({Int(0)}) + "R", "\x89"}));
}
std::string Chunk(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
  return Object(kMd, "ChunkStorageMetadata",
                Dict({{Str("offsets"), Size(offsets)}, {Str("sizes"), Size(sizes)}}));
}
std::string TensorMd(const std::string& properties, const std::vector<int64_t>& size,
                     const std::vector<std::string>& chunks) {
  return Object(kMd, "TensorStorageMetadata",
                Dict({{Str("properties"), properties},
                      {Str("size"), Size(size)},
                      {Str("chunks"), List(chunks)}}));
}
std::string Index(const std::string& fqn, const std::vector<int64_t>* offsets, int64_t index) {
  std::vector<std::pair<std::string, std::string>> state = {{Str("fqn"), Str(fqn)}};
  if (offsets != nullptr) state.push_back({Str("offset"), Size(*offsets)});
  state.push_back({Str("index"), index < 0 ? None() : Int(index)});
  return Object(kMd, "MetadataIndex", Dict(state));
}
std::string Info(const std::string& file, int64_t offset, int64_t length,
                 const std::string& transforms) {
  std::vector<std::pair<std::string, std::string>> state = {{Str("relative_path"), Str(file)},
                                                            {Str("offset"), Int(offset)},
                                                            {Str("length"), Int(length)}};
  if (!transforms.empty()) state.push_back({Str("transform_descriptors"), transforms});
  return Object("torch.distributed.checkpoint.filesystem", "_StorageInfo", Dict(state));
}
std::string Metadata(const std::string& sdm, const std::string& storage,
                     const std::string& planner) {
  return Pickle(Object(kMd, "Metadata",
                       Dict({{Str("state_dict_metadata"), sdm},
                             {Str("planner_data"), planner},
                             {Str("storage_data"), storage}})));
}

TorchSaveFile TensorItem(const std::string& storage_class, int64_t numel,
                         const std::vector<int64_t>& shape, const std::string& bytes,
                         std::vector<int64_t> strides) {
  if (strides.empty()) {
    strides.assign(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
      strides[i] = strides[i + 1] * shape[i + 1];
    }
  }
  PickleWriter p;
  p.Tensor(storage_class, "0", numel, shape, strides);
  return BuildTorchSave(p.Finish(), {{"0", bytes}});
}

}  // namespace dcp_testing

namespace {

using namespace dcp_testing;  // NOLINT: the pickle fragments

// F32 [4, 3] `row_major` bytes in column-major order (the storage of `t.t().contiguous().t()`).
std::string ColumnMajorF32(const std::string& row_major) {
  std::string bytes;
  for (int c = 0; c < 3; ++c) {
    for (int r = 0; r < 4; ++r) bytes += row_major.substr((r * 3 + c) * 4, 4);
  }
  return bytes;
}

// "torch-dcp": a folder with .metadata, __0_0.distcp (embed.weight F32 [4, 3], ln.weight BF16
// [3]) and __1_0.distcp (steps I64 [2]), each tensor one whole chunk. With `column_major`,
// embed.weight's chunk is saved transposed (strides (1, 4)): its elements are strided in the
// file (read from remote storage through a local copy, TensorFiller::kStagedMemoryBytes).
BuiltFixture BuildDcpFixture(const std::string& dir, bool column_major) {
  using Kind = FixtureDamage::Kind;
  const std::string embed_values = FixtureF32Bytes(12, 1.5f);
  const TorchSaveFile embed =
      column_major ? TensorItem("FloatStorage", 12, {4, 3}, ColumnMajorF32(embed_values), {1, 4})
                   : TensorItem("FloatStorage", 12, {4, 3}, embed_values);
  const TorchSaveFile ln = TensorItem("BFloat16Storage", 3, {3}, FixtureBF16Bytes(3, -2.0f));
  const TorchSaveFile steps = TensorItem("LongStorage", 2, {2}, FixtureI64Bytes(2, 7));
  const std::string rank0 = embed.bytes + ln.bytes;
  WriteAll(dir + "/__0_0.distcp", rank0);
  WriteAll(dir + "/__1_0.distcp", steps.bytes);

  const std::vector<int64_t> zero1 = {0};
  const std::vector<int64_t> zero2 = {0, 0};
  const std::string sdm = Dict({
      {Str("embed.weight"), TensorMd(Properties("float32"), {4, 3}, {Chunk({0, 0}, {4, 3})})},
      {Str("ln.weight"), TensorMd(Properties("bfloat16"), {3}, {Chunk({0}, {3})})},
      {Str("steps"), TensorMd(Properties("int64"), {2}, {Chunk({0}, {2})})},
  });
  const int64_t embed_size = static_cast<int64_t>(embed.bytes.size());
  const std::string storage = Dict({
      {Index("embed.weight", &zero2, 0), Info("__0_0.distcp", 0, embed_size)},
      {Index("ln.weight", &zero1, 0),
       Info("__0_0.distcp", embed_size, static_cast<int64_t>(ln.bytes.size()))},
      {Index("steps", &zero1, 0),
       Info("__1_0.distcp", 0, static_cast<int64_t>(steps.bytes.size()))},
  });
  const std::string metadata = Metadata(sdm, storage);
  WriteAll(dir + "/.metadata", metadata);

  BuiltFixture fixture;
  fixture.input = dir;
  fixture.expected = ThreeFixtureTensors({"embed.weight", "ln.weight", "steps"});
  fixture.damages = {
      {".metadata: truncated to 0 bytes", ".metadata", Kind::kTruncate, 0},
      {".metadata: truncated halfway", ".metadata", Kind::kTruncate, metadata.size() / 2},
      {".metadata: one byte short", ".metadata", Kind::kTruncate, metadata.size() - 1},
      // A tensor name in state_dict_metadata: it no longer matches its storage entry.
      {".metadata: flipped byte in a tensor name", ".metadata", Kind::kFlip,
       metadata.find("embed.weight") + 3},
      // The low byte of embed.weight's length in its _StorageInfo.
      {".metadata: flipped byte in a storage length", ".metadata", Kind::kFlip,
       metadata.find("lengthJ") + 7},
      {".metadata: flipped byte in a storage offset", ".metadata", Kind::kFlip,
       metadata.find("offsetJ", metadata.find("ln.weight", metadata.find("_StorageInfo"))) + 7},
      {"__0_0.distcp: truncated to 0 bytes", "__0_0.distcp", Kind::kTruncate, 0},
      {"__0_0.distcp: one byte short", "__0_0.distcp", Kind::kTruncate, rank0.size() - 1},
      {"__1_0.distcp: missing", "__1_0.distcp", Kind::kRemove, 0},
  };
  for (FixtureDamage& damage : TorchSaveDamages("__0_0.distcp", embed, "FloatStorage", 0,
                                                /*whole_file=*/false)) {
    fixture.damages.push_back(std::move(damage));
  }
  for (FixtureDamage& damage : TorchSaveDamages("__0_0.distcp", ln, "BFloat16Storage",
                                                embed.bytes.size(), /*whole_file=*/false)) {
    fixture.damages.push_back(std::move(damage));
  }
  return fixture;
}

BuiltFixture BuildRowMajorDcpFixture(const std::string& dir) { return BuildDcpFixture(dir, false); }
BuiltFixture BuildColumnMajorDcpFixture(const std::string& dir) {
  return BuildDcpFixture(dir, true);
}

const FormatFixtureRegistration register_fixture("torch-dcp", BuildRowMajorDcpFixture);
const FormatFixtureRegistration register_column_major("torch-dcp", "column-major",
                                                      BuildColumnMajorDcpFixture);

}  // namespace
}  // namespace reshard
