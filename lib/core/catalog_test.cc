#include "lib/core/catalog.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

int64_t FlatIndex(const Shape& shape, const std::vector<int64_t>& index) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

// Calls fn(index) for every index of `box`, in row-major order.
template <typename Fn>
void ForEachIndex(const Box& box, Fn fn) {
  const size_t rank = box.rank();
  for (int64_t e : box.extent) {
    if (e == 0) return;
  }
  std::vector<int64_t> index = box.origin;
  while (true) {
    fn(index);
    int d = static_cast<int>(rank) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < box.origin[d] + box.extent[d]) break;
      index[d] = box.origin[d];
    }
    if (d < 0) return;
  }
}

void CheckFlatRange(const Shape& shape, DType dtype, int64_t begin, int64_t end,
                    const std::string& context) {
  CatalogTensor tensor{"t", dtype, shape, {}};
  const uint64_t base = 1000;
  AddFlatRangePieces(tensor, 3, base, begin, end);
  const int64_t total = NumElementsUnchecked(shape);
  const size_t element_size = DTypeSize(dtype);
  std::vector<int> covered(total, 0);
  const std::vector<int64_t> strides = RowMajorStrides(shape);
  if (begin >= end) {
    EXPECT_TRUE(tensor.pieces.empty()) << context;
    return;
  }
  if (shape.size() > 0) {
    EXPECT_LE(tensor.pieces.size(), 2 * shape.size() - 1) << context;
  }
  for (const SourcePiece& piece : tensor.pieces) {
    EXPECT_EQ(piece.file, 3) << context;
    ASSERT_EQ(piece.box.rank(), shape.size()) << context;
    ASSERT_TRUE(Contains(Box::Full(shape), piece.box))
        << context << " piece " << BoxToString(piece.box);
    EXPECT_EQ(piece.strides, strides) << context;
    const int64_t flat_origin = FlatIndex(shape, piece.box.origin);
    EXPECT_EQ(piece.byte_offset, base + static_cast<uint64_t>(flat_origin - begin) * element_size)
        << context << " piece " << BoxToString(piece.box);
    ForEachIndex(piece.box, [&](const std::vector<int64_t>& index) {
      const int64_t flat = FlatIndex(shape, index);
      ++covered[flat];
      // The element's byte position through the piece's strides is its position in the range.
      int64_t offset = 0;
      for (size_t d = 0; d < index.size(); ++d) {
        offset += (index[d] - piece.box.origin[d]) * piece.strides[d];
      }
      EXPECT_EQ(piece.byte_offset + offset * element_size,
                base + static_cast<uint64_t>(flat - begin) * element_size)
          << context;
    });
  }
  for (int64_t i = 0; i < total; ++i) {
    const int want = (i >= begin && i < end) ? 1 : 0;
    if (covered[i] != want) {
      ADD_FAILURE() << context << ": flat element " << i << " covered " << covered[i]
                    << " times, expected " << want;
      return;
    }
  }
}

TEST(AddFlatRangePiecesTest, Examples) {
  CatalogTensor tensor{"w", DType::kF32, {4, 5}, {}};
  AddFlatRangePieces(tensor, 0, 0, 3, 17);
  // [0, 3:5], [1:3, 0:5], [3, 0:2]
  ASSERT_EQ(tensor.pieces.size(), 3u);
  EXPECT_EQ(tensor.pieces[0].box, (Box{{0, 3}, {1, 2}}));
  EXPECT_EQ(tensor.pieces[0].byte_offset, 0u);
  EXPECT_EQ(tensor.pieces[1].box, (Box{{1, 0}, {2, 5}}));
  EXPECT_EQ(tensor.pieces[1].byte_offset, 8u);
  EXPECT_EQ(tensor.pieces[2].box, (Box{{3, 0}, {1, 2}}));
  EXPECT_EQ(tensor.pieces[2].byte_offset, 48u);

  CatalogTensor whole{"w", DType::kBF16, {4, 5}, {}};
  AddFlatRangePieces(whole, 1, 64, 0, 20);
  ASSERT_EQ(whole.pieces.size(), 1u);
  EXPECT_EQ(whole.pieces[0].box, Box::Full({4, 5}));
  EXPECT_EQ(whole.pieces[0].byte_offset, 64u);

  CatalogTensor scalar{"s", DType::kF64, {}, {}};
  AddFlatRangePieces(scalar, 0, 16, 0, 1);
  ASSERT_EQ(scalar.pieces.size(), 1u);
  EXPECT_EQ(scalar.pieces[0].box.rank(), 0u);
  EXPECT_EQ(scalar.pieces[0].byte_offset, 16u);

  CatalogTensor empty_range{"e", DType::kF32, {4, 5}, {}};
  AddFlatRangePieces(empty_range, 0, 0, 7, 7);
  EXPECT_TRUE(empty_range.pieces.empty());
}

TEST(AddFlatRangePiecesTest, RandomShapesAndRangesTileExactly) {
  const uint32_t seed = 20240611;
  std::mt19937 rng(seed);
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kU8, DType::kF64};
  for (int iteration = 0; iteration < 3000; ++iteration) {
    const int rank = std::uniform_int_distribution<int>(0, 4)(rng);
    Shape shape;
    for (int d = 0; d < rank; ++d) {
      // Extent 1 is common on purpose; no zero extents.
      const int pick = std::uniform_int_distribution<int>(0, 3)(rng);
      shape.push_back(pick == 0 ? 1 : std::uniform_int_distribution<int>(1, 7)(rng));
    }
    const int64_t total = NumElementsUnchecked(shape);
    int64_t begin = std::uniform_int_distribution<int64_t>(0, total)(rng);
    int64_t end = std::uniform_int_distribution<int64_t>(0, total)(rng);
    if (begin > end) std::swap(begin, end);
    if (iteration % 10 == 0) {  // whole-tensor and prefix/suffix ranges too
      begin = iteration % 20 == 0 ? 0 : begin;
      end = total;
    }
    const DType dtype = dtypes[iteration % 4];
    const std::string context = "seed " + std::to_string(seed) + " iteration " +
                                std::to_string(iteration) + " shape " + ShapeToString(shape) +
                                " range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                ")";
    CheckFlatRange(shape, dtype, begin, end, context);
    if (HasFatalFailure() || HasNonfatalFailure()) return;
  }
}

TEST(AddFlatRangePiecesTest, AdjacentRangesTileTheWholeTensor) {
  const uint32_t seed = 77;
  std::mt19937 rng(seed);
  for (int iteration = 0; iteration < 300; ++iteration) {
    Shape shape;
    const int rank = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int d = 0; d < rank; ++d) shape.push_back(std::uniform_int_distribution<int>(1, 6)(rng));
    const int64_t total = NumElementsUnchecked(shape);
    // ZeRO-style: cut the flat tensor into ranges stored back to back.
    CatalogTensor tensor{"z", DType::kF32, shape, {}};
    int64_t position = 0;
    while (position < total) {
      const int64_t next =
          std::min(total, position + std::uniform_int_distribution<int64_t>(1, 9)(rng));
      AddFlatRangePieces(tensor, 0, static_cast<uint64_t>(position) * 4, position, next);
      position = next;
    }
    std::vector<int> covered(total, 0);
    for (const SourcePiece& piece : tensor.pieces) {
      ForEachIndex(piece.box, [&](const std::vector<int64_t>& index) {
        const int64_t flat = FlatIndex(shape, index);
        ++covered[flat];
        int64_t offset = 0;
        for (size_t d = 0; d < index.size(); ++d) {
          offset += (index[d] - piece.box.origin[d]) * piece.strides[d];
        }
        EXPECT_EQ(piece.byte_offset + offset * 4, static_cast<uint64_t>(flat) * 4)
            << "seed " << seed << " iteration " << iteration;
      });
    }
    for (int64_t i = 0; i < total; ++i) {
      ASSERT_EQ(covered[i], 1) << "seed " << seed << " iteration " << iteration << " shape "
                               << ShapeToString(shape) << " element " << i;
    }
  }
}

Catalog OneTensorCatalog(Shape shape, uint64_t file_size) {
  Catalog catalog;
  catalog.format = "test";
  catalog.files.push_back({"/ckpt/a.bin", file_size});
  CatalogTensor tensor{"layer.weight", DType::kF32, shape, {}};
  tensor.pieces.push_back({0, 8, Box::Full(shape), RowMajorStrides(shape)});
  catalog.tensors.push_back(tensor);
  catalog.Reindex();
  return catalog;
}

TEST(ValidateCatalogTest, AcceptsExactFit) {
  Catalog catalog = OneTensorCatalog({3, 4}, 8 + 48);
  EXPECT_TRUE(ValidateCatalog(catalog).ok()) << ValidateCatalog(catalog);
  EXPECT_EQ(catalog.Find("layer.weight"), 0);
  EXPECT_EQ(catalog.Find("nope"), -1);
  EXPECT_EQ(TensorBytes(catalog.tensors[0]), 48u);
}

TEST(ValidateCatalogTest, PiecePastEndOfFile) {
  Catalog catalog = OneTensorCatalog({3, 4}, 8 + 47);
  absl::Status status = ValidateCatalog(catalog);
  ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("layer.weight"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("/ckpt/a.bin"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("past the end"), absl::string_view::npos) << status;
}

TEST(ValidateCatalogTest, StridedPiecePastEndOfFile) {
  // A [3, 2] box with strides [4, 1] ends at element 2*4+1 = 9: 40 bytes from offset 8.
  Catalog catalog = OneTensorCatalog({3, 2}, 8 + 40);
  catalog.tensors[0].pieces[0].strides = {4, 1};
  EXPECT_TRUE(ValidateCatalog(catalog).ok()) << ValidateCatalog(catalog);
  catalog.files[0].size = 8 + 39;
  EXPECT_EQ(ValidateCatalog(catalog).code(), absl::StatusCode::kDataLoss);
}

TEST(ValidateCatalogTest, BoxOutsideShape) {
  Catalog catalog = OneTensorCatalog({3, 4}, 1 << 20);
  catalog.tensors[0].pieces[0].box = Box{{1, 0}, {3, 4}};
  absl::Status status = ValidateCatalog(catalog);
  ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("layer.weight"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("/ckpt/a.bin"), absl::string_view::npos) << status;
}

TEST(ValidateCatalogTest, RankMismatchAndNegativeStride) {
  Catalog catalog = OneTensorCatalog({3, 4}, 1 << 20);
  catalog.tensors[0].pieces[0].box = Box{{0}, {3}};
  EXPECT_EQ(ValidateCatalog(catalog).code(), absl::StatusCode::kDataLoss);
  catalog = OneTensorCatalog({3, 4}, 1 << 20);
  catalog.tensors[0].pieces[0].strides = {-4, 1};
  EXPECT_EQ(ValidateCatalog(catalog).code(), absl::StatusCode::kDataLoss);
  catalog = OneTensorCatalog({3, 4}, 1 << 20);
  catalog.tensors[0].pieces[0].file = 1;
  EXPECT_FALSE(ValidateCatalog(catalog).ok());
}

TEST(ValidateCatalogTest, HugeOffsetDoesNotWrap) {
  Catalog catalog = OneTensorCatalog({3, 4}, 1 << 20);
  catalog.tensors[0].pieces[0].byte_offset = UINT64_MAX - 8;
  EXPECT_EQ(ValidateCatalog(catalog).code(), absl::StatusCode::kDataLoss);
}

StructureNode Leaf(StructureNode::Kind kind) {
  StructureNode node;
  node.kind = kind;
  return node;
}

StructureNode Str(const std::string& text) {
  StructureNode node = Leaf(StructureNode::Kind::kString);
  node.text = text;
  return node;
}

StructureNode Global(const std::string& module, const std::string& name) {
  StructureNode node = Leaf(StructureNode::Kind::kGlobal);
  node.module = module;
  node.name = name;
  return node;
}

// Parses `json` and checks that it is written back the same.
void ExpectJsonRoundTrip(const std::string& json) {
  absl::StatusOr<StructureNode> node = StructureFromJson(json);
  ASSERT_TRUE(node.ok()) << node.status() << " parsing " << json;
  EXPECT_EQ(StructureToJson(*node), json);
}

TEST(StructureJson, ExistingKindsKeepTheirForm) {
  StructureNode dict = Leaf(StructureNode::Kind::kDict);
  dict.ordered = true;
  dict.keys.push_back(Str("w"));
  StructureNode tensor = Leaf(StructureNode::Kind::kTensor);
  tensor.text = "model.w";
  dict.values.push_back(tensor);
  dict.keys.push_back(Str("step"));
  StructureNode step = Leaf(StructureNode::Kind::kInt);
  step.integer = 10;
  dict.values.push_back(step);
  StructureNode list = Leaf(StructureNode::Kind::kList);
  list.items = {Leaf(StructureNode::Kind::kNone), Leaf(StructureNode::Kind::kBool)};
  StructureNode half = Leaf(StructureNode::Kind::kFloat);
  half.real = 0.5;
  list.items.push_back(half);
  dict.keys.push_back(Str("l"));
  dict.values.push_back(list);
  EXPECT_EQ(StructureToJson(dict),
            R"({"dict":[[{"str":"w"},{"tensor":"model.w"}],[{"str":"step"},{"int":10}],)"
            R"([{"str":"l"},{"list":[{"none":0},{"bool":false},{"float":0.5}]}]],"ordered":true})");
  ExpectJsonRoundTrip(StructureToJson(dict));
  ExpectJsonRoundTrip(R"({"tuple":[]})");
}

TEST(StructureJson, NonFiniteFloatsAreStrings) {
  StructureNode list = Leaf(StructureNode::Kind::kList);
  for (double value :
       {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN()}) {
    StructureNode real = Leaf(StructureNode::Kind::kFloat);
    real.real = value;
    list.items.push_back(real);
  }
  const std::string json = StructureToJson(list);
  EXPECT_EQ(json, R"({"list":[{"float":"inf"},{"float":"-inf"},{"float":"nan"}]})");
  absl::StatusOr<StructureNode> parsed = StructureFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(std::isinf(parsed->items[0].real) && parsed->items[0].real > 0);
  EXPECT_TRUE(std::isinf(parsed->items[1].real) && parsed->items[1].real < 0);
  EXPECT_TRUE(std::isnan(parsed->items[2].real));
  EXPECT_FALSE(StructureFromJson(R"({"float":"infinity"})").ok());
}

TEST(StructureJson, BytesBigIntsGlobalsAndObjects) {
  StructureNode bytes = Leaf(StructureNode::Kind::kBytes);
  bytes.text = std::string("\x00\xff\x10", 3);
  EXPECT_EQ(StructureToJson(bytes), R"({"bytes":"00ff10"})");
  StructureNode big = Leaf(StructureNode::Kind::kBigInt);
  big.text = std::string("\0\0\0\0\0\0\0\x80\0", 9);  // 2**63
  EXPECT_EQ(StructureToJson(big), R"({"bigint":"000000000000008000"})");
  EXPECT_EQ(StructureToJson(Global("torch", "float16")), R"({"global":["torch","float16"]})");

  // argparse.Namespace(params_dtype=torch.float16), as protocol 2 pickles it.
  StructureNode args = Leaf(StructureNode::Kind::kObject);
  args.module = "argparse";
  args.name = "Namespace";
  args.construction = StructureNode::Construction::kNewObj;
  StructureNode attributes = Leaf(StructureNode::Kind::kDict);
  attributes.keys.push_back(Str("params_dtype"));
  attributes.values.push_back(Global("torch", "float16"));
  args.state.push_back(attributes);
  EXPECT_EQ(StructureToJson(args),
            R"({"object":{"args":[],"callable":["argparse","Namespace"],"newobj":true,)"
            R"("state":{"dict":[[{"str":"params_dtype"},{"global":["torch","float16"]}]],)"
            R"("ordered":false}}})");

  for (const StructureNode& node : {bytes, big, Global("torch", "float16"), args}) {
    ExpectJsonRoundTrip(StructureToJson(node));
  }
  // An object with APPENDs and SETITEMs, and an OrderedDict with a BUILD state.
  ExpectJsonRoundTrip(
      R"({"object":{"args":[{"global":["builtins","int"]}],"callable":["collections",)"
      R"("defaultdict"],"dict":[[{"str":"a"},{"int":2}]],"items":[{"int":1}],"newobj":false}})");
  ExpectJsonRoundTrip(
      R"({"dict":[[{"str":"w"},{"tensor":"w"}]],"ordered":true,"state":{"dict":[[{"str":)"
      R"("_metadata"},{"none":0}]],"ordered":false}})");
}

TEST(StructureJson, MalformedNewKindsAreInvalidArgument) {
  for (const char* json : {
           R"({"bytes":"0"})",
           R"({"bytes":"zz"})",
           R"({"bigint":12})",
           R"({"global":["torch"]})",
           R"({"global":"torch.float16"})",
           R"({"object":{"callable":["argparse","Namespace"]}})",
           R"({"object":{"callable":"x","args":[]}})",
           R"({"object":{"callable":["a","b"],"args":[],"newobj":1}})",
           R"({"dict":[],"ordered":"yes"})",
       }) {
    absl::StatusOr<StructureNode> node = StructureFromJson(json);
    EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument) << json;
  }
  // Depth is bounded through objects too.
  std::string deep = R"({"none":0})";
  for (int i = 0; i < 70; ++i) {
    deep = absl::StrCat(R"({"object":{"callable":["a","b"],"args":[)", deep, "]}}");
  }
  EXPECT_EQ(StructureFromJson(deep).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard
