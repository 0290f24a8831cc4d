// Tests of the layer every torch.save reader shares, on archives built here: zips laid out as
// torch.save writes them (lib/testing/zip_builder.h) around pickles written by PickleWriter or,
// for what it cannot express (storage offsets, Parameters, tensor subclasses, objects with
// state, Enums), spliced opcode by opcode. Tensors must be located at their exact bytes
// (record payload + storage offset x element size) with their view, broken or unsupported
// archives refused with the reason, and the navigation helpers must read the plain values
// checkpoints keep and answer null / nullopt for anything else.

#include "lib/formats/torch/torch_file.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_fixture.h"
#include "lib/testing/test_files.h"
#include "lib/testing/zip_builder.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;
using zip_testing::BuildZip;
using zip_testing::Built;
using zip_testing::Entry;

constexpr char kPath[] = "/ckpt/model.pt";

// ---- pickle pieces

// The opcodes PickleWriter writes for one value, without its PROTO and STOP, to splice into
// hand-written streams.
std::string Fragment(const std::function<void(PickleWriter&)>& write) {
  PickleWriter writer;
  write(writer);
  const std::string pickle = writer.Finish();
  return pickle.substr(2, pickle.size() - 3);
}
std::string Int(int64_t v) {
  return Fragment([&](PickleWriter& w) { w.Int(v); });
}
std::string Str(absl::string_view s) {
  return Fragment([&](PickleWriter& w) { w.String(s); });
}
std::string Real(double v) {
  return Fragment([&](PickleWriter& w) { w.Float(v); });
}
std::string Global(absl::string_view module, absl::string_view name) {
  return Fragment([&](PickleWriter& w) { w.Global(module, name); });
}
std::string IntTuple(const std::vector<int64_t>& values) {
  std::string out = "(";
  for (int64_t v : values) out += Int(v);
  return out + "t";
}
// OrderedDict()
std::string EmptyOrderedDict() { return Global("collections", "OrderedDict") + ")R"; }
// {key: value, ...} from already written values.
std::string Dict(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::string out = "}(";
  for (const auto& [key, value] : entries) out += Str(key) + value;
  return out + "u";
}
// PROTO 2, `body`, STOP.
std::string Pickle(const std::string& body) { return std::string("\x80\x02", 2) + body + "."; }

// BINPERSID of ('storage', module.cls, key, 'cpu', numel).
std::string StorageId(absl::string_view cls, absl::string_view key, int64_t numel,
                      absl::string_view module = "torch") {
  return "(" + Str("storage") + Global(module, cls) + Str(key) + Str("cpu") + Int(numel) + "tQ";
}
// The argument tuple of _rebuild_tensor_v2: (storage, offset, size, stride, False,
// OrderedDict()).
std::string TensorArgs(const std::string& storage, int64_t offset,
                       const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  return "(" + storage + Int(offset) + IntTuple(shape) + IntTuple(strides) + "\x89" +
         EmptyOrderedDict() + "t";
}
std::string TensorV2(const std::string& storage, int64_t offset, const std::vector<int64_t>& shape,
                     const std::vector<int64_t>& strides) {
  return Global("torch._utils", "_rebuild_tensor_v2") +
         TensorArgs(storage, offset, shape, strides) + "R";
}

// ---- archives

// Little-endian float32 values start, start + 1, ...
std::string F32s(int n, float start = 0) {
  std::string out(4 * n, '\0');
  for (int i = 0; i < n; ++i) {
    const float v = start + i;
    std::memcpy(&out[4 * i], &v, 4);
  }
  return out;
}
float F32At(const std::string& bytes, uint64_t offset) {
  float v = 0;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}

// A torch.save archive, and where each of its records' payload is.
struct TorchZip {
  std::vector<Entry> entries;
  Built built;

  const std::string& bytes() const { return built.bytes; }
  uint64_t Payload(absl::string_view name) const {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].name == name) return built.payload[i];
    }
    ADD_FAILURE() << "no entry " << name;
    return 0;
  }
};

TorchZip Zip(std::vector<Entry> entries) {
  TorchZip zip;
  zip.entries = std::move(entries);
  zip.built = BuildZip(zip.entries);
  return zip;
}

TorchZip TorchSave(const std::string& pickle,
                   const std::vector<std::pair<std::string, std::string>>& storages = {}) {
  return Zip(TorchSaveEntries(pickle, storages));
}

std::unique_ptr<TorchArchive> ParseOk(const TorchZip& zip) {
  auto archive = TorchArchive::Parse(zip.bytes(), kPath);
  EXPECT_TRUE(archive.ok()) << archive.status();
  if (!archive.ok()) return nullptr;
  return *std::move(archive);
}

// The location of the tensor under `key` of the root dict; fails the test when it is not one.
TensorLocation Locate(const TorchArchive& archive, absl::string_view key) {
  const PickleValue* value = PickleField(archive.root(), key);
  EXPECT_NE(value, nullptr) << key;
  auto location = archive.Tensor(value, key);
  EXPECT_TRUE(location.ok()) << location.status();
  if (!location.ok()) return {};
  EXPECT_TRUE(location->has_value()) << key << " is not a tensor";
  if (!location->has_value()) return {};
  return **location;
}

void ExpectLocation(const TensorLocation& location, DType dtype, const Shape& shape,
                    const std::vector<int64_t>& strides, uint64_t byte_offset,
                    const std::string& storage_key) {
  EXPECT_EQ(DTypeName(location.dtype), DTypeName(dtype));
  EXPECT_EQ(location.shape, shape);
  EXPECT_EQ(location.strides, strides);
  EXPECT_EQ(location.byte_offset, byte_offset);
  EXPECT_EQ(location.storage_key, storage_key);
}

// `status` has `code` and a message with each of `words`.
void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::vector<std::string>& words) {
  ASSERT_FALSE(status.ok()) << "accepted; want an error with: " << words.front();
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& word : words) {
    EXPECT_NE(status.message().find(word), absl::string_view::npos)
        << "want \"" << word << "\" in: " << status.message();
  }
}

absl::Status ParseStatus(const std::string& bytes) {
  return TorchArchive::Parse(bytes, kPath).status();
}

// ---- locating tensors

TEST(TorchArchiveTest, FlatDictOfTensorsAtTheirRecords) {
  PickleWriter w;
  w.BeginDict(false);
  w.String("a");
  w.Tensor("FloatStorage", "0", 6, {2, 3}, {3, 1});
  w.String("b");
  w.Tensor("BFloat16Storage", "1", 4, {4}, {1});
  w.String("c");
  w.Tensor("LongStorage", "2", 1, {}, {});
  w.EndDict();
  std::string forty_two(8, '\0');
  forty_two[0] = 42;
  const TorchZip zip =
      TorchSave(w.Finish(), {{"0", F32s(6, 10)}, {"1", std::string(8, 'b')}, {"2", forty_two}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  EXPECT_EQ(archive->path(), kPath);
  EXPECT_EQ(archive->size(), zip.bytes().size());
  EXPECT_GT(archive->pickle_values(), 0u);
  ASSERT_NE(archive->root(), nullptr);
  EXPECT_EQ(archive->root()->kind, Kind::kDict);
  ASSERT_EQ(PickleEntries(archive->root())->size(), 3u);

  const uint64_t data0 = zip.Payload("archive/data/0");
  EXPECT_EQ(data0 % 64, 0u);  // torch aligns records; the builder does too
  const TensorLocation a = Locate(*archive, "a");
  ExpectLocation(a, DType::kF32, {2, 3}, {3, 1}, data0, "0");
  EXPECT_EQ(F32At(zip.bytes(), a.byte_offset), 10.0f);
  EXPECT_EQ(F32At(zip.bytes(), a.byte_offset + (1 * 3 + 2) * 4), 15.0f);  // a[1][2]
  ExpectLocation(Locate(*archive, "b"), DType::kBF16, {4}, {1}, zip.Payload("archive/data/1"), "1");
  const TensorLocation c = Locate(*archive, "c");
  ExpectLocation(c, DType::kI64, {}, {}, zip.Payload("archive/data/2"), "2");
  EXPECT_EQ(zip.bytes()[c.byte_offset], 42);

  EXPECT_TRUE(TorchArchive::IsTensor(PickleField(archive->root(), "a")));
  EXPECT_FALSE(TorchArchive::IsTensor(archive->root()));
  EXPECT_FALSE(TorchArchive::IsTensor(nullptr));
  // Not tensors: nullopt, not an error.
  for (const PickleValue* value : {archive->root(), static_cast<const PickleValue*>(nullptr)}) {
    auto none = archive->Tensor(value, "x");
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_FALSE(none->has_value());
  }
}

TEST(TorchArchiveTest, OffsetsAreRelativeToTheParsedSlice) {
  PickleWriter w;
  w.BeginDict(false);
  w.String("w");
  w.Tensor("FloatStorage", "0", 4, {4}, {1});
  w.EndDict();
  const TorchZip zip = TorchSave(w.Finish(), {{"0", F32s(4)}});
  // A DCP chunk: the archive sits at byte 1000 of a larger file.
  const std::string file = std::string(1000, 'p') + zip.bytes() + std::string(77, 's');
  auto archive = TorchArchive::Parse(absl::string_view(file).substr(1000, zip.bytes().size()),
                                     "/ckpt/__0_0.distcp");
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ((*archive)->size(), zip.bytes().size());
  EXPECT_EQ(Locate(**archive, "w").byte_offset, zip.Payload("archive/data/0"));
}

TEST(TorchArchiveTest, TransposedView) {
  PickleWriter w;
  w.BeginDict(false);
  w.String("t");  // torch.arange(6.).view(2, 3).t()
  w.Tensor("FloatStorage", "0", 6, {3, 2}, {1, 3});
  w.EndDict();
  const TorchZip zip = TorchSave(w.Finish(), {{"0", F32s(6)}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  const TensorLocation t = Locate(*archive, "t");
  ExpectLocation(t, DType::kF32, {3, 2}, {1, 3}, zip.Payload("archive/data/0"), "0");
  // t[2][1] is element 2 * 1 + 1 * 3 = 5.
  EXPECT_EQ(F32At(zip.bytes(), t.byte_offset + (2 * 1 + 1 * 3) * 4), 5.0f);
}

TEST(TorchArchiveTest, ViewsWithAStorageOffset) {
  const std::string pickle = Pickle(Dict({
      {"mid", TensorV2(StorageId("FloatStorage", "0", 8), 3, {2, 2}, {2, 1})},
      {"tail", TensorV2(StorageId("FloatStorage", "0", 8), 4, {2, 2}, {2, 1})},  // ends at 7
      {"empty", TensorV2(StorageId("FloatStorage", "0", 8), 8, {0}, {1})},
      {"strided", TensorV2(StorageId("HalfStorage", "1", 10), 1, {3}, {3})},  // 1, 4, 7
  }));
  const TorchZip zip = TorchSave(pickle, {{"0", F32s(8)}, {"1", std::string(20, 'h')}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  const uint64_t data0 = zip.Payload("archive/data/0");
  const TensorLocation mid = Locate(*archive, "mid");
  ExpectLocation(mid, DType::kF32, {2, 2}, {2, 1}, data0 + 3 * 4, "0");
  EXPECT_EQ(F32At(zip.bytes(), mid.byte_offset), 3.0f);
  ExpectLocation(Locate(*archive, "tail"), DType::kF32, {2, 2}, {2, 1}, data0 + 16, "0");
  ExpectLocation(Locate(*archive, "empty"), DType::kF32, {0}, {1}, data0 + 32, "0");
  ExpectLocation(Locate(*archive, "strided"), DType::kF16, {3}, {3},
                 zip.Payload("archive/data/1") + 2, "1");
}

TEST(TorchArchiveTest, TwoTensorsShareOneStorage) {
  // Tied weights and a slice of them: one record, two views.
  const std::string pickle = Pickle(Dict({
      {"embed", TensorV2(StorageId("FloatStorage", "0", 8), 0, {2, 4}, {4, 1})},
      {"row1", TensorV2(StorageId("FloatStorage", "0", 8), 4, {4}, {1})},
      {"other", TensorV2(StorageId("FloatStorage", "1", 2), 0, {2}, {1})},
  }));
  const TorchZip zip = TorchSave(pickle, {{"0", F32s(8)}, {"1", F32s(2)}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  const TensorLocation embed = Locate(*archive, "embed");
  const TensorLocation row1 = Locate(*archive, "row1");
  const TensorLocation other = Locate(*archive, "other");
  EXPECT_EQ(embed.storage_key, "0");
  EXPECT_EQ(row1.storage_key, embed.storage_key);
  EXPECT_EQ(other.storage_key, "1");
  EXPECT_EQ(embed.byte_offset, zip.Payload("archive/data/0"));
  EXPECT_EQ(row1.byte_offset, embed.byte_offset + 16);
  EXPECT_EQ(other.byte_offset, zip.Payload("archive/data/1"));
  EXPECT_EQ(F32At(zip.bytes(), row1.byte_offset), 4.0f);
}

TEST(TorchArchiveTest, ParameterAndSubclassWrappersLocatedLikeThePlainTensor) {
  const std::string storage = StorageId("FloatStorage", "0", 6);
  const std::string plain = TensorV2(storage, 2, {2, 2}, {1, 2});
  // nn.Parameter: _rebuild_parameter(tensor, requires_grad, OrderedDict())
  const std::string parameter = Global("torch._utils", "_rebuild_parameter") + "(" + plain +
                                "\x88" + EmptyOrderedDict() + "tR";
  const std::string parameter_with_state = Global("torch._utils", "_rebuild_parameter_with_state") +
                                           "(" + plain + "\x88" + EmptyOrderedDict() +
                                           Dict({{"tag", Int(1)}}) + "tR";
  // A tensor subclass with Python attributes (DeepSpeed): _rebuild_from_type_v2(func, type,
  // args, state).
  const std::string subclass = Global("torch._tensor", "_rebuild_from_type_v2") + "(" +
                               Global("torch._utils", "_rebuild_tensor_v2") +
                               Global("deepspeed.runtime.zero", "FlatTensor") +
                               TensorArgs(storage, 2, {2, 2}, {1, 2}) + Dict({{"ds_id", Int(7)}}) +
                               "tR";
  const std::string parameter_of_subclass = Global("torch._utils", "_rebuild_parameter") + "(" +
                                            subclass + "\x89" + EmptyOrderedDict() + "tR";
  const std::string pickle = Pickle(Dict({{"plain", plain},
                                          {"parameter", parameter},
                                          {"parameter_with_state", parameter_with_state},
                                          {"subclass", subclass},
                                          {"parameter_of_subclass", parameter_of_subclass}}));
  const TorchZip zip = TorchSave(pickle, {{"0", F32s(6)}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  for (const char* key :
       {"plain", "parameter", "parameter_with_state", "subclass", "parameter_of_subclass"}) {
    SCOPED_TRACE(key);
    EXPECT_TRUE(TorchArchive::IsTensor(PickleField(archive->root(), key)));
    ExpectLocation(Locate(*archive, key), DType::kF32, {2, 2}, {1, 2},
                   zip.Payload("archive/data/0") + 8, "0");
  }
}

TEST(TorchArchiveTest, RebuildV3OnAnUntypedStorage) {
  // Dtypes without a legacy storage class: UntypedStorage (numel in bytes) + the dtype.
  auto v3 = [](absl::string_view dtype) {
    return Global("torch._utils", "_rebuild_tensor_v3") + "(" +
           StorageId("UntypedStorage", "0", 16) + Int(1) + IntTuple({3}) + IntTuple({2}) + "\x89" +
           EmptyOrderedDict() + Global("torch", dtype) + "tR";
  };
  const std::string pickle = Pickle(Dict({{"u16", v3("uint16")}, {"c64", v3("complex64")}}));
  const TorchZip zip = TorchSave(pickle, {{"0", std::string(16, 'u')}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  ExpectLocation(Locate(*archive, "u16"), DType::kU16, {3}, {2}, zip.Payload("archive/data/0") + 2,
                 "0");
  ExpectError(archive->Tensor(PickleField(archive->root(), "c64"), "c64").status(),
              absl::StatusCode::kUnimplemented, {kPath, "\"c64\"", "dtype", "complex64"});
}

// ---- refusals

TEST(TorchArchiveTest, ViewReachingPastItsStorage) {
  const std::string pickle = Pickle(Dict({
      {"w", TensorV2(StorageId("FloatStorage", "0", 6), 0, {2, 3}, {3, 2})},   // last: 3 + 4 = 7
      {"one_past", TensorV2(StorageId("FloatStorage", "0", 6), 1, {6}, {1})},  // last: 6
      {"huge_stride",
       TensorV2(StorageId("FloatStorage", "0", 6), 0, {2}, {std::numeric_limits<int64_t>::max()})},
      {"far_offset", TensorV2(StorageId("FloatStorage", "0", 6), 7, {0}, {1})},
      {"negative_offset", TensorV2(StorageId("FloatStorage", "0", 6), -1, {1}, {1})},
      {"overflow", TensorV2(StorageId("FloatStorage", "0", 6), 0,
                            {int64_t{1} << 32, int64_t{1} << 32}, {0, 0})},
  }));
  const TorchZip zip = TorchSave(pickle, {{"0", F32s(6)}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  const std::string record = absl::StrCat("record at byte offset ", zip.Payload("archive/data/0"));
  ExpectError(archive->Tensor(PickleField(archive->root(), "w"), "model.w").status(),
              absl::StatusCode::kDataLoss,
              {kPath, "\"model.w\"", "reaches past storage 0", "(6 elements", record});
  ExpectError(archive->Tensor(PickleField(archive->root(), "one_past"), "one_past").status(),
              absl::StatusCode::kDataLoss,
              {"\"one_past\"", "at offset 1", "reaches past storage 0"});
  ExpectError(archive->Tensor(PickleField(archive->root(), "huge_stride"), "huge_stride").status(),
              absl::StatusCode::kDataLoss, {"\"huge_stride\"", "reaches past storage 0"});
  ExpectError(archive->Tensor(PickleField(archive->root(), "far_offset"), "far_offset").status(),
              absl::StatusCode::kDataLoss,
              {"\"far_offset\"", "storage offset 7 is outside storage 0 of 6 elements"});
  ExpectError(
      archive->Tensor(PickleField(archive->root(), "negative_offset"), "negative_offset").status(),
      absl::StatusCode::kDataLoss, {"\"negative_offset\"", "storage offset -1 is outside"});
  // An element count beyond int64 is a broken file too, named like the others.
  ExpectError(archive->Tensor(PickleField(archive->root(), "overflow"), "overflow").status(),
              absl::StatusCode::kDataLoss, {kPath, "\"overflow\"", "overflows int64"});
}

TEST(TorchArchiveTest, MalformedTensorCalls) {
  const std::string storage = StorageId("FloatStorage", "0", 4);
  auto call = [](const std::string& args) {
    return Global("torch._utils", "_rebuild_tensor_v2") + "(" + args + "tR";
  };
  const std::string pickle = Pickle(Dict({
      {"size_str", call(storage + Int(0) + Str("4") + IntTuple({1}) + "\x89" + EmptyOrderedDict())},
      {"lengths",
       call(storage + Int(0) + IntTuple({2, 2}) + IntTuple({1}) + "\x89" + EmptyOrderedDict())},
      {"negative_stride",
       call(storage + Int(0) + IntTuple({2}) + IntTuple({-1}) + "\x89" + EmptyOrderedDict())},
      {"offset_str",
       call(storage + Str("0") + IntTuple({4}) + IntTuple({1}) + "\x89" + EmptyOrderedDict())},
      {"few_args", call(storage + Int(0) + IntTuple({4}))},
      {"untyped", TensorV2(StorageId("UntypedStorage", "1", 8), 0, {2}, {1})},
      {"quantized", Global("torch._utils", "_rebuild_qtensor") + "(" + storage + "tR"},
  }));
  const TorchZip zip = TorchSave(pickle, {{"0", F32s(4)}, {"1", std::string(8, 'u')}});
  auto archive = ParseOk(zip);
  ASSERT_NE(archive, nullptr);
  auto status = [&](absl::string_view key) {
    return archive->Tensor(PickleField(archive->root(), key), key).status();
  };
  ExpectError(status("size_str"), absl::StatusCode::kDataLoss, {"\"size_str\"", "size is str"});
  ExpectError(status("lengths"), absl::StatusCode::kDataLoss,
              {"\"lengths\"", "size and stride differ in length"});
  ExpectError(status("negative_stride"), absl::StatusCode::kDataLoss,
              {"\"negative_stride\"", "stride is tuple of 1"});
  ExpectError(status("offset_str"), absl::StatusCode::kDataLoss,
              {"\"offset_str\"", "malformed _rebuild_tensor_v2 call"});
  ExpectError(status("few_args"), absl::StatusCode::kDataLoss,
              {"\"few_args\"", "malformed _rebuild_tensor_v2 call"});
  ExpectError(status("untyped"), absl::StatusCode::kDataLoss,
              {"\"untyped\"", "untyped storage without a dtype"});
  ExpectError(status("quantized"), absl::StatusCode::kUnimplemented,
              {kPath, "\"quantized\"", "torch._utils._rebuild_qtensor", "not supported"});
}

TEST(TorchArchiveTest, StorageRecordSizeDisagreesWithNumel) {
  const std::string pickle =
      Pickle(Dict({{"w", TensorV2(StorageId("FloatStorage", "0", 6), 0, {6}, {1})}}));
  const TorchZip zip = TorchSave(pickle, {{"0", F32s(5)}});
  ExpectError(
      ParseStatus(zip.bytes()), absl::StatusCode::kDataLoss,
      {kPath, "data.pkl", "storage data/0 should hold 6 elements of 4 bytes",
       "its record has 20 bytes", absl::StrCat("at byte offset ", zip.Payload("archive/data/0"))});
  // A negative numel is refused as well, not wrapped around.
  const std::string negative =
      Pickle(Dict({{"w", TensorV2(StorageId("FloatStorage", "0", -1), 0, {0}, {1})}}));
  ExpectError(ParseStatus(TorchSave(negative, {{"0", ""}}).bytes()), absl::StatusCode::kDataLoss,
              {"storage data/0 should hold -1 elements"});
}

TEST(TorchArchiveTest, StorageKeyReusedForADifferentStorage) {
  // torch.save names each storage once; a second reference that disagrees on class or size
  // would give a later tensor the wrong dtype, so it is corrupt input.
  const std::string pickle = Pickle(Dict({
      {"a", TensorV2(StorageId("FloatStorage", "0", 8), 0, {8}, {1})},
      {"b", TensorV2(StorageId("HalfStorage", "0", 16), 0, {16}, {1})},
  }));
  ExpectError(ParseStatus(TorchSave(pickle, {{"0", F32s(8)}}).bytes()), absl::StatusCode::kDataLoss,
              {kPath, "storage 0 is referenced as HalfStorage of 16 elements"});
  const std::string resized = Pickle(Dict({
      {"a", TensorV2(StorageId("FloatStorage", "0", 8), 0, {8}, {1})},
      {"b", TensorV2(StorageId("FloatStorage", "0", 4), 0, {4}, {1})},
  }));
  ExpectError(ParseStatus(TorchSave(resized, {{"0", F32s(8)}}).bytes()),
              absl::StatusCode::kDataLoss, {"storage 0 is referenced as FloatStorage of 4"});
}

TEST(TorchArchiveTest, MissingStorageRecord) {
  const std::string pickle =
      Pickle(Dict({{"w", TensorV2(StorageId("FloatStorage", "3", 4), 0, {4}, {1})}}));
  ExpectError(ParseStatus(TorchSave(pickle, {{"0", F32s(4)}}).bytes()), absl::StatusCode::kDataLoss,
              {kPath, "storage record data/3 is missing"});
}

TEST(TorchArchiveTest, CompressedStorageRecord) {
  const std::string pickle =
      Pickle(Dict({{"w", TensorV2(StorageId("FloatStorage", "0", 4), 0, {4}, {1})}}));
  std::vector<Entry> entries = TorchSaveEntries(pickle, {{"0", "deflated"}});
  entries[2].method = 8;
  entries[2].uncompressed_size = 16;
  ExpectError(ParseStatus(Zip(entries).bytes()), absl::StatusCode::kUnimplemented,
              {kPath, "storage record data/0 is compressed"});
}

// data.pkl names the tensors: a changed byte there must not read as another model.
TEST(TorchArchiveTest, DataPklFailingItsCrc32) {
  const std::string pickle =
      Pickle(Dict({{"weight", TensorV2(StorageId("FloatStorage", "0", 4), 0, {4}, {1})}}));
  const TorchZip zip = TorchSave(pickle, {{"0", F32s(4)}});
  std::string bytes = zip.bytes();
  const uint64_t name = bytes.find("weight", zip.Payload("archive/data.pkl"));
  ASSERT_NE(name, std::string::npos);
  bytes[name + 2] ^= 0x01;  // "weight" -> "wdight", still a valid pickle
  ExpectError(ParseStatus(bytes), absl::StatusCode::kDataLoss,
              {kPath, "data.pkl fails its CRC-32"});
  // A CRC-32 of 0 is none recorded (torch.save with set_crc32_options(False)): not checked.
  std::vector<Entry> entries = TorchSaveEntries(pickle, {{"0", F32s(4)}});
  entries[0].crc32 = 0;
  EXPECT_TRUE(ParseStatus(Zip(entries).bytes()).ok());
}

TEST(TorchArchiveTest, UnknownStorageClass) {
  const std::string qint8 =
      Pickle(Dict({{"q", TensorV2(StorageId("QInt8Storage", "0", 4), 0, {4}, {1})}}));
  ExpectError(ParseStatus(TorchSave(qint8, {{"0", std::string(4, 'q')}}).bytes()),
              absl::StatusCode::kUnimplemented,
              {kPath, "storage 0 of class torch.QInt8Storage is not supported"});
  // The right class name outside torch is not a torch storage.
  const std::string foreign =
      Pickle(Dict({{"w", TensorV2(StorageId("FloatStorage", "0", 1, "numpy"), 0, {1}, {1})}}));
  ExpectError(ParseStatus(TorchSave(foreign, {{"0", F32s(1)}}).bytes()),
              absl::StatusCode::kUnimplemented, {"class numpy.FloatStorage is not supported"});
}

TEST(TorchArchiveTest, MalformedPersistentId) {
  const std::string pickle =
      Pickle(Dict({{"w", Global("torch._utils", "_rebuild_tensor_v2") + "((" + Str("storage") +
                             Global("torch", "FloatStorage") + Str("0") + Str("cpu") + "tQ" +
                             Int(0) + IntTuple({1}) + IntTuple({1}) + "tR"}}));
  ExpectError(ParseStatus(TorchSave(pickle, {{"0", F32s(1)}}).bytes()), absl::StatusCode::kDataLoss,
              {kPath, "persistent id is tuple of 4"});
}

TEST(TorchArchiveTest, LegacyFormatIsRefused) {
  // torch.save(..., _use_new_zipfile_serialization=False): the magic number, then pickles.
  const std::string legacy = std::string(kLegacyTorchMagic, kLegacyTorchMagicSize) + ".\x80\x02" +
                             Int(1001) + "." + std::string(100, '\0');
  ExpectError(ParseStatus(legacy), absl::StatusCode::kUnimplemented, {kPath, "legacy"});
  // The magic alone (a truncated legacy file) is recognized too.
  ExpectError(ParseStatus(std::string(kLegacyTorchMagic, kLegacyTorchMagicSize)),
              absl::StatusCode::kUnimplemented, {"legacy"});
  // Pickle protocols 4 and 5 put a FRAME before the magic (bytes as torch 1.13 writes them).
  const std::string frame = std::string("\x95\x0d\0\0\0\0\0\0\0", 9);
  const std::string magic(kLegacyTorchMagic + 2, kLegacyTorchMagicSize - 2);
  for (const char protocol : {'\x04', '\x05'}) {
    const std::string head =
        std::string("\x80") + protocol + frame + magic + "." + std::string(64, '\0');
    EXPECT_TRUE(IsLegacyTorchSave(head));
    ExpectError(ParseStatus(head), absl::StatusCode::kUnimplemented, {"legacy"});
  }
  EXPECT_FALSE(IsLegacyTorchSave(""));
  // A FRAME cut short (found by torch_archive_fuzzer: substr past the end threw).
  EXPECT_FALSE(IsLegacyTorchSave(std::string("\x80\x08\x95\xda\x01\0\0\0\0", 9)));
  EXPECT_FALSE(IsLegacyTorchSave(std::string("\x80\x04\x95", 3)));
  EXPECT_FALSE(IsLegacyTorchSave("PK\x03\x04"));
  // Neither a zip nor legacy: the zip reader's DataLoss.
  ExpectError(ParseStatus(std::string(200, 'x')), absl::StatusCode::kDataLoss, {kPath});
}

TEST(TorchArchiveTest, TorchScriptArchiveIsRefused) {
  const std::string pickle = Pickle(Dict({}));
  const TorchZip zip =
      Zip(TorchSaveEntries(pickle, {},
                           {{"archive/constants.pkl", Pickle(")")},
                            {"archive/code/__torch__/m.py", "def forward(self): ..."}}));
  ExpectError(ParseStatus(zip.bytes()), absl::StatusCode::kUnimplemented, {kPath, "TorchScript"});
}

TEST(TorchArchiveTest, OtherArchivesThatAreNotStateDicts) {
  {  // No data.pkl.
    const TorchZip zip = Zip({{"archive/data/0", F32s(1)}, {"archive/version", "3\n"}});
    ExpectError(ParseStatus(zip.bytes()), absl::StatusCode::kDataLoss,
                {kPath, "archive/data.pkl", "not a torch.save file"});
  }
  {  // Saved on a big-endian machine.
    std::vector<Entry> entries = TorchSaveEntries(Pickle(Dict({})), {});
    entries[1].data = "big";
    ExpectError(ParseStatus(Zip(entries).bytes()), absl::StatusCode::kUnimplemented,
                {kPath, "big-endian"});
  }
  {  // A compressed data.pkl.
    std::vector<Entry> entries = TorchSaveEntries(Pickle(Dict({})), {});
    entries[0].method = 8;
    ExpectError(ParseStatus(Zip(entries).bytes()), absl::StatusCode::kUnimplemented,
                {kPath, "data.pkl is compressed"});
  }
  {  // A broken pickle: the VM's DataLoss, under the file's name.
    ExpectError(ParseStatus(TorchSave(std::string("\x80\x02}", 3)).bytes()),
                absl::StatusCode::kDataLoss, {kPath, "data.pkl", "without STOP"});
  }
}

// ---- navigation helpers

class NavigationTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string pickle = Pickle(Dict({
        {"step", Int(10)},
        {"on", "\x88"},
        {"off", "\x89"},
        {"name", Str("adam")},
        {"real", Real(1.5)},
        {"none", "N"},
        {"size", Global("torch", "Size") + "(" + IntTuple({2, 3}) + "tR"},
        {"bad_size", Global("torch", "Size") + "(" + IntTuple({2}) + IntTuple({3}) + "tR"},
        {"tuple", IntTuple({4, 5})},
        {"empty", ")"},
        {"list", "](" + Int(6) + Int(7) + "e"},
        {"negative", IntTuple({2, -1})},
        {"mixed", "(" + Int(2) + Str("x") + "t"},
        {"ordered", Fragment([](PickleWriter& w) {
           w.BeginDict(true);
           w.String("k");
           w.Int(1);
           w.EndDict();
         })},
        {"int_keys", "}(" + Int(1) + Str("one") + "u"},
        // argparse.Namespace / a dataclass: NEWOBJ, then BUILD with the __dict__.
        {"args", Global("argparse", "Namespace") + ")\x81" +
                     Dict({{"lr", Int(3)}, {"run", Str("r1")}}) + "b"},
        // __slots__ only: BUILD with (None, slots).
        {"slots", Global("m", "Slotted") + ")\x81" + "(N" + Dict({{"z", Int(8)}}) + "tb"},
        // __dict__ and __slots__: BUILD with (dict, slots).
        {"both", Global("m", "Both") + ")\x81" + "(" + Dict({{"a", Int(1)}}) +
                     Dict({{"b", Int(2)}}) + "tb"},
        // A dict subclass: NEWOBJ, then SETITEMS on the object.
        {"dict_subclass", Global("m", "MyDict") + ")\x81" + "(" + Str("q") + Int(9) + "u"},
        // DeepSpeed's ZeroStageEnum(3)
        {"stage", Global("deepspeed.runtime.zero.config", "ZeroStageEnum") + "(" + Int(3) + "tR"},
        {"device", Global("torch", "device") + "(" + Str("cpu") + "tR"},
    }));
    zip_ = TorchSave(pickle);
    archive_ = ParseOk(zip_);
    ASSERT_NE(archive_, nullptr);
    root_ = archive_->root();
  }
  const PickleValue* Get(absl::string_view key) {
    const PickleValue* value = PickleField(root_, key);
    EXPECT_NE(value, nullptr) << key;
    return value;
  }

  TorchZip zip_;
  std::unique_ptr<TorchArchive> archive_;
  const PickleValue* root_ = nullptr;
};

TEST_F(NavigationTest, PickleField) {
  EXPECT_EQ(PickleInt(PickleField(root_, "step")), 10);
  EXPECT_EQ(PickleField(root_, "absent"), nullptr);
  EXPECT_EQ(PickleField(root_, "Step"), nullptr);  // exact keys
  EXPECT_EQ(PickleInt(PickleField(Get("ordered"), "k")), 1);
  EXPECT_EQ(PickleField(Get("ordered"), "absent"), nullptr);
  EXPECT_EQ(PickleInt(PickleField(Get("args"), "lr")), 3);
  EXPECT_EQ(PickleString(PickleField(Get("args"), "run")), "r1");
  EXPECT_EQ(PickleField(Get("args"), "absent"), nullptr);
  EXPECT_EQ(PickleInt(PickleField(Get("slots"), "z")), 8);
  EXPECT_EQ(PickleInt(PickleField(Get("both"), "a")), 1);
  EXPECT_EQ(PickleInt(PickleField(Get("both"), "b")), 2);
  EXPECT_EQ(PickleField(Get("both"), "c"), nullptr);
  EXPECT_EQ(PickleInt(PickleField(Get("dict_subclass"), "q")), 9);
  // Only string keys match.
  EXPECT_EQ(PickleField(Get("int_keys"), "1"), nullptr);
  // Not containers of fields.
  EXPECT_EQ(PickleField(nullptr, "step"), nullptr);
  EXPECT_EQ(PickleField(Get("step"), "step"), nullptr);
  EXPECT_EQ(PickleField(Get("name"), "adam"), nullptr);
  EXPECT_EQ(PickleField(Get("list"), "0"), nullptr);
  EXPECT_EQ(PickleField(Get("stage"), "value"), nullptr);  // an object without state
  EXPECT_EQ(PickleField(Get("none"), "x"), nullptr);
}

TEST_F(NavigationTest, PickleInt) {
  EXPECT_EQ(PickleInt(Get("step")), 10);
  EXPECT_EQ(PickleInt(Get("on")), 1);
  EXPECT_EQ(PickleInt(Get("off")), 0);
  EXPECT_EQ(PickleInt(Get("stage")), 3);
  EXPECT_EQ(PickleInt(nullptr), std::nullopt);
  EXPECT_EQ(PickleInt(Get("name")), std::nullopt);
  EXPECT_EQ(PickleInt(Get("real")), std::nullopt);
  EXPECT_EQ(PickleInt(Get("none")), std::nullopt);
  EXPECT_EQ(PickleInt(Get("device")), std::nullopt);  // one argument, not an int
  EXPECT_EQ(PickleInt(Get("size")), std::nullopt);    // one argument, a tuple
  EXPECT_EQ(PickleInt(Get("args")), std::nullopt);
  EXPECT_EQ(PickleInt(Get("tuple")), std::nullopt);
}

TEST_F(NavigationTest, PickleString) {
  EXPECT_EQ(PickleString(Get("name")), "adam");
  EXPECT_EQ(PickleString(nullptr), std::nullopt);
  EXPECT_EQ(PickleString(Get("step")), std::nullopt);
  EXPECT_EQ(PickleString(Get("none")), std::nullopt);
  EXPECT_EQ(PickleString(Get("device")), std::nullopt);
}

TEST_F(NavigationTest, PickleShape) {
  using Ints = std::vector<int64_t>;
  EXPECT_EQ(PickleShape(Get("size")), Ints({2, 3}));
  EXPECT_EQ(PickleShape(Get("tuple")), Ints({4, 5}));
  EXPECT_EQ(PickleShape(Get("list")), Ints({6, 7}));
  EXPECT_EQ(PickleShape(Get("empty")), Ints());  // a scalar's shape, not a mismatch
  EXPECT_EQ(PickleShape(nullptr), std::nullopt);
  EXPECT_EQ(PickleShape(Get("negative")), std::nullopt);
  EXPECT_EQ(PickleShape(Get("mixed")), std::nullopt);
  EXPECT_EQ(PickleShape(Get("bad_size")), std::nullopt);
  EXPECT_EQ(PickleShape(Get("step")), std::nullopt);
  EXPECT_EQ(PickleShape(Get("name")), std::nullopt);
  EXPECT_EQ(PickleShape(Get("stage")), std::nullopt);
  EXPECT_EQ(PickleShape(Get("ordered")), std::nullopt);
}

TEST_F(NavigationTest, PickleEntriesAndItems) {
  const auto* entries = PickleEntries(root_);
  ASSERT_NE(entries, nullptr);
  ASSERT_EQ(entries->size(), 21u);
  EXPECT_EQ(PickleString((*entries)[0].first), "step");
  EXPECT_EQ(PickleString(entries->back().first), "device");
  const auto* ordered = PickleEntries(Get("ordered"));
  ASSERT_NE(ordered, nullptr);
  ASSERT_EQ(ordered->size(), 1u);
  EXPECT_TRUE(Get("ordered")->ordered);
  EXPECT_EQ(PickleString((*ordered)[0].first), "k");
  ASSERT_NE(PickleEntries(Get("dict_subclass")), nullptr);
  EXPECT_EQ(PickleEntries(Get("dict_subclass"))->size(), 1u);
  EXPECT_EQ(PickleEntries(nullptr), nullptr);
  EXPECT_EQ(PickleEntries(Get("list")), nullptr);
  EXPECT_EQ(PickleEntries(Get("stage")), nullptr);  // an object without SETITEMS
  EXPECT_EQ(PickleEntries(Get("step")), nullptr);

  ASSERT_NE(PickleItems(Get("tuple")), nullptr);
  EXPECT_EQ(PickleItems(Get("tuple"))->size(), 2u);
  ASSERT_NE(PickleItems(Get("list")), nullptr);
  EXPECT_EQ(PickleInt(PickleItems(Get("list"))->at(1)), 7);
  ASSERT_NE(PickleItems(Get("empty")), nullptr);
  EXPECT_TRUE(PickleItems(Get("empty"))->empty());
  EXPECT_EQ(PickleItems(nullptr), nullptr);
  EXPECT_EQ(PickleItems(root_), nullptr);
  EXPECT_EQ(PickleItems(Get("name")), nullptr);
  EXPECT_EQ(PickleItems(Get("size")), nullptr);  // a torch.Size is an object; see PickleShape
}

// ---- the rest of the interface

TEST(TorchDTypeTest, StorageClassesAndDtypeGlobals) {
  EXPECT_EQ(TorchDType("FloatStorage"), DType::kF32);
  EXPECT_EQ(TorchDType("BFloat16Storage"), DType::kBF16);
  EXPECT_EQ(TorchDType("HalfStorage"), DType::kF16);
  EXPECT_EQ(TorchDType("BoolStorage"), DType::kBool);
  EXPECT_EQ(TorchDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(TorchDType("long"), DType::kI64);
  EXPECT_EQ(TorchDType("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_EQ(TorchDType("uint64"), DType::kU64);
  EXPECT_EQ(TorchDType("QInt8Storage"), std::nullopt);
  EXPECT_EQ(TorchDType("complex64"), std::nullopt);
  EXPECT_EQ(TorchDType(""), std::nullopt);
  EXPECT_EQ(TorchDType("floatstorage"), std::nullopt);
}

TEST(CatalogTensorAtTest, OneFullBoxPiece) {
  TensorLocation location;
  location.dtype = DType::kBF16;
  location.shape = {3, 2};
  location.strides = {1, 3};
  location.byte_offset = 4160;
  location.storage_key = "5";
  const CatalogTensor tensor = CatalogTensorAt("layers.0.w", location, 2);
  EXPECT_EQ(tensor.name, "layers.0.w");
  EXPECT_EQ(DTypeName(tensor.dtype), DTypeName(DType::kBF16));
  EXPECT_EQ(tensor.shape, Shape({3, 2}));
  ASSERT_EQ(tensor.pieces.size(), 1u);
  const SourcePiece& piece = tensor.pieces[0];
  EXPECT_EQ(piece.file, 2);
  EXPECT_EQ(piece.byte_offset, 4160u);
  EXPECT_EQ(piece.box.origin, std::vector<int64_t>({0, 0}));
  EXPECT_EQ(piece.box.extent, std::vector<int64_t>({3, 2}));
  EXPECT_EQ(piece.strides, std::vector<int64_t>({1, 3}));
  // A scalar: a rank-0 box.
  location.shape = {};
  location.strides = {};
  const CatalogTensor scalar = CatalogTensorAt("step", location, 0);
  ASSERT_EQ(scalar.pieces.size(), 1u);
  EXPECT_EQ(scalar.pieces[0].box.rank(), 0u);
  EXPECT_EQ(scalar.pieces[0].file, 0);
}

TEST(TorchArchiveOpenTest, OpensAFileOnDisk) {
  PickleWriter w;
  w.BeginDict(true);
  w.String("w");
  w.Tensor("FloatStorage", "0", 6, {2, 3}, {3, 1});
  w.String("b");
  w.Tensor("FloatStorage", "1", 2, {2}, {1});
  w.EndDict();
  const TorchZip zip = TorchSave(w.Finish(), {{"0", F32s(6)}, {"1", F32s(2, 6)}});
  const std::string path = MakeTempDir("torch_file") + "/model.pt";
  WriteAll(path, zip.bytes());
  auto archive = TorchArchive::Open(path);
  ASSERT_TRUE(archive.ok()) << archive.status();
  EXPECT_EQ((*archive)->path(), path);
  EXPECT_EQ((*archive)->size(), zip.bytes().size());
  EXPECT_TRUE((*archive)->root()->ordered);
  ExpectLocation(Locate(**archive, "w"), DType::kF32, {2, 3}, {3, 1}, zip.Payload("archive/data/0"),
                 "0");
  ExpectLocation(Locate(**archive, "b"), DType::kF32, {2}, {1}, zip.Payload("archive/data/1"), "1");
  // Errors name the file.
  const std::string legacy = MakeTempDir("torch_file") + "/legacy.pt";
  WriteAll(legacy, std::string(kLegacyTorchMagic, kLegacyTorchMagicSize) + std::string(64, '\0'));
  ExpectError(TorchArchive::Open(legacy).status(), absl::StatusCode::kUnimplemented,
              {legacy, "legacy"});
  EXPECT_EQ(TorchArchive::Open(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace reshard
