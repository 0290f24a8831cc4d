// PickleToStructure on pickles made by real Python (/usr/bin/python3 with torch), and the round
// trip a resuming checkpoint needs: pickle -> StructureNode -> torch writer -> torch.load gives
// an object equal to the original (vars() compared for Namespace and user classes).

#include "lib/formats/torch/pickle_structure.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lib/core/catalog.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/formats/torch/torch_file.h"
#include "lib/formats/torch/torch_output.h"
#include "lib/io/crc32.h"
#include "lib/plan/layout.h"
#include "lib/testing/test_files.h"

namespace reshard {
namespace {

using Kind = StructureNode::Kind;

// A stand-in for DeepSpeed's module, imported from the temporary folder on PYTHONPATH.
constexpr char kLossScalerPy[] = R"py(
import enum


class ScalerMode(enum.Enum):
    STATIC = 1
    DYNAMIC = 2


class DynamicLossScaler:
    def __init__(self, init_scale=2**16, scale_factor=2.0, scale_window=1000):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = 1
        self.delayed_shift = 1
        self.cur_hysteresis = 1
        self.consecutive_hysteresis = False
        self.raise_error_at_min_scale = True
        self.dtype = None
        self.mode = ScalerMode.DYNAMIC
)py";

// The objects of the test (make()), and how two of them are compared (same()).
constexpr char kObjectsPy[] = R"py(
import argparse
import collections
import enum
import math

import torch
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, ScalerMode


def make():
    args = argparse.Namespace(params_dtype=torch.float16, lr=1e-4, micro_batch_size=4,
                              fp16=True, bf16=False, load=None, rampup=[32, 32, 1000],
                              betas=(0.9, 0.95), name="gpt", seed=2**100)
    metadata_sd = collections.OrderedDict([("w", 1), ("b", 2)])
    metadata_sd._metadata = collections.OrderedDict([("", {"version": 1})])
    counts = collections.defaultdict(int)
    counts["a"] += 2
    shared = [1, 2]
    scaler = DynamicLossScaler(init_scale=4096)
    scaler.dtype = torch.bfloat16
    return {
        "args": args,
        "ordered": collections.OrderedDict([("z", 1), ("a", 2), ("m", 3)]),
        "betas": (0.9, 0.999),
        "empty_tuple": (),
        "one_tuple": ("x",),
        "nested": [[1, [2, [3, []]]], [], [None]],
        "none": None,
        "flags": [True, False],
        "floats": [0.5, -0.0, float("inf"), float("-inf"), float("nan"), 1e308],
        "ints": [0, -1, 255, 65535, 2**31 - 1, -(2**31), 2**62, -(2**63)],
        "big": [2**63, 2**100, -(2**70), 2**2100],
        "bytes": b"\x00\x01\x7f\x80\xff reshard",
        "empty_bytes": b"",
        "keys": {1: "int", (1, 2): "tuple", None: "none", 2.5: "float"},
        "scaler": scaler,
        "mode": ScalerMode.STATIC,
        "size": torch.Size([2, 3]),
        "dtypes": [torch.float32, torch.int8, torch.bool],
        "set": {3, 4},
        "counts": counts,
        "state_dict": metadata_sd,
        "shared": {"a": shared, "b": shared},
        "unicode": "\u00e9\u4e2d\U0001f600",
    }


def same(a, b, path="root"):
    if type(a) is not type(b):
        raise AssertionError("%s: %r is not %r" % (path, type(a), type(b)))
    if isinstance(a, float):
        if not (a == b and math.copysign(1, a) == math.copysign(1, b)) and not (
                math.isnan(a) and math.isnan(b)):
            raise AssertionError("%s: %r != %r" % (path, a, b))
    elif isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or not torch.equal(a, b):
            raise AssertionError("%s: tensors differ" % path)
    elif isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            raise AssertionError("%s: keys %r != %r" % (path, list(a), list(b)))
        for k in a:
            same(a[k], b[k], "%s.%s" % (path, k))
        if isinstance(a, collections.defaultdict) and a.default_factory is not b.default_factory:
            raise AssertionError("%s: default_factory differs" % path)
        if hasattr(a, "__dict__"):
            same(vars(a), vars(b), path + ".__dict__")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError("%s: %d items != %d" % (path, len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s.%d" % (path, i))
    elif isinstance(a, enum.Enum):
        if a is not b:
            raise AssertionError("%s: %r is not %r" % (path, a, b))
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        same(vars(a), vars(b), path + ".__dict__")
    elif a != b:
        raise AssertionError("%s: %r != %r" % (path, a, b))
)py";

// make.py OUT PROTOCOL: pickles make() (protocol 2 is what torch.save uses).
// make.py OUT torch: torch.save of make() with a model state dict beside it.
constexpr char kMakePy[] = R"py(
import collections
import pickle
import sys

import torch
import objects

value = objects.make()
if sys.argv[2] == "torch":
    value["model"] = collections.OrderedDict(
        [("w", torch.arange(6, dtype=torch.float32).reshape(2, 3))])
    torch.save(value, sys.argv[1])
else:
    with open(sys.argv[1], "wb") as f:
        f.write(pickle.dumps(value, protocol=int(sys.argv[2])))
)py";

// check.py FILE [torch]: torch.load(FILE) must equal make() (and the model tensor).
constexpr char kCheckPy[] = R"py(
import collections
import sys

import torch
import objects

expected = objects.make()
if len(sys.argv) > 2:
    expected["model"] = collections.OrderedDict(
        [("w", torch.arange(6, dtype=torch.float32).reshape(2, 3))])
loaded = torch.load(sys.argv[1], weights_only=False)
objects.same(expected, loaded)
print("equal")
)py";

class PickleStructureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("pickle_structure");
    for (const char* package : {"deepspeed", "deepspeed/runtime", "deepspeed/runtime/fp16"}) {
      std::filesystem::create_directories(absl::StrCat(dir_, "/", package));
      WriteAll(absl::StrCat(dir_, "/", package, "/__init__.py"), "");
    }
    WriteAll(dir_ + "/deepspeed/runtime/fp16/loss_scaler.py", kLossScalerPy);
    WriteAll(dir_ + "/objects.py", kObjectsPy);
    WriteAll(dir_ + "/make.py", kMakePy);
    WriteAll(dir_ + "/check.py", kCheckPy);
  }

  // Runs dir_/`script` with Debian's python3 (which has torch) and `args`; true on exit 0.
  bool Python(const std::string& script, const std::string& args) {
    const std::string command =
        absl::StrCat("cd ", dir_, " && PYTHONPATH=", dir_,
                     " PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 ", script, " ", args);
    return std::system(command.c_str()) == 0;
  }

  // The pickle of make() in `protocol`.
  std::string MakePickle(int protocol) {
    const std::string path = absl::StrCat(dir_, "/objects_", protocol, ".pkl");
    EXPECT_TRUE(Python("make.py", absl::StrCat(path, " ", protocol)));
    return ReadAll(path);
  }

  // Writes `structure` (with `tensors` and their bytes) as a torch.save file through
  // TorchOutput, as the Executor would, and returns its path.
  std::string WriteTorchFile(const std::string& name, StructureNode structure,
                             const std::vector<OutputTensor>& tensors = {},
                             const std::vector<std::string>& tensor_bytes = {}) {
    OutputFileLayout layout;
    layout.name = name;
    layout.tensors = tensors;
    layout.structure = std::make_shared<const StructureNode>(std::move(structure));
    absl::StatusOr<FileFraming> framing = TorchOutput().Frame(layout);
    EXPECT_TRUE(framing.ok()) << framing.status();
    if (!framing.ok()) return "";
    TensorChecksums crcs;
    for (const std::string& bytes : tensor_bytes) {
      crcs.push_back(Crc32(0, bytes.data(), bytes.size()));
    }
    std::string file;
    for (const FramingSegment& segment : framing->segments) {
      switch (segment.kind) {
        case FramingSegment::Kind::kBytes:
          file += segment.bytes;
          break;
        case FramingSegment::Kind::kTensor:
          file += tensor_bytes.at(segment.tensor);
          break;
        case FramingSegment::Kind::kDeferred:
          file += framing->deferred(segment.deferred, crcs);
          break;
      }
    }
    const std::string path = absl::StrCat(dir_, "/", name);
    WriteAll(path, file);
    return path;
  }

  std::string dir_;
};

absl::StatusOr<StructureNode> Convert(const std::string& pickle, PickleArena& arena,
                                      const PickleStructureOptions& options = {}) {
  absl::StatusOr<PickleValue*> value = ParsePickle(pickle, arena, nullptr);
  if (!value.ok()) return value.status();
  return PickleToStructure(*value, options);
}

// The value of `key` (a str) in a kDict or kObject node; fails the test when absent.
const StructureNode& At(const StructureNode& node, const std::string& key) {
  for (size_t i = 0; i < node.keys.size(); ++i) {
    if (node.keys[i].kind == Kind::kString && node.keys[i].text == key) return node.values[i];
  }
  ADD_FAILURE() << "no key " << key;
  static const StructureNode* const kNone = new StructureNode();
  return *kNone;
}

std::vector<std::string> KeyTexts(const StructureNode& node) {
  std::vector<std::string> texts;
  for (const StructureNode& key : node.keys) texts.push_back(StructureToJson(key));
  return texts;
}

TEST_F(PickleStructureTest, ConvertsEveryKindOfValueFaithfully) {
  PickleArena arena;
  absl::StatusOr<StructureNode> root = Convert(MakePickle(2), arena);
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_EQ(root->kind, Kind::kDict);
  EXPECT_FALSE(root->ordered);
  ASSERT_GE(root->keys.size(), 3u);
  EXPECT_EQ(root->keys[0].text, "args");  // insertion order kept
  EXPECT_EQ(root->keys[1].text, "ordered");

  // argparse.Namespace: NEWOBJ of the class without arguments, attributes by BUILD.
  const StructureNode& args = At(*root, "args");
  ASSERT_EQ(args.kind, Kind::kObject);
  EXPECT_EQ(args.module, "argparse");
  EXPECT_EQ(args.name, "Namespace");
  EXPECT_EQ(args.construction, StructureNode::Construction::kNewObj);
  EXPECT_TRUE(args.args.empty());
  ASSERT_EQ(args.state.size(), 1u);
  const StructureNode& dtype = At(args.state[0], "params_dtype");
  EXPECT_EQ(dtype.kind, Kind::kGlobal);
  EXPECT_EQ(dtype.module, "torch");
  EXPECT_EQ(dtype.name, "float16");
  EXPECT_EQ(At(args.state[0], "betas").kind, Kind::kTuple);
  EXPECT_EQ(At(args.state[0], "seed").kind, Kind::kBigInt);

  const StructureNode& ordered = At(*root, "ordered");
  EXPECT_EQ(ordered.kind, Kind::kDict);
  EXPECT_TRUE(ordered.ordered);
  EXPECT_EQ(KeyTexts(ordered),
            (std::vector<std::string>{R"({"str":"z"})", R"({"str":"a"})", R"({"str":"m"})"}));

  EXPECT_EQ(StructureToJson(At(*root, "betas")), R"({"tuple":[{"float":0.9},{"float":0.999}]})");
  EXPECT_EQ(StructureToJson(At(*root, "empty_tuple")), R"({"tuple":[]})");
  EXPECT_EQ(
      StructureToJson(At(*root, "nested")),
      R"({"list":[{"list":[{"int":1},{"list":[{"int":2},{"list":[{"int":3},{"list":[]}]}]}]},)"
      R"({"list":[]},{"list":[{"none":0}]}]})");
  EXPECT_EQ(At(*root, "none").kind, Kind::kNone);
  EXPECT_EQ(StructureToJson(At(*root, "flags")), R"({"list":[{"bool":true},{"bool":false}]})");

  const StructureNode& floats = At(*root, "floats");
  ASSERT_EQ(floats.items.size(), 6u);
  EXPECT_TRUE(std::signbit(floats.items[1].real));
  EXPECT_TRUE(std::isinf(floats.items[2].real) && floats.items[2].real > 0);
  EXPECT_TRUE(std::isinf(floats.items[3].real) && floats.items[3].real < 0);
  EXPECT_TRUE(std::isnan(floats.items[4].real));

  const StructureNode& ints = At(*root, "ints");
  ASSERT_EQ(ints.items.size(), 8u);
  EXPECT_EQ(ints.items[7].kind, Kind::kInt);
  EXPECT_EQ(ints.items[7].integer, INT64_MIN);
  const StructureNode& big = At(*root, "big");
  ASSERT_EQ(big.items.size(), 4u);
  EXPECT_EQ(big.items[0].kind, Kind::kBigInt);
  EXPECT_EQ(big.items[0].text, std::string("\0\0\0\0\0\0\0\x80\0", 9));  // 2**63
  EXPECT_EQ(big.items[3].kind, Kind::kBigInt);

  EXPECT_EQ(At(*root, "bytes").kind, Kind::kBytes);
  EXPECT_EQ(At(*root, "bytes").text, std::string("\x00\x01\x7f\x80\xff reshard", 13));
  EXPECT_EQ(At(*root, "empty_bytes").kind, Kind::kBytes);
  EXPECT_EQ(At(*root, "empty_bytes").text, "");

  // Keys of any kind stay what they were.
  EXPECT_EQ(KeyTexts(At(*root, "keys")),
            (std::vector<std::string>{R"({"int":1})", R"({"tuple":[{"int":1},{"int":2}]})",
                                      R"({"none":0})", R"({"float":2.5})"}));

  const StructureNode& scaler = At(*root, "scaler");
  EXPECT_EQ(scaler.kind, Kind::kObject);
  EXPECT_EQ(scaler.module, "deepspeed.runtime.fp16.loss_scaler");
  EXPECT_EQ(scaler.name, "DynamicLossScaler");
  EXPECT_EQ(scaler.construction, StructureNode::Construction::kNewObj);
  ASSERT_EQ(scaler.state.size(), 1u);
  EXPECT_EQ(At(scaler.state[0], "cur_scale").integer, 4096);
  // An enum member, as Python 3.11 pickles it: getattr(ScalerMode, "DYNAMIC").
  const StructureNode& mode = At(scaler.state[0], "mode");
  EXPECT_EQ(mode.kind, Kind::kObject);
  EXPECT_EQ(mode.construction, StructureNode::Construction::kReduce);
  EXPECT_EQ(StructureToJson(mode),
            R"({"object":{"args":[{"global":["deepspeed.runtime.fp16.loss_scaler","ScalerMode"]},)"
            R"({"str":"DYNAMIC"}],"callable":["builtins","getattr"],"newobj":false}})");

  EXPECT_EQ(StructureToJson(At(*root, "size")),
            R"({"object":{"args":[{"tuple":[{"int":2},{"int":3}]}],"callable":["torch","Size"],)"
            R"("newobj":false}})");
  EXPECT_EQ(StructureToJson(At(*root, "set")),
            R"({"object":{"args":[{"list":[{"int":3},{"int":4}]}],"callable":["builtins","set"],)"
            R"("newobj":false}})");

  // defaultdict(int): the factory as argument (pickled as __builtin__.long), the entries as
  // SETITEMs.
  EXPECT_EQ(StructureToJson(At(*root, "counts")),
            R"({"object":{"args":[{"global":["builtins","int"]}],)"
            R"("callable":["collections","defaultdict"],"dict":[[{"str":"a"},{"int":2}]],)"
            R"("newobj":false}})");

  // A state dict's _metadata is the OrderedDict's BUILD state.
  const StructureNode& state_dict = At(*root, "state_dict");
  EXPECT_EQ(state_dict.kind, Kind::kDict);
  EXPECT_TRUE(state_dict.ordered);
  ASSERT_EQ(state_dict.state.size(), 1u);
  EXPECT_EQ(At(state_dict.state[0], "_metadata").kind, Kind::kDict);

  // Shared through the memo: each reference converted on its own.
  EXPECT_EQ(StructureToJson(At(At(*root, "shared"), "b")), R"({"list":[{"int":1},{"int":2}]})");
}

TEST_F(PickleStructureTest, ProtocolsTwoAndFourGiveTheSameStructure) {
  PickleArena arena2, arena4;
  absl::StatusOr<StructureNode> two = Convert(MakePickle(2), arena2);
  absl::StatusOr<StructureNode> four = Convert(MakePickle(4), arena4);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(StructureToJson(*two), StructureToJson(*four));
}

TEST_F(PickleStructureTest, JsonRoundTripKeepsEverything) {
  PickleArena arena;
  absl::StatusOr<StructureNode> root = Convert(MakePickle(2), arena);
  ASSERT_TRUE(root.ok()) << root.status();
  const std::string json = StructureToJson(*root);
  absl::StatusOr<StructureNode> parsed = StructureFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(StructureToJson(*parsed), json);
}

TEST_F(PickleStructureTest, TorchWriterReproducesTheObjectsForTorchLoad) {
  for (int protocol : {2, 4}) {
    SCOPED_TRACE(protocol);
    PickleArena arena;
    absl::StatusOr<StructureNode> root = Convert(MakePickle(protocol), arena);
    ASSERT_TRUE(root.ok()) << root.status();
    // Through JSON too, as a structure carried in safetensors metadata would come back.
    absl::StatusOr<StructureNode> parsed = StructureFromJson(StructureToJson(*root));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    const std::string path = WriteTorchFile(absl::StrCat("objects_", protocol, ".pt"), *parsed);
    EXPECT_TRUE(Python("check.py", path));
  }
}

TEST_F(PickleStructureTest, CallbackCarriesTensorsOfATorchSaveFile) {
  const std::string input = dir_ + "/input.pt";
  ASSERT_TRUE(Python("make.py", input + " torch"));
  const std::string bytes = ReadAll(input);
  absl::StatusOr<std::unique_ptr<TorchArchive>> archive = TorchArchive::Parse(bytes, input);
  ASSERT_TRUE(archive.ok()) << archive.status();

  // Without a callback the tensor is refused, by its path.
  absl::StatusOr<StructureNode> refused = PickleToStructure((*archive)->root());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StartsWith(refused.status().message(), "model.w: a tensor"))
      << refused.status();

  PickleStructureOptions options;
  std::vector<std::string> tensors;
  options.replace = [&](const PickleValue* value,
                        absl::string_view path) -> absl::StatusOr<std::optional<StructureNode>> {
    if (!TorchArchive::IsTensor(value)) return std::nullopt;
    StructureNode leaf;
    leaf.kind = Kind::kTensor;
    leaf.text = std::string(path);
    tensors.push_back(leaf.text);
    return leaf;
  };
  absl::StatusOr<StructureNode> root = PickleToStructure((*archive)->root(), options);
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_EQ(tensors, std::vector<std::string>{"model.w"});

  OutputTensor w;
  w.name = "model.w";
  w.region = Box{{0, 0}, {2, 3}};
  w.dtype = DType::kF32;
  std::string data;
  for (int i = 0; i < 6; ++i) {
    const float f = static_cast<float>(i);
    data.append(reinterpret_cast<const char*>(&f), sizeof(f));
  }
  const std::string path = WriteTorchFile("with_tensor.pt", *root, {w}, {data});
  EXPECT_TRUE(Python("check.py", path + " torch"));
}

TEST(PickleToStructure, ErrorsNameThePath) {
  // {"args": {"foo": [[[1]]]}} with a depth limit of 3.
  PickleWriter writer;
  writer.BeginDict(false);
  writer.String("args");
  writer.BeginDict(true);
  writer.String("foo");
  writer.BeginList();
  writer.BeginList();
  writer.BeginList();
  writer.Int(1);
  writer.EndList();
  writer.EndList();
  writer.EndList();
  writer.EndDict();
  writer.EndDict();
  const std::string pickle = writer.Finish();

  PickleArena arena;
  PickleStructureOptions options;
  options.max_depth = 3;
  absl::StatusOr<StructureNode> deep = Convert(pickle, arena, options);
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(deep.status().message(), "args.foo.0.0: values nest deeper"))
      << deep.status();

  options = {};
  options.max_nodes = 4;
  absl::StatusOr<StructureNode> many = Convert(pickle, arena, options);
  EXPECT_TRUE(absl::StrContains(many.status().message(), "more than 4 values")) << many.status();

  options = {};
  options.replace = [](const PickleValue* value,
                       absl::string_view path) -> absl::StatusOr<std::optional<StructureNode>> {
    if (value->kind == PickleValue::Kind::kInt) return absl::InvalidArgumentError("no ints");
    return std::nullopt;
  };
  absl::StatusOr<StructureNode> refused = Convert(pickle, arena, options);
  EXPECT_EQ(refused.status().message(), "args.foo.0.0.0: no ints");

  // A callback's node stands for the value: here the list is dropped to None.
  options.replace = [](const PickleValue* value,
                       absl::string_view path) -> absl::StatusOr<std::optional<StructureNode>> {
    if (path == "args.foo") return StructureNode();
    return std::nullopt;
  };
  absl::StatusOr<StructureNode> dropped = Convert(pickle, arena, options);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(StructureToJson(*dropped),
            R"({"dict":[[{"str":"args"},{"dict":[[{"str":"foo"},{"none":0}]],"ordered":true}]],)"
            R"("ordered":false})");
}

TEST(PickleToStructure, PersistentIdsNeedTheCallback) {
  PickleWriter writer;
  writer.Tensor("FloatStorage", "0", 2, {2}, {1});
  const std::string pickle = writer.Finish();
  PickleArena arena;
  absl::StatusOr<PickleValue*> value =
      ParsePickle(pickle, arena, [](PickleValue*, PickleArena& a) -> absl::StatusOr<PickleValue*> {
        return a.New(PickleValue::Kind::kPersistent);
      });
  ASSERT_TRUE(value.ok()) << value.status();
  absl::StatusOr<StructureNode> tensor = PickleToStructure(*value);
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(absl::StartsWith(tensor.status().message(),
                               "(root): a tensor (torch._utils._rebuild_tensor_v2)"))
      << tensor.status();
  // The storage id on its own.
  absl::StatusOr<StructureNode> storage = PickleToStructure((*value)->args->items[0]);
  EXPECT_TRUE(absl::StartsWith(storage.status().message(), "(root): a persistent id"))
      << storage.status();
}

}  // namespace
}  // namespace reshard
