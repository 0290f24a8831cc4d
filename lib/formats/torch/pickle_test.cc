// Tests of the safe pickle reader on hand-written opcode streams: the values protocol 2 (as
// torch.save writes it) and protocol 4 produce, then hostile streams that must fail cleanly,
// fast and without allocating what they declare, and globals that would run code in Python.

#include "lib/formats/torch/pickle.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "lib/testing/test_files.h"

// The largest single allocation since the last reset: hostile lengths must not be allocated.
namespace {
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

void* operator new(size_t size) {
  size_t seen = g_largest_allocation.load(std::memory_order_relaxed);
  while (size > seen && !g_largest_allocation.compare_exchange_weak(seen, size)) {
  }
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace reshard {
namespace {

using Kind = PickleValue::Kind;

// ---- opcode builders
std::string U32(uint64_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}
std::string U64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}
std::string B(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}
const std::string kProto2 = B({0x80, 0x02});
const std::string kProto4 = B({0x80, 0x04});
std::string Str(const std::string& s) { return "X" + U32(s.size()) + s; }            // BINUNICODE
std::string ShortStr(const std::string& s) { return B({0x8c, int(s.size())}) + s; }  // proto 4
std::string Int1(int v) { return B({'K', v}); }
std::string Global(const std::string& module, const std::string& name) {
  return "c" + module + "\n" + name + "\n";
}
std::string Put(int i) { return B({'q', i}); }
std::string Get(int i) { return B({'h', i}); }

struct Parsed {
  PickleArena arena;
  absl::StatusOr<PickleValue*> result = absl::UnknownError("not run");
};

std::unique_ptr<Parsed> RunPickle(const std::string& data, const PersistentLoad& load = nullptr,
                                  const PickleLimits& limits = {}) {
  auto parsed = std::make_unique<Parsed>();
  parsed->result = ParsePickle(data, parsed->arena, load, limits);
  return parsed;
}

// A DataLoss whose message names `what`.
void ExpectError(const std::unique_ptr<Parsed>& parsed, const std::string& what) {
  ASSERT_FALSE(parsed->result.ok()) << "accepted; wanted an error with: " << what;
  const std::string message(parsed->result.status().message());
  EXPECT_NE(message.find(what), std::string::npos) << "want \"" << what << "\" in: " << message;
  EXPECT_NE(message.find("byte offset"), std::string::npos) << message;
}

const PickleValue* DictGet(const PickleValue* dict, const std::string& key) {
  for (const auto& [k, v] : dict->entries) {
    if (k->kind == Kind::kString && k->text == key) return v;
  }
  return nullptr;
}

// ------------------------------------------------------------------------------------------
// Well-formed streams

TEST(PickleTest, Protocol2DictListTuple) {
  // {"a": 1, "b": [2, 3], "c": (None, True, False), "d": -7, "e": 1000, "f": 70000}
  const std::string data = kProto2 + "}" + Put(0) + "(" + Str("a") + Int1(1) + Str("b") + "]" +
                           Put(1) + "(" + Int1(2) + Int1(3) + "e" + Str("c") + "N" +
                           B({0x88, 0x89, 0x87}) + Str("d") + "J" + U32(static_cast<uint32_t>(-7)) +
                           Str("e") + B({'M', 0xE8, 0x03}) + Str("f") + "J" + U32(70000) + "u.";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  const PickleValue* root = *p->result;
  ASSERT_EQ(root->kind, Kind::kDict);
  ASSERT_EQ(root->entries.size(), 6u);
  EXPECT_EQ(root->entries[0].first->text, "a");  // insertion order kept
  EXPECT_EQ(DictGet(root, "a")->integer, 1);
  const PickleValue* list = DictGet(root, "b");
  ASSERT_EQ(list->kind, Kind::kList);
  ASSERT_EQ(list->items.size(), 2u);
  EXPECT_EQ(list->items[1]->integer, 3);
  const PickleValue* tuple = DictGet(root, "c");
  ASSERT_EQ(tuple->kind, Kind::kTuple);
  ASSERT_EQ(tuple->items.size(), 3u);
  EXPECT_EQ(tuple->items[0]->kind, Kind::kNone);
  EXPECT_EQ(tuple->items[1]->kind, Kind::kBool);
  EXPECT_TRUE(tuple->items[1]->boolean);
  EXPECT_FALSE(tuple->items[2]->boolean);
  EXPECT_EQ(DictGet(root, "d")->integer, -7);
  EXPECT_EQ(DictGet(root, "e")->integer, 1000);
  EXPECT_EQ(DictGet(root, "f")->integer, 70000);
  EXPECT_EQ(DescribePickleValue(tuple), "tuple of 3");
  EXPECT_GE(root->depth, 3);
}

TEST(PickleTest, MarkTupleAndTuple1To3AndEmptyTuple) {
  // (((1,2,3,4), (5,), (6,7), ()),): MARK ... TUPLE, TUPLE1, TUPLE2, EMPTY_TUPLE, TUPLE, TUPLE1.
  const std::string data = kProto2 + "(" + "(" + Int1(1) + Int1(2) + Int1(3) + Int1(4) + "t" +
                           Int1(5) + B({0x85}) + Int1(6) + Int1(7) + B({0x86}) + ")" + "t" +
                           B({0x85}) + ".";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  const PickleValue* root = *p->result;
  ASSERT_EQ(root->kind, Kind::kTuple);
  ASSERT_EQ(root->items.size(), 1u);
  const PickleValue* inner = root->items[0];
  ASSERT_EQ(inner->items.size(), 4u);
  EXPECT_EQ(inner->items[0]->items.size(), 4u);
  EXPECT_EQ(inner->items[0]->items[3]->integer, 4);
  EXPECT_EQ(inner->items[1]->items[0]->integer, 5);
  EXPECT_EQ(inner->items[2]->items[1]->integer, 7);
  EXPECT_TRUE(inner->items[3]->items.empty());
  EXPECT_EQ(root->depth, 4);  // root, inner, (1,2,3,4), 1
}

TEST(PickleTest, OrderedDictAsTorchWritesIt) {
  // collections.OrderedDict() then SETITEMS, with Python 2 module names elsewhere.
  const std::string data = kProto2 + Global("collections", "OrderedDict") + Put(0) + ")" + "R" +
                           Put(1) + "(" + Str("w") + Int1(1) + Str("v") + Int1(2) + "u.";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  ASSERT_EQ((*p->result)->kind, Kind::kDict);
  ASSERT_EQ((*p->result)->entries.size(), 2u);
  EXPECT_EQ((*p->result)->entries[1].first->text, "v");
}

TEST(PickleTest, SetAndFrozensetProtocol2) {
  // pickle.dumps({1, 2}, protocol=2) and frozenset([1]).
  const std::string set = kProto2 + Global("__builtin__", "set") + Put(0) + "]" + Put(1) + "(" +
                          Int1(1) + Int1(2) + "e" + B({0x85}) + Put(2) + "R" + Put(3) + ".";
  auto p = RunPickle(set);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  ASSERT_EQ((*p->result)->kind, Kind::kSet);
  EXPECT_EQ((*p->result)->items.size(), 2u);
  const std::string frozen = kProto2 + Global("__builtin__", "frozenset") + Put(0) + "]" + Put(1) +
                             Int1(1) + "a" + B({0x85}) + Put(2) + "R" + Put(3) + ".";
  auto f = RunPickle(frozen);
  ASSERT_TRUE(f->result.ok()) << f->result.status();
  ASSERT_EQ((*f->result)->kind, Kind::kSet);
  EXPECT_EQ((*f->result)->items.size(), 1u);
  // Protocol 4 EMPTY_SET + ADDITEMS, FROZENSET.
  auto s4 = RunPickle(kProto4 + B({0x8f}) + "(" + Int1(9) + B({0x90}) + "(" + Int1(1) + B({0x91}) +
                      B({0x86}) + ".");
  ASSERT_TRUE(s4->result.ok()) << s4->result.status();
  EXPECT_EQ((*s4->result)->items[0]->kind, Kind::kSet);
  EXPECT_EQ((*s4->result)->items[0]->items.size(), 1u);
  EXPECT_EQ((*s4->result)->items[1]->kind, Kind::kSet);
}

TEST(PickleTest, BytesThroughCodecsEncode) {
  // pickle.dumps(b"\x00\xff", protocol=2): _codecs.encode("\x00\xff" as UTF-8, "latin1").
  const std::string data = kProto2 + Global("_codecs", "encode") + Put(0) + "X" + U32(3) +
                           B({0x00, 0xC3, 0xBF}) + Put(1) + Str("latin1") + Put(2) + B({0x86}) +
                           Put(3) + "R" + Put(4) + ".";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  ASSERT_EQ((*p->result)->kind, Kind::kBytes);
  EXPECT_EQ((*p->result)->text, std::string("\x00\xff", 2));
  // Protocol 3+ bytes opcodes.
  auto b = RunPickle(kProto4 + "C" + B({2, 'h', 'i'}) + "B" + U32(1) + "x" + B({0x8e}) + U64(0) +
                     B({0x87}) + ".");
  ASSERT_TRUE(b->result.ok()) << b->result.status();
  EXPECT_EQ((*b->result)->items[0]->kind, Kind::kBytes);
  EXPECT_EQ((*b->result)->items[0]->text, "hi");
  EXPECT_EQ((*b->result)->items[1]->text, "x");
  EXPECT_EQ((*b->result)->items[2]->text, "");
}

TEST(PickleTest, EmptyBytesProtocol2) {
  // pickle.dumps(b"", protocol=2) is __builtin__.bytes(): data, not an object to interpret.
  auto p = RunPickle(kProto2 + Global("__builtin__", "bytes") + Put(0) + ")R" + Put(1) + ".");
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  EXPECT_EQ((*p->result)->kind, Kind::kBytes) << DescribePickleValue(*p->result);
  EXPECT_EQ((*p->result)->text, "");
}

TEST(PickleTest, Long1NegativeAndWide) {
  const std::string data = kProto2 + "(" + B({0x8a, 0x01, 0xFF}) +          // -1
                           B({0x8a, 0x02, 0x00, 0x80}) +                    // -32768
                           B({0x8a, 0x02, 0xFF, 0x7F}) +                    // 32767
                           B({0x8a, 0x00}) +                                // 0
                           B({0x8a, 0x05, 0x00, 0x00, 0x00, 0x00, 0x80}) +  // -2^39
                           B({0x8a, 0x08, 0, 0, 0, 0, 0, 0, 0, 0x80}) +     // INT64_MIN
                           B({0x8a, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F}) +
                           B({0x8a, 0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x01}) +           // 2^64
                           B({0x8b}) + U32(9) + B({1, 0, 0, 0, 0, 0, 0, 0, 0x80}) +  // LONG4
                           "t.";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  const auto& items = (*p->result)->items;
  ASSERT_EQ(items.size(), 9u);
  EXPECT_EQ(items[0]->integer, -1);
  EXPECT_EQ(items[1]->integer, -32768);
  EXPECT_EQ(items[2]->integer, 32767);
  EXPECT_EQ(items[3]->integer, 0);
  EXPECT_EQ(items[4]->integer, -(int64_t{1} << 39));
  EXPECT_EQ(items[5]->integer, INT64_MIN);
  EXPECT_EQ(items[6]->integer, INT64_MAX);
  EXPECT_EQ(items[7]->kind, Kind::kBigInt);
  EXPECT_EQ(items[7]->text, B({0, 0, 0, 0, 0, 0, 0, 0, 0x01}));
  EXPECT_EQ(items[8]->kind, Kind::kBigInt);
  EXPECT_EQ(items[8]->text.size(), 9u);
  EXPECT_EQ(DescribePickleValue(items[7]), "int");
}

TEST(PickleTest, BinFloatIsBigEndian) {
  auto p = RunPickle(kProto2 + "G" + B({0x3F, 0xF8, 0, 0, 0, 0, 0, 0}) + "G" +
                     B({0xC0, 0x09, 0x21, 0xFB, 0x54, 0x44, 0x2D, 0x18}) + B({0x86}) + ".");
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  EXPECT_EQ((*p->result)->items[0]->kind, Kind::kFloat);
  EXPECT_EQ((*p->result)->items[0]->real, 1.5);
  EXPECT_EQ((*p->result)->items[1]->real, -3.141592653589793);
}

TEST(PickleTest, MemoBinputLongBinputMemoizeBinget) {
  // A list stored under BINPUT 1, a string under LONG_BINPUT 70000, a tuple under MEMOIZE;
  // each recalled once: the same value object comes back.
  const std::string data = kProto2 + "(" + "]" + Put(1) + Str("s") + "r" + U32(70000) + ")" +
                           B({0x94}) + Get(1) + "j" + U32(70000) + Get(2) + "t.";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  const auto& items = (*p->result)->items;
  ASSERT_EQ(items.size(), 6u);
  EXPECT_EQ(items[0], items[3]);
  EXPECT_EQ(items[1], items[4]);
  EXPECT_EQ(items[4]->text, "s");
  // MEMOIZE uses the memo's size as index: two entries (1 and 70000) before it -> index 2.
  EXPECT_EQ(items[5]->kind, Kind::kTuple) << DescribePickleValue(items[5]);
  EXPECT_EQ(items[5], items[2]);
}

TEST(PickleTest, MemoizeCountsEntries) {
  // Protocol 4 uses MEMOIZE only: indices 0, 1, 2 in order.
  const std::string data = kProto4 + "(" + ShortStr("a") + B({0x94}) + ShortStr("b") + B({0x94}) +
                           B({'h', 0, 'h', 1}) + "t.";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  const auto& items = (*p->result)->items;
  ASSERT_EQ(items.size(), 4u);
  EXPECT_EQ(items[0]->text, "a");
  EXPECT_EQ(items[1]->text, "b");
  EXPECT_EQ(items[2], items[0]);
  EXPECT_EQ(items[3], items[1]);
}

TEST(PickleTest, Protocol4FrameShortUnicodeStackGlobalNewobjEx) {
  // FRAME; STACK_GLOBAL mymodule.Cls; NEWOBJ_EX((1,), {"k": 2}); then a dict with it.
  std::string body = "}" + std::string(1, '\x94') + ShortStr("obj") + B({0x94}) +
                     ShortStr("mymodule") + B({0x94}) + ShortStr("Cls") + B({0x94, 0x93, 0x94}) +
                     Int1(1) + B({0x85, 0x94}) + "}" + B({0x94}) + ShortStr("k") + B({0x94}) +
                     Int1(2) + "s" + B({0x92, 0x94}) + "s" + B({0x8d}) + U64(3) + "xyz" +
                     B({0x85}) + "0.";
  const std::string data = kProto4 + B({0x95}) + U64(body.size()) + body;
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  const PickleValue* root = *p->result;
  ASSERT_EQ(root->kind, Kind::kDict);
  const PickleValue* obj = DictGet(root, "obj");
  ASSERT_NE(obj, nullptr);
  ASSERT_EQ(obj->kind, Kind::kObject);
  EXPECT_TRUE(obj->IsObjectOf("mymodule", "Cls"));
  ASSERT_EQ(obj->args->kind, Kind::kTuple);
  EXPECT_EQ(obj->args->items[0]->integer, 1);
  ASSERT_NE(obj->state, nullptr);
  EXPECT_EQ(DictGet(obj->state, "k")->integer, 2);
  EXPECT_EQ(DescribePickleValue(obj), "object of mymodule.Cls");
}

TEST(PickleTest, NestedClassThroughGetattrIsOneGlobal) {
  // Protocol 2's ShardedTensor.ProcessGroupState(0, 0, 2, 2): getattr(ShardedTensor,
  // "ProcessGroupState"), then NEWOBJ of it; protocol 4 writes the same class with STACK_GLOBAL.
  const std::string module = "torch.distributed._shard.sharded_tensor.api";
  const std::string data = kProto2 + Global("__builtin__", "getattr") +
                           Global(module, "ShardedTensor") + Str("ProcessGroupState") +
                           B({0x86}) + "R(" + Int1(0) + Int1(0) + Int1(2) + Int1(2) + "t" +
                           B({0x81}) + ".";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  EXPECT_TRUE((*p->result)->IsObjectOf(module, "ShardedTensor.ProcessGroupState"))
      << DescribePickleValue(*p->result);
  ASSERT_EQ((*p->result)->args->items.size(), 4u);
  EXPECT_EQ((*p->result)->args->items[3]->integer, 2);
}

TEST(PickleTest, NewobjBuildAndObjectSetitems) {
  // argparse.Namespace-like: NEWOBJ then BUILD with a state dict; a dict subclass with SETITEMS.
  const std::string data = kProto2 + "(" + Global("argparse", "Namespace") + ")" + B({0x81}) + "}" +
                           Str("lr") + "G" + B({0x3F, 0xB9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9A}) +
                           "sb" + Global("mylib", "MyDict") + ")" + B({0x81}) + Str("x") + Int1(3) +
                           "s" + "t.";
  auto p = RunPickle(data);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  const auto& items = (*p->result)->items;
  ASSERT_EQ(items.size(), 2u);
  EXPECT_TRUE(items[0]->IsObjectOf("argparse", "Namespace"));
  ASSERT_NE(items[0]->state, nullptr);
  EXPECT_EQ(DictGet(items[0]->state, "lr")->real, 0.1);
  EXPECT_TRUE(items[1]->IsObjectOf("mylib", "MyDict"));
  ASSERT_EQ(items[1]->entries.size(), 1u);
}

TEST(PickleTest, PersistentIdsGoThroughTheCallback) {
  // ('storage', torch.FloatStorage, '0', 'cpu', 6) BINPERSID, twice (memo and a second id).
  const std::string pid0 = "(" + Str("storage") + Global("torch", "FloatStorage") + Str("0") +
                           Str("cpu") + Int1(6) + "tQ";
  const std::string pid1 = "(" + Str("storage") + Global("torch", "HalfStorage") + Str("1") +
                           Str("cpu") + Int1(2) + "tQ";
  std::vector<std::string> keys;
  PersistentLoad load = [&keys](PickleValue* pid,
                                PickleArena& arena) -> absl::StatusOr<PickleValue*> {
    EXPECT_EQ(pid->kind, Kind::kTuple);
    EXPECT_EQ(pid->items.size(), 5u);
    EXPECT_TRUE(pid->items[1]->IsGlobal("torch", pid->items[1]->name));
    keys.push_back(pid->items[2]->text);
    PickleValue* handle = arena.New(Kind::kPersistent);
    handle->text = pid->items[2]->text;
    return handle;
  };
  auto p = RunPickle(kProto2 + pid0 + pid1 + B({0x86}) + ".", load);
  ASSERT_TRUE(p->result.ok()) << p->result.status();
  EXPECT_EQ(keys, (std::vector<std::string>{"0", "1"}));
  ASSERT_EQ((*p->result)->items[0]->kind, Kind::kPersistent);
  EXPECT_EQ((*p->result)->items[1]->text, "1");
  EXPECT_EQ(DescribePickleValue((*p->result)->items[0]), "persistent id");

  // The callback's error comes back with the pickle offset of the BINPERSID.
  PersistentLoad refuse = [](PickleValue*, PickleArena&) -> absl::StatusOr<PickleValue*> {
    return absl::DataLossError("storage record data/0 is missing");
  };
  auto r = RunPickle(kProto2 + pid0 + ".", refuse);
  ASSERT_FALSE(r->result.ok());
  EXPECT_NE(r->result.status().message().find("data/0 is missing"), absl::string_view::npos);
  EXPECT_NE(r->result.status().message().find("byte offset " +
                                              std::to_string(kProto2.size() + pid0.size() - 1)),
            absl::string_view::npos)
      << r->result.status();
  // No callback: persistent ids are an error.
  ExpectError(RunPickle(kProto2 + pid0 + "."), "persistent id");
}

// ------------------------------------------------------------------------------------------
// Hostile streams

TEST(PickleHostileTest, UnknownOpcodeNamesOpcodeAndOffset) {
  // INT (protocol 0 text) at offset 2, 0xff at offset 3, EXT1 at 2, PERSID (text) at 2.
  auto p = RunPickle(kProto2 + "I1\n.");
  ExpectError(p, "opcode 0x49 at byte offset 2");
  EXPECT_NE(p->result.status().message().find("not supported"), absl::string_view::npos);
  ExpectError(RunPickle(kProto2 + "N" + B({0xFF}) + "."), "opcode 0xff at byte offset 3");
  ExpectError(RunPickle(kProto2 + B({0x82, 0x01}) + "."), "opcode 0x82 at byte offset 2");
  ExpectError(RunPickle(kProto2 + "P0\n."), "opcode 0x50 at byte offset 2");
  ExpectError(RunPickle(kProto2 + "i" + "os\nsystem\n."), "opcode 0x69 at byte offset 2");
}

TEST(PickleHostileTest, TruncatedAndEmpty) {
  ExpectError(RunPickle(""), "ends without STOP");
  ExpectError(RunPickle(kProto2), "ends without STOP");
  ExpectError(RunPickle(kProto2 + "}"), "ends without STOP");
  ExpectError(RunPickle(std::string(1, '\x80')), "needs 1 more bytes");
  ExpectError(RunPickle(kProto2 + "J" + B({1, 2})), "needs 4 more bytes but only 2 remain");
  ExpectError(RunPickle(kProto2 + "G" + B({1, 2})), "needs 8 more bytes");
  ExpectError(RunPickle(kProto2 + "cos\nsys"), "unterminated line");
  ExpectError(RunPickle(kProto2 + B({0x80, 0x06}) + "N."), "unsupported protocol 6");
}

TEST(PickleHostileTest, LengthPastEnd) {
  ExpectError(RunPickle(kProto2 + "X" + U32(16) + "abc."), "needs 16 more bytes but only 4 remain");
  ExpectError(RunPickle(kProto2 + B({0x8c, 50}) + "abc."), "needs 50 more bytes");
  ExpectError(RunPickle(kProto2 + B({0x8a, 9, 1, 2})), "needs 9 more bytes");
  ExpectError(RunPickle(kProto4 + B({0x95}) + U64(5)), "ends without STOP");
}

TEST(PickleHostileTest, HugeDeclaredLengthsFailFastWithoutAllocating) {
  const std::vector<std::string> cases = {
      kProto4 + B({0x8d}) + U64(UINT64_MAX) + "x.",  // BINUNICODE8
      kProto4 + B({0x8d}) + U64(uint64_t{1} << 62) + "x.",
      kProto4 + B({0x8e}) + U64(uint64_t{1} << 40) + "x.",  // BINBYTES8
      kProto4 + B({0x96}) + U64(UINT64_MAX - 8) + "x.",     // BYTEARRAY8
      kProto2 + "X" + U32(0xFFFFFFFF) + "x.",               // BINUNICODE
      kProto2 + "B" + U32(0x7FFFFFFF) + "x.",               // BINBYTES
      kProto2 + "T" + U32(0x80000000) + "x.",               // BINSTRING
      kProto2 + B({0x8b}) + U32(0x7FFFFFFF) + "x.",         // LONG4
      kProto2 + B({0x8b}) + U32(0xFFFFFFFF) + "x.",         // LONG4, negative
  };
  for (const std::string& data : cases) {
    g_largest_allocation = 0;
    const auto start = std::chrono::steady_clock::now();
    auto p = RunPickle(data);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    ASSERT_FALSE(p->result.ok());
    EXPECT_EQ(p->result.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_LT(elapsed, std::chrono::milliseconds(500));
    EXPECT_LT(g_largest_allocation.load(), size_t{1} << 20)
        << "allocated " << g_largest_allocation.load() << " bytes for " << p->result.status();
  }
}

TEST(PickleHostileTest, DeepNestingBeyondTheLimit) {
  // [[[[...]]]] 2000 deep: 2000 EMPTY_LIST then 1999 APPEND.
  std::string lists = kProto2;
  for (int i = 0; i < 2000; ++i) lists += "]";
  for (int i = 0; i < 1999; ++i) lists += "a";
  lists += ".";
  ExpectError(RunPickle(lists), "nest values deeper than 512 levels");
  // Tuples through MARK: 3000 marks.
  std::string tuples = kProto2;
  for (int i = 0; i < 3000; ++i) tuples += "(";
  for (int i = 0; i < 3000; ++i) tuples += "t";
  tuples += ".";
  auto t = RunPickle(tuples);
  ASSERT_FALSE(t->result.ok());
  // TUPLE1 chains and dicts with a lower limit.
  PickleLimits limits;
  limits.max_depth = 8;
  std::string chain = kProto2 + "N";
  for (int i = 0; i < 20; ++i) chain += B({0x85});
  chain += ".";
  ExpectError(RunPickle(chain, nullptr, limits), "nest values deeper than 8 levels");
  std::string dicts = kProto2;
  for (int i = 0; i < 20; ++i) dicts += "}" + Str("k");
  dicts += "N";
  for (int i = 0; i < 20; ++i) dicts += "s";
  dicts += ".";
  ExpectError(RunPickle(dicts, nullptr, limits), "nest values deeper than 8 levels");
  // Exactly at the limit is fine.
  std::string ok = kProto2 + "N";
  for (int i = 0; i < 7; ++i) ok += B({0x85});
  ok += ".";
  auto at_limit = RunPickle(ok, nullptr, limits);
  EXPECT_TRUE(at_limit->result.ok()) << at_limit->result.status();
}

TEST(PickleHostileTest, DeepNestingThroughTheMemoIsStillBounded) {
  // Containers are filled after they were put into their parent, so each APPEND sees an empty
  // child: list0 = []; then repeatedly: BINGET the innermost list, push a new list, memoize it,
  // APPEND it. The result nests 100 levels deep; with max_depth 16 that must be refused (a
  // caller that walks the value recursively relies on the cap).
  PickleLimits limits;
  limits.max_depth = 16;
  std::string data = kProto2 + "]" + B({'r'}) + U32(0);
  for (uint32_t i = 1; i <= 100; ++i) {
    data += "j" + U32(i - 1) + "]" + "r" + U32(i) + "a0";
  }
  data += ".";
  auto p = RunPickle(data, nullptr, limits);
  if (p->result.ok()) {
    int depth = 0;
    for (const PickleValue* v = *p->result; v->kind == Kind::kList && !v->items.empty();
         v = v->items[0]) {
      ++depth;
    }
    ADD_FAILURE() << "a value nesting " << depth << " levels deep was accepted with max_depth "
                  << limits.max_depth << " (reported depth of the root: " << (*p->result)->depth
                  << ")";
  } else {
    // Filling a list that is already inside another is refused: the depth stays exact.
    EXPECT_NE(p->result.status().message().find("already inside another value"),
              absl::string_view::npos)
        << p->result.status();
  }
}

TEST(PickleHostileTest, SelfReferenceDoesNotLoop) {
  // l = []; l.append(l); l.append(l) ... a cycle through the memo terminates.
  std::string data = kProto2 + "]" + Put(0);
  for (int i = 0; i < 1000; ++i) data += Get(0) + "a";
  data += ".";
  auto p = RunPickle(data);
  // A list appended to itself is a cycle: refused at the second append, never walked.
  ASSERT_FALSE(p->result.ok());
  EXPECT_NE(p->result.status().message().find("already inside another value"),
            absl::string_view::npos)
      << p->result.status();
}

TEST(PickleHostileTest, MemoAbuse) {
  ExpectError(RunPickle(kProto2 + Get(5) + "."), "memo entry 5 was never stored");
  ExpectError(RunPickle(kProto2 + "j" + U32(0xFFFFFFFF) + "."), "memo entry 4294967295 was never");
  ExpectError(RunPickle(kProto2 + Put(0) + "."), "empty stack");  // BINPUT with nothing to store
  PickleLimits limits;
  limits.max_memo = 4;
  std::string data = kProto2 + "N";
  for (int i = 0; i < 5; ++i) data += Put(i);
  data += ".";
  ExpectError(RunPickle(data, nullptr, limits), "memo larger than 4 entries");
  // Rewriting the same index does not grow the memo.
  std::string same = kProto2 + "N";
  for (int i = 0; i < 100; ++i) same += Put(1);
  same += ".";
  auto s = RunPickle(same, nullptr, limits);
  EXPECT_TRUE(s->result.ok()) << s->result.status();
  // Many distinct LONG_BINPUT indices are bounded by the default limit without huge memory.
  std::string many = kProto2 + "N";
  for (uint32_t i = 0; i < 20000; ++i) many += "r" + U32(i * 7919u);
  many += ".";
  auto m = RunPickle(many);
  EXPECT_TRUE(m->result.ok()) << m->result.status();
}

TEST(PickleHostileTest, ValueCountLimit) {
  PickleLimits limits;
  limits.max_values = 100;
  std::string data = kProto2 + "(";
  for (int i = 0; i < 200; ++i) data += "N";
  data += "t.";
  ExpectError(RunPickle(data, nullptr, limits), "more than 100 values");
}

TEST(PickleHostileTest, StackUnderflow) {
  ExpectError(RunPickle(kProto2 + "a."), "stack underflow");
  ExpectError(RunPickle(kProto2 + "0."), "stack underflow");
  ExpectError(RunPickle(kProto2 + B({0x86}) + "."), "stack underflow");
  ExpectError(RunPickle(kProto2 + "R."), "stack underflow");
  ExpectError(RunPickle(kProto2 + "Q."), "stack underflow");
  ExpectError(RunPickle(kProto2 + B({0x93}) + "."), "stack underflow");
  // Values below a MARK cannot be popped by opcodes above it.
  ExpectError(RunPickle(kProto2 + "]" + "(" + "a" + "."), "stack underflow");
  ExpectError(RunPickle(kProto2 + Int1(1) + "(" + B({0x85}) + "."), "stack underflow");
  ExpectError(RunPickle(kProto2 + "t."), "no MARK");
  ExpectError(RunPickle(kProto2 + "u."), "no MARK");
  ExpectError(RunPickle(kProto2 + "1."), "no MARK");
  ExpectError(RunPickle(kProto2 + "2."), "empty stack");
}

TEST(PickleHostileTest, WrongTargets) {
  ExpectError(RunPickle(kProto2 + Int1(1) + Int1(2) + "a."), "APPEND on int");
  ExpectError(RunPickle(kProto2 + ")" + "(" + Int1(2) + "e."), "APPEND on tuple of 0");
  ExpectError(RunPickle(kProto2 + Str("s") + Int1(1) + Int1(2) + "s."), "SETITEM on str");
  ExpectError(RunPickle(kProto2 + "}" + "(" + Int1(1) + "u."), "odd number");
  ExpectError(RunPickle(kProto2 + "]" + "}" + "b."), "BUILD on list");
  ExpectError(RunPickle(kProto2 + Int1(1) + ")R."), "REDUCE calls int");
  ExpectError(RunPickle(kProto2 + Global("m", "f") + Int1(1) + "R."), "not a tuple");
  ExpectError(RunPickle(kProto2 + Int1(1) + ")" + B({0x81}) + "."), "NEWOBJ of something");
  ExpectError(RunPickle(kProto4 + Int1(1) + Int1(2) + B({0x93}) + "."), "STACK_GLOBAL");
  ExpectError(RunPickle(kProto2 + Global("__builtin__", "set") + Int1(1) + B({0x85}) + "R."),
              "set() of something");
}

TEST(PickleHostileTest, StopWithMalformedStack) {
  ExpectError(RunPickle(kProto2 + Int1(1) + Int1(2) + "."), "STOP with a malformed stack");
  ExpectError(RunPickle(kProto2 + "."), "STOP with a malformed stack");
  ExpectError(RunPickle(kProto2 + "(" + Int1(1) + "."), "STOP with a malformed stack");
}

TEST(PickleHostileTest, CodeExecutingGlobalsStayInert) {
  // What pickle.loads would run: os.system("touch MARKER"), posix.system, builtins.eval/exec,
  // subprocess.Popen(["touch", ...]), getattr chains. The reader only builds inert objects.
  const std::string dir = MakeTempDir("pickle_hostile");
  const std::string marker = dir + "/MARKER";
  const std::string command = "touch " + marker;
  struct Case {
    std::string module, name, data;
  };
  std::vector<Case> cases = {
      {"os", "system", kProto2 + Global("os", "system") + Str(command) + B({0x85}) + "R."},
      {"posix", "system", kProto2 + Global("posix", "system") + Str(command) + B({0x85}) + "R."},
      {"builtins", "eval",
       kProto2 + Global("__builtin__", "eval") + Str("__import__('os').system('" + command + "')") +
           B({0x85}) + "R."},
      {"builtins", "exec",
       kProto4 + ShortStr("builtins") + ShortStr("exec") + B({0x93}) +
           Str("import os; os.system('" + command + "')") + B({0x85}) + "R."},
      {"subprocess", "Popen",
       kProto2 + Global("subprocess", "Popen") + "]" + "(" + Str("touch") + Str(marker) + "e" +
           B({0x85}) + "R."},
      {"os", "system",  // NEWOBJ and BUILD on it too
       kProto2 + Global("os", "system") + "(" + Str(command) + "t" + B({0x81}) + "}" + "b."},
  };
  for (const Case& c : cases) {
    auto p = RunPickle(c.data);
    ASSERT_TRUE(p->result.ok()) << c.module << "." << c.name << ": " << p->result.status();
    const PickleValue* object = *p->result;
    ASSERT_EQ(object->kind, Kind::kObject) << DescribePickleValue(object);
    EXPECT_TRUE(object->IsObjectOf(c.module, c.name)) << DescribePickleValue(object);
    ASSERT_NE(object->args, nullptr);
    EXPECT_EQ(object->args->kind, Kind::kTuple);
    EXPECT_FALSE(std::filesystem::exists(marker)) << c.module << "." << c.name << " ran";
  }
  // getattr(os.path, "system")(cmd) is the global os."path.system" called: as inert as the
  // others (and refused by every reader's allowed globals).
  auto chained = RunPickle(kProto2 + Global("__builtin__", "getattr") + Global("os", "path") +
                           Str("system") + B({0x86}) + "R" + Str(command) + B({0x85}) + "R.");
  ASSERT_TRUE(chained->result.ok()) << chained->result.status();
  EXPECT_TRUE((*chained->result)->IsObjectOf("os", "path.system"))
      << DescribePickleValue(*chained->result);
  // Reducing the result of any other reduce is refused: not a global.
  auto reduced = RunPickle(kProto2 + Global("__builtin__", "getattr") + Global("os", "path") +
                           Int1(1) + B({0x86}) + "R" + Str(command) + B({0x85}) + "R.");
  ASSERT_FALSE(reduced->result.ok());
  EXPECT_NE(reduced->result.status().message().find("REDUCE calls object of builtins.getattr"),
            absl::string_view::npos)
      << reduced->result.status();
  // Nothing was spawned that could still write the marker: this process has no child (system()
  // would have waited for its own, and the marker would be there already).
  const pid_t child = ::waitpid(-1, nullptr, WNOHANG);
  const int wait_error = errno;
  EXPECT_EQ(child, -1);
  EXPECT_EQ(wait_error, ECHILD);
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(PickleHostileTest, AmplifiedCopiesAreBounded) {
  // A list of 20000 items copied by set() 20000 times would need 3.2 GB of pointers for a
  // pickle of ~160 KB. The value limit must count copied items, or the copies must be shared.
  // Scaled down here with a low max_values so the test itself stays small: 2000 items, 2000
  // copies = 4M item slots against a limit of 100k values.
  PickleLimits limits;
  limits.max_values = 100'000;
  std::string data = kProto2 + Global("__builtin__", "set") + Put(0) + "0" + "]" + Put(1) + "N" +
                     Put(2) + "0" + "(";
  for (int i = 0; i < 2000; ++i) data += Get(2);
  data += "e" + B({0x85}) + Put(3) + "0" + "(";
  for (int i = 0; i < 2000; ++i) data += Get(0) + Get(3) + "R";
  data += "t.";
  g_largest_allocation = 0;
  auto p = RunPickle(data, nullptr, limits);
  size_t slots = 0;
  if (p->result.ok()) {
    for (const PickleValue* set : (*p->result)->items) slots += set->items.size();
  }
  EXPECT_FALSE(p->result.ok() && slots > 1'000'000)
      << "a " << data.size() << "-byte pickle built " << slots
      << " item slots with max_values = " << limits.max_values;

  // The same with bytes: a 10 kB string copied by bytearray() and _codecs.encode 2000 times.
  for (const std::string& call : {Global("__builtin__", "bytearray") + Put(0) + "0",
                                  Global("_codecs", "encode") + Put(0) + "0"}) {
    std::string text = kProto2 + call + Str(std::string(10000, 'a')) + Put(1) + "0" +
                       Str("latin1") + Put(2) + "0" + "(";
    const bool codecs = call[1] == '_';
    for (int i = 0; i < 2000; ++i) {
      text += Get(0) + Get(1) + (codecs ? Get(2) + B({0x86}) : B({0x85})) + "R";
    }
    text += "t.";
    auto t = RunPickle(text);
    size_t bytes = 0;
    if (t->result.ok()) {
      for (const PickleValue* b : (*t->result)->items) bytes += b->text.size();
    }
    EXPECT_FALSE(t->result.ok() && bytes > 10 * text.size())
        << "a " << text.size() << "-byte pickle built " << bytes << " bytes of bytes values";
  }
}

}  // namespace
}  // namespace reshard
