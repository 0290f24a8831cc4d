#include "lib/formats/torch/pickle.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/core/status.h"

namespace reshard {

namespace {
thread_local std::shared_ptr<MetadataAllowance> t_allowance;
}  // namespace

bool MetadataAllowance::TryCharge(uint64_t n) {
  uint64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (n > bytes_ - used) return false;
  } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
  return true;
}

ScopedMetadataAllowance::ScopedMetadataAllowance(std::shared_ptr<MetadataAllowance> allowance)
    : previous_(std::move(t_allowance)) {
  t_allowance = std::move(allowance);
}

ScopedMetadataAllowance::~ScopedMetadataAllowance() { t_allowance = std::move(previous_); }

std::shared_ptr<MetadataAllowance> CurrentMetadataAllowance() { return t_allowance; }

PickleArena::~PickleArena() {
  if (allowance_ != nullptr) allowance_->Release(charged_);
}

bool PickleArena::Charge(uint64_t n) {
  if (allowance_ != nullptr && !allowance_->TryCharge(n)) return false;
  charged_ += n;
  return true;
}

PickleValue* PickleArena::New(PickleValue::Kind kind) {
  values_.push_back(std::make_unique<PickleValue>());
  values_.back()->kind = kind;
  return values_.back().get();
}

std::string DescribePickleValue(const PickleValue* value) {
  if (value == nullptr) return "nothing";
  switch (value->kind) {
    case PickleValue::Kind::kNone:
      return "None";
    case PickleValue::Kind::kBool:
      return "bool";
    case PickleValue::Kind::kInt:
      return "int";
    case PickleValue::Kind::kBigInt:
      return "int";
    case PickleValue::Kind::kFloat:
      return "float";
    case PickleValue::Kind::kString:
      return "str";
    case PickleValue::Kind::kBytes:
      return "bytes";
    case PickleValue::Kind::kTuple:
      return absl::StrCat("tuple of ", value->items.size());
    case PickleValue::Kind::kList:
      return "list";
    case PickleValue::Kind::kDict:
      return "dict";
    case PickleValue::Kind::kSet:
      return "set";
    case PickleValue::Kind::kGlobal:
      return absl::StrCat("global ", value->module, ".", value->name);
    case PickleValue::Kind::kObject:
      return absl::StrCat("object of ",
                          value->callable != nullptr
                              ? absl::StrCat(value->callable->module, ".", value->callable->name)
                              : "?");
    case PickleValue::Kind::kPersistent:
      return "persistent id";
  }
  return "?";
}

std::string PickleKeyName(const PickleValue* key) {
  switch (key->kind) {
    case PickleValue::Kind::kString:
      return key->text;
    case PickleValue::Kind::kInt:
      return absl::StrCat(key->integer);
    case PickleValue::Kind::kBool:
      return key->boolean ? "True" : "False";
    case PickleValue::Kind::kNone:
      return "None";
    default:
      return absl::StrCat("<", DescribePickleValue(key), ">");
  }
}

namespace {

using Kind = PickleValue::Kind;

// What one value costs: the value, its malloc header and its arena slot (amortized: the slot
// vector doubles).
constexpr uint64_t kValueBytes = sizeof(PickleValue) + 16 + 2 * sizeof(void*);
// What one memo entry costs: a slot and a control byte of the table, which is kept at most 7/8
// full and doubles.
constexpr uint64_t kMemoEntryBytes = 2 * (sizeof(std::pair<const uint64_t, PickleValue*>) + 1);

// The heap bytes a string of `n` bytes takes beyond its own object (libstdc++ keeps up to 15
// bytes inline).
uint64_t StringHeapBytes(uint64_t n) { return n > 15 ? n + 1 : 0; }

std::string OpcodeName(uint8_t op) {
  switch (op) {
    case 0x80: return "PROTO";
    case 0x95: return "FRAME";
    case '(': return "MARK";
    case '.': return "STOP";
    case 'N': return "NONE";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 'K': return "BININT1";
    case 'M': return "BININT2";
    case 'J': return "BININT";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 'G': return "BINFLOAT";
    case 'X': return "BINUNICODE";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8e: return "BINBYTES8";
    case 0x96: return "BYTEARRAY8";
    case ')': return "EMPTY_TUPLE";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 't': return "TUPLE";
    case ']': return "EMPTY_LIST";
    case '}': return "EMPTY_DICT";
    case 0x8f: return "EMPTY_SET";
    case 'a': return "APPEND";
    case 'e': return "APPENDS";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 's': return "SETITEM";
    case 'u': return "SETITEMS";
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 'b': return "BUILD";
    case 'Q': return "BINPERSID";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 0x94: return "MEMOIZE";
    case 'h': return "BINGET";
    case 'j': return "LONG_BINGET";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    default: return "opcode";
  }
}

// "64 MiB", "1 GiB", "1000 bytes" for messages.
std::string HumanBytes(uint64_t n) {
  if (n >= (uint64_t{1} << 30) && n % (uint64_t{1} << 30) == 0) {
    return absl::StrCat(n >> 30, " GiB");
  }
  if (n >= (uint64_t{1} << 20) && n % (uint64_t{1} << 20) == 0) {
    return absl::StrCat(n >> 20, " MiB");
  }
  return absl::StrCat(n, " bytes");
}

// Python 3 writes protocol 2 pickles with Python 2 names (fix_imports: builtins.int is
// __builtin__.long); Python's unpickler maps them back, and so does this one, for the names that
// checkpoints hold (builtins, copyreg, itertools, exceptions, the User* collections).
std::pair<std::string, std::string> ModernName(absl::string_view module, absl::string_view name) {
  static const auto* const kNames = new absl::flat_hash_map<std::pair<std::string, std::string>,
                                                            std::pair<std::string, std::string>>{
      {{"__builtin__", "xrange"}, {"builtins", "range"}},
      {{"__builtin__", "reduce"}, {"functools", "reduce"}},
      {{"__builtin__", "intern"}, {"sys", "intern"}},
      {{"__builtin__", "unichr"}, {"builtins", "chr"}},
      {{"__builtin__", "unicode"}, {"builtins", "str"}},
      {{"__builtin__", "long"}, {"builtins", "int"}},
      {{"itertools", "izip"}, {"builtins", "zip"}},
      {{"itertools", "imap"}, {"builtins", "map"}},
      {{"itertools", "ifilter"}, {"builtins", "filter"}},
      {{"itertools", "ifilterfalse"}, {"itertools", "filterfalse"}},
      {{"itertools", "izip_longest"}, {"itertools", "zip_longest"}},
      {{"UserDict", "IterableUserDict"}, {"collections", "UserDict"}},
      {{"UserList", "UserList"}, {"collections", "UserList"}},
      {{"UserString", "UserString"}, {"collections", "UserString"}},
  };
  static const auto* const kModules = new absl::flat_hash_map<std::string, std::string>{
      {"__builtin__", "builtins"}, {"copy_reg", "copyreg"},        {"exceptions", "builtins"},
      {"Queue", "queue"},          {"_abcoll", "collections.abc"}, {"repr", "reprlib"},
      {"thread", "_thread"},
  };
  auto it = kNames->find(std::make_pair(std::string(module), std::string(name)));
  if (it != kNames->end()) return it->second;
  auto moved = kModules->find(module);
  return {moved != kModules->end() ? moved->second : std::string(module), std::string(name)};
}

class Machine {
 public:
  Machine(absl::string_view data, PickleArena& arena, const PersistentLoad& persistent_load,
          const PickleLimits& limits)
      : data_(data), arena_(arena), persistent_load_(persistent_load), limits_(limits) {}

  absl::StatusOr<PickleValue*> Run() {
    while (true) {
      if (pos_ >= data_.size()) return Error("the pickle ends without STOP");
      op_offset_ = pos_;
      op_ = static_cast<uint8_t>(data_[pos_++]);
      if (op_ == '.') {  // STOP
        if (stack_.size() != 1 || !marks_.empty()) return Error("STOP with a malformed stack");
        return stack_.back();
      }
      RETURN_IF_ERROR(Step());
    }
  }

 private:
  absl::Status Error(absl::string_view message) const {
    return absl::DataLossError(
        absl::StrFormat("pickle: opcode 0x%02x at byte offset %d: %s", op_, op_offset_, message));
  }
  // A cap reached: ResourceExhausted naming the opcode, its offset and the cap.
  absl::Status Exhausted(absl::string_view message) const {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "pickle: %s (0x%02x) at byte offset %d %s", OpcodeName(op_), op_, op_offset_, message));
  }

  // ---- memory: charged before it is allocated
  absl::Status Charge(uint64_t n) {
    if (n > limits_.max_bytes - std::min(built_, limits_.max_bytes)) {
      return Exhausted(absl::StrCat("would exceed the cap of ", HumanBytes(limits_.max_bytes),
                                    " on values built (", built_, " bytes built so far)"));
    }
    if (!arena_.Charge(n)) {
      const MetadataAllowance& allowance = *arena_.allowance();
      return Exhausted(absl::StrCat(
          "would exceed the metadata allowance of ", HumanBytes(allowance.bytes()),
          " (", allowance.used(), " bytes in use by the pickles of this call)"));
    }
    built_ += n;
    return absl::OkStatus();
  }
  // Makes room in `v` for `extra` more elements, charging the capacity it adds.
  template <typename Vector>
  absl::Status Grow(Vector& v, size_t extra) {
    if (v.size() + extra <= v.capacity()) return absl::OkStatus();
    const size_t capacity = std::max(v.capacity() * 2, v.size() + extra);
    RETURN_IF_ERROR(Charge((capacity - v.capacity()) * sizeof(typename Vector::value_type)));
    v.reserve(capacity);
    return absl::OkStatus();
  }

  // ---- input
  absl::Status Need(uint64_t n) const {
    if (n > data_.size() - pos_) {
      return Error(
          absl::StrCat("needs ", n, " more bytes but only ", data_.size() - pos_, " remain"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> ReadUnsigned(int bytes) {
    RETURN_IF_ERROR(Need(bytes));
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i)
      value |= uint64_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
    pos_ += bytes;
    return value;
  }
  absl::StatusOr<absl::string_view> ReadBytes(uint64_t n) {
    RETURN_IF_ERROR(Need(n));
    absl::string_view bytes = data_.substr(pos_, n);
    pos_ += n;
    return bytes;
  }
  absl::StatusOr<absl::string_view> ReadLine() {
    const size_t end = data_.find('\n', pos_);
    if (end == absl::string_view::npos || end - pos_ > 4096) return Error("unterminated line");
    absl::string_view line = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }

  // ---- values
  absl::StatusOr<PickleValue*> New(Kind kind) {
    if (arena_.size() >= limits_.max_values) {
      return Exhausted(absl::StrCat("would build more than ", limits_.max_values, " values"));
    }
    RETURN_IF_ERROR(Charge(kValueBytes));
    return arena_.New(kind);
  }
  absl::Status Push(PickleValue* value) {
    if (stack_.size() >= limits_.max_values) {
      return Exhausted(absl::StrCat("would hold more than ", limits_.max_values,
                                    " values on the stack"));
    }
    RETURN_IF_ERROR(Grow(stack_, 1));
    stack_.push_back(value);
    return absl::OkStatus();
  }
  absl::StatusOr<PickleValue*> Pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Error("stack underflow");
    PickleValue* value = stack_.back();
    stack_.pop_back();
    return value;
  }
  absl::StatusOr<PickleValue*> Top() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Error("empty stack");
    return stack_.back();
  }
  // The values above the last MARK, which is removed.
  absl::StatusOr<std::vector<PickleValue*>> PopMark() {
    if (marks_.empty()) return Error("no MARK on the stack");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<PickleValue*> items(stack_.begin() + mark, stack_.end());
    stack_.resize(mark);
    return items;
  }
  // Records that `parent` now holds `child`; bounds nesting depth.
  absl::Status Adopt(PickleValue* parent, PickleValue* child) {
    if (parent->placed) {
      return Error(absl::StrCat("changes a ", DescribePickleValue(parent),
                                " that is already inside another value (a self-referencing "
                                "structure, which checkpoints do not hold)"));
    }
    child->placed = true;
    if (child->depth + 1 > parent->depth) {
      if (child->depth + 1 > limits_.max_depth) {
        return Exhausted(
            absl::StrCat("would nest values deeper than ", limits_.max_depth, " levels"));
      }
      parent->depth = child->depth + 1;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<PickleValue*> MakeSequence(Kind kind, std::vector<PickleValue*> items) {
    ASSIGN_OR_RETURN(PickleValue * value, New(kind));
    RETURN_IF_ERROR(Charge(items.capacity() * sizeof(PickleValue*)));
    for (PickleValue* item : items) RETURN_IF_ERROR(Adopt(value, item));
    value->items = std::move(items);
    return value;
  }
  absl::Status PushInt(int64_t integer) {
    ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kInt));
    value->integer = integer;
    return Push(value);
  }
  absl::Status PushString(Kind kind, absl::string_view text) {
    RETURN_IF_ERROR(Charge(StringHeapBytes(text.size())));
    ASSIGN_OR_RETURN(PickleValue * value, New(kind));
    value->text = std::string(text);
    return Push(value);
  }
  absl::Status PushLong(absl::string_view bytes) {
    if (bytes.size() <= 8) {
      int64_t integer = 0;
      uint64_t raw = 0;
      for (size_t i = 0; i < bytes.size(); ++i)
        raw |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
      if (!bytes.empty() && bytes.size() < 8 && (static_cast<uint8_t>(bytes.back()) & 0x80)) {
        raw |= ~uint64_t{0} << (8 * bytes.size());  // sign-extend
      }
      std::memcpy(&integer, &raw, sizeof(integer));
      return PushInt(integer);
    }
    return PushString(Kind::kBigInt, bytes);
  }
  absl::Status PushGlobal(absl::string_view module, absl::string_view name) {
    RETURN_IF_ERROR(Charge(StringHeapBytes(module.size()) + StringHeapBytes(name.size())));
    ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kGlobal));
    std::tie(value->module, value->name) = ModernName(module, name);
    return Push(value);
  }
  // Calls that copy an argument (set(list), bytearray(str), _codecs.encode) may copy at most as
  // many items and bytes, in total, as the pickle has bytes: otherwise a small pickle could
  // copy one memoized list or string again and again into gigabytes.
  absl::Status ChargeCopy(uint64_t n) {
    copied_ += n;
    if (copied_ > data_.size()) {
      return Error(absl::StrCat("calls copy more items and bytes (", copied_,
                                ") than the pickle has bytes (memo reuse?)"));
    }
    return absl::OkStatus();
  }

  absl::Status Memoize(uint64_t index) {
    ASSIGN_OR_RETURN(PickleValue * top, Top());
    if (!memo_.contains(index)) {
      if (memo_.size() >= limits_.max_memo) {
        return Exhausted(absl::StrCat("would make the memo larger than ", limits_.max_memo,
                                      " entries"));
      }
      if (memo_.size() == memo_room_) {
        const size_t room = std::max<size_t>(16, memo_room_ * 2);
        RETURN_IF_ERROR(Charge((room - memo_room_) * kMemoEntryBytes));
        memo_.reserve(room);
        memo_room_ = room;
      }
    }
    memo_[index] = top;
    return absl::OkStatus();
  }
  absl::Status Recall(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Error(absl::StrCat("memo entry ", index, " was never stored"));
    return Push(it->second);
  }

  // The class operand of REDUCE or NEWOBJ: a global as it is, or getattr(<global
  // module.Outer>, "Inner"), how protocol 2 pickles a nested class such as
  // ShardedTensor.ProcessGroupState (pickle.py save_global), read as the global
  // module."Outer.Inner" that protocol 4 names directly; readers check it against their allowed
  // globals like any other, and nothing is looked up. Null for anything else. A getattr(...)
  // that is not called stays the inert object it was built as (an Enum member since Python
  // 3.11), so that outputs write it back as it was read.
  absl::StatusOr<PickleValue*> AsClass(PickleValue* value) {
    if (value->kind == Kind::kGlobal) return value;
    if (value->kind != Kind::kObject || value->new_object || value->state != nullptr ||
        value->callable == nullptr || !value->callable->IsGlobal("builtins", "getattr") ||
        value->args == nullptr || value->args->kind != Kind::kTuple ||
        value->args->items.size() != 2 || value->args->items[0]->kind != Kind::kGlobal ||
        value->args->items[1]->kind != Kind::kString || value->args->items[1]->text.empty()) {
      return nullptr;
    }
    const PickleValue* outer = value->args->items[0];
    const std::string& attribute = value->args->items[1]->text;
    RETURN_IF_ERROR(Charge(StringHeapBytes(outer->module.size()) +
                           StringHeapBytes(outer->name.size() + 1 + attribute.size())));
    ASSIGN_OR_RETURN(PickleValue * nested, New(Kind::kGlobal));
    nested->module = outer->module;
    nested->name = absl::StrCat(outer->name, ".", attribute);
    return nested;
  }

  // Calls `callable` with `args`: built-ins for the few globals that stand for data, an inert
  // object for anything else.
  absl::StatusOr<PickleValue*> Call(PickleValue* callable, PickleValue* args) {
    if (args->kind != Kind::kTuple) return Error("call arguments are not a tuple");
    if (callable->IsGlobal("collections", "OrderedDict") && args->items.empty()) {
      ASSIGN_OR_RETURN(PickleValue * dict, New(Kind::kDict));
      dict->ordered = true;
      return dict;
    }
    if ((callable->IsGlobal("builtins", "set") || callable->IsGlobal("builtins", "frozenset")) &&
        args->items.size() <= 1) {
      ASSIGN_OR_RETURN(PickleValue * set, New(Kind::kSet));
      if (!args->items.empty()) {
        if (args->items[0]->kind != Kind::kList && args->items[0]->kind != Kind::kTuple) {
          return Error("set() of something that is not a list");
        }
        RETURN_IF_ERROR(ChargeCopy(args->items[0]->items.size()));
        RETURN_IF_ERROR(Charge(args->items[0]->items.size() * sizeof(PickleValue*)));
        set->items = args->items[0]->items;
        RETURN_IF_ERROR(Adopt(set, args->items[0]));
      }
      return set;
    }
    if (callable->IsGlobal("_codecs", "encode") && args->items.size() == 2 &&
        args->items[0]->kind == Kind::kString) {
      // Protocol 2 writes bytes as a latin-1 str: map each code point back to one byte.
      const std::string& utf8 = args->items[0]->text;
      RETURN_IF_ERROR(ChargeCopy(utf8.size()));
      RETURN_IF_ERROR(Charge(StringHeapBytes(utf8.size())));
      ASSIGN_OR_RETURN(PickleValue * bytes, New(Kind::kBytes));
      bytes->text.reserve(utf8.size());
      for (size_t i = 0; i < utf8.size(); ++i) {
        const uint8_t c = static_cast<uint8_t>(utf8[i]);
        if (c < 0x80) {
          bytes->text.push_back(static_cast<char>(c));
        } else if ((c & 0xE0) == 0xC0 && i + 1 < utf8.size()) {
          bytes->text.push_back(static_cast<char>(((c & 0x1F) << 6) | (utf8[++i] & 0x3F)));
        } else {
          return Error("_codecs.encode of a string that is not latin-1");
        }
      }
      return bytes;
    }
    if ((callable->IsGlobal("builtins", "bytearray") && args->items.size() <= 1) ||
        (callable->IsGlobal("builtins", "bytes") && args->items.empty())) {  // b"" in protocol 2
      if (!args->items.empty()) {
        RETURN_IF_ERROR(ChargeCopy(args->items[0]->text.size()));
        RETURN_IF_ERROR(Charge(StringHeapBytes(args->items[0]->text.size())));
      }
      ASSIGN_OR_RETURN(PickleValue * bytes, New(Kind::kBytes));
      if (!args->items.empty()) bytes->text = args->items[0]->text;
      return bytes;
    }
    ASSIGN_OR_RETURN(PickleValue * object, New(Kind::kObject));
    object->callable = callable;
    object->args = args;
    RETURN_IF_ERROR(Adopt(object, args));
    return object;
  }

  absl::Status SetItems(PickleValue* target, const std::vector<PickleValue*>& pairs) {
    if (pairs.size() % 2 != 0) return Error("SETITEMS with an odd number of values");
    if (target->kind != Kind::kDict && target->kind != Kind::kObject) {
      return Error(absl::StrCat("SETITEM on ", DescribePickleValue(target)));
    }
    RETURN_IF_ERROR(Grow(target->entries, pairs.size() / 2));
    for (size_t i = 0; i < pairs.size(); i += 2) {
      RETURN_IF_ERROR(Adopt(target, pairs[i]));
      RETURN_IF_ERROR(Adopt(target, pairs[i + 1]));
      target->entries.emplace_back(pairs[i], pairs[i + 1]);
    }
    return absl::OkStatus();
  }

  absl::Status Append(PickleValue* target, const std::vector<PickleValue*>& items) {
    if (target->kind != Kind::kList && target->kind != Kind::kObject &&
        target->kind != Kind::kSet) {
      return Error(absl::StrCat("APPEND on ", DescribePickleValue(target)));
    }
    RETURN_IF_ERROR(Grow(target->items, items.size()));
    for (PickleValue* item : items) {
      RETURN_IF_ERROR(Adopt(target, item));
      target->items.push_back(item);
    }
    return absl::OkStatus();
  }

  absl::Status Step() {
    switch (op_) {
      case 0x80: {  // PROTO
        ASSIGN_OR_RETURN(uint64_t protocol, ReadUnsigned(1));
        if (protocol > 5) return Error(absl::StrCat("unsupported protocol ", protocol));
        return absl::OkStatus();
      }
      case 0x95:  // FRAME: a length prefix only
        return ReadUnsigned(8).status();
      case '(':  // MARK
        if (marks_.size() >= static_cast<size_t>(limits_.max_depth) * 4) {
          return Exhausted(absl::StrCat("would open more than ",
                                        static_cast<size_t>(limits_.max_depth) * 4, " MARKs"));
        }
        RETURN_IF_ERROR(Grow(marks_, 1));
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case 'N': {
        ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kNone));
        return Push(value);
      }
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kBool));
        value->boolean = op_ == 0x88;
        return Push(value);
      }
      case 'K': {  // BININT1
        ASSIGN_OR_RETURN(uint64_t v, ReadUnsigned(1));
        return PushInt(static_cast<int64_t>(v));
      }
      case 'M': {  // BININT2
        ASSIGN_OR_RETURN(uint64_t v, ReadUnsigned(2));
        return PushInt(static_cast<int64_t>(v));
      }
      case 'J': {  // BININT: signed 32-bit
        ASSIGN_OR_RETURN(uint64_t v, ReadUnsigned(4));
        return PushInt(static_cast<int32_t>(static_cast<uint32_t>(v)));
      }
      case 0x8a: {  // LONG1
        ASSIGN_OR_RETURN(uint64_t n, ReadUnsigned(1));
        ASSIGN_OR_RETURN(absl::string_view bytes, ReadBytes(n));
        return PushLong(bytes);
      }
      case 0x8b: {  // LONG4
        ASSIGN_OR_RETURN(uint64_t n, ReadUnsigned(4));
        if (n > 0x7fffffff) return Error("negative LONG4 length");
        ASSIGN_OR_RETURN(absl::string_view bytes, ReadBytes(n));
        return PushLong(bytes);
      }
      case 'G': {  // BINFLOAT: big-endian double
        ASSIGN_OR_RETURN(absl::string_view bytes, ReadBytes(8));
        uint64_t raw = absl::big_endian::Load64(bytes.data());
        ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kFloat));
        std::memcpy(&value->real, &raw, sizeof(raw));
        return Push(value);
      }
      case 'X':     // BINUNICODE
      case 0x8c:    // SHORT_BINUNICODE
      case 0x8d:    // BINUNICODE8
      case 'T':     // BINSTRING (Python 2 str)
      case 'U':     // SHORT_BINSTRING
      case 'B':     // BINBYTES
      case 'C':     // SHORT_BINBYTES
      case 0x8e:    // BINBYTES8
      case 0x96: {  // BYTEARRAY8
        const int width = (op_ == 0x8c || op_ == 'U' || op_ == 'C')     ? 1
                          : (op_ == 0x8d || op_ == 0x8e || op_ == 0x96) ? 8
                                                                        : 4;
        ASSIGN_OR_RETURN(uint64_t n, ReadUnsigned(width));
        ASSIGN_OR_RETURN(absl::string_view bytes, ReadBytes(n));
        const bool text = op_ == 'X' || op_ == 0x8c || op_ == 0x8d || op_ == 'T' || op_ == 'U';
        return PushString(text ? Kind::kString : Kind::kBytes, bytes);
      }
      case ')': {  // EMPTY_TUPLE
        ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kTuple));
        return Push(value);
      }
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const int n = op_ - 0x84;
        std::vector<PickleValue*> items(n);
        for (int i = n - 1; i >= 0; --i) {
          ASSIGN_OR_RETURN(items[i], Pop());
        }
        ASSIGN_OR_RETURN(PickleValue * value, MakeSequence(Kind::kTuple, std::move(items)));
        return Push(value);
      }
      case 't': {  // TUPLE
        ASSIGN_OR_RETURN(std::vector<PickleValue*> items, PopMark());
        ASSIGN_OR_RETURN(PickleValue * value, MakeSequence(Kind::kTuple, std::move(items)));
        return Push(value);
      }
      case ']': {  // EMPTY_LIST
        ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kList));
        return Push(value);
      }
      case '}': {  // EMPTY_DICT
        ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kDict));
        return Push(value);
      }
      case 0x8f: {  // EMPTY_SET
        ASSIGN_OR_RETURN(PickleValue * value, New(Kind::kSet));
        return Push(value);
      }
      case 'a': {  // APPEND
        ASSIGN_OR_RETURN(PickleValue * item, Pop());
        ASSIGN_OR_RETURN(PickleValue * list, Top());
        return Append(list, {item});
      }
      case 'e':     // APPENDS
      case 0x90: {  // ADDITEMS
        ASSIGN_OR_RETURN(std::vector<PickleValue*> items, PopMark());
        ASSIGN_OR_RETURN(PickleValue * list, Top());
        return Append(list, items);
      }
      case 0x91: {  // FROZENSET
        ASSIGN_OR_RETURN(std::vector<PickleValue*> items, PopMark());
        ASSIGN_OR_RETURN(PickleValue * value, MakeSequence(Kind::kSet, std::move(items)));
        return Push(value);
      }
      case 's': {  // SETITEM
        ASSIGN_OR_RETURN(PickleValue * value, Pop());
        ASSIGN_OR_RETURN(PickleValue * key, Pop());
        ASSIGN_OR_RETURN(PickleValue * dict, Top());
        return SetItems(dict, {key, value});
      }
      case 'u': {  // SETITEMS
        ASSIGN_OR_RETURN(std::vector<PickleValue*> pairs, PopMark());
        ASSIGN_OR_RETURN(PickleValue * dict, Top());
        return SetItems(dict, pairs);
      }
      case 'c': {  // GLOBAL "module\nname\n"
        ASSIGN_OR_RETURN(absl::string_view module, ReadLine());
        ASSIGN_OR_RETURN(absl::string_view name, ReadLine());
        return PushGlobal(module, name);
      }
      case 0x93: {  // STACK_GLOBAL
        ASSIGN_OR_RETURN(PickleValue * name, Pop());
        ASSIGN_OR_RETURN(PickleValue * module, Pop());
        if (name->kind != Kind::kString || module->kind != Kind::kString) {
          return Error("STACK_GLOBAL of something that is not a string");
        }
        return PushGlobal(module->text, name->text);
      }
      case 'R': {  // REDUCE
        ASSIGN_OR_RETURN(PickleValue * args, Pop());
        ASSIGN_OR_RETURN(PickleValue * operand, Pop());
        ASSIGN_OR_RETURN(PickleValue * callable, AsClass(operand));
        if (callable == nullptr) {
          return Error(absl::StrCat("REDUCE calls ", DescribePickleValue(operand)));
        }
        ASSIGN_OR_RETURN(PickleValue * result, Call(callable, args));
        return Push(result);
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        ASSIGN_OR_RETURN(PickleValue * args, Pop());
        ASSIGN_OR_RETURN(PickleValue * operand, Pop());
        ASSIGN_OR_RETURN(PickleValue * cls, AsClass(operand));
        if (cls == nullptr) return Error("NEWOBJ of something that is not a class");
        ASSIGN_OR_RETURN(PickleValue * result, Call(cls, args));
        if (result->kind == Kind::kObject) result->new_object = true;
        return Push(result);
      }
      case 0x92: {  // NEWOBJ_EX: keyword arguments are dropped into the object's state
        ASSIGN_OR_RETURN(PickleValue * kwargs, Pop());
        ASSIGN_OR_RETURN(PickleValue * args, Pop());
        ASSIGN_OR_RETURN(PickleValue * operand, Pop());
        ASSIGN_OR_RETURN(PickleValue * cls, AsClass(operand));
        if (cls == nullptr) return Error("NEWOBJ_EX of something that is not a class");
        ASSIGN_OR_RETURN(PickleValue * result, Call(cls, args));
        if (result->kind == Kind::kObject) result->new_object = true;
        if (result->kind == Kind::kObject && kwargs->kind == Kind::kDict &&
            !kwargs->entries.empty()) {
          result->state = kwargs;
          RETURN_IF_ERROR(Adopt(result, kwargs));
        }
        return Push(result);
      }
      case 'b': {  // BUILD: __setstate__
        ASSIGN_OR_RETURN(PickleValue * state, Pop());
        ASSIGN_OR_RETURN(PickleValue * target, Top());
        if (target->kind != Kind::kObject && target->kind != Kind::kDict) {
          return Error(absl::StrCat("BUILD on ", DescribePickleValue(target)));
        }
        RETURN_IF_ERROR(Adopt(target, state));
        target->state = state;
        return absl::OkStatus();
      }
      case 'Q': {  // BINPERSID
        ASSIGN_OR_RETURN(PickleValue * pid, Pop());
        if (!persistent_load_) return Error("persistent id in a pickle that may not have any");
        RETURN_IF_ERROR(Charge(kValueBytes));  // the handle the callback makes
        absl::StatusOr<PickleValue*> loaded = persistent_load_(pid, arena_);
        if (!loaded.ok())
          return Annotate(loaded.status(), absl::StrCat("pickle byte offset ", op_offset_));
        RETURN_IF_ERROR(Charge(StringHeapBytes((*loaded)->text.size())));
        return Push(*loaded);
      }
      case 'q': {  // BINPUT
        ASSIGN_OR_RETURN(uint64_t index, ReadUnsigned(1));
        return Memoize(index);
      }
      case 'r': {  // LONG_BINPUT
        ASSIGN_OR_RETURN(uint64_t index, ReadUnsigned(4));
        return Memoize(index);
      }
      case 0x94:  // MEMOIZE
        return Memoize(memo_.size());
      case 'h': {  // BINGET
        ASSIGN_OR_RETURN(uint64_t index, ReadUnsigned(1));
        return Recall(index);
      }
      case 'j': {  // LONG_BINGET
        ASSIGN_OR_RETURN(uint64_t index, ReadUnsigned(4));
        return Recall(index);
      }
      case '0':  // POP
        return Pop().status();
      case '1':  // POP_MARK
        return PopMark().status();
      case '2': {  // DUP
        ASSIGN_OR_RETURN(PickleValue * top, Top());
        return Push(top);
      }
      default:
        return Error(
            "opcode not supported (reshard reads pickles of protocol 2 to 5 as torch "
            "and DCP write them; text-mode protocol 0/1 opcodes and extension codes "
            "are not)");
    }
  }

  absl::string_view data_;
  PickleArena& arena_;
  const PersistentLoad& persistent_load_;
  const PickleLimits limits_;
  uint64_t pos_ = 0;
  uint64_t op_offset_ = 0;
  uint64_t copied_ = 0;  // items and bytes copied by calls (ChargeCopy)
  uint64_t built_ = 0;   // bytes charged (Charge)
  size_t memo_room_ = 0;  // entries the memo was reserved for
  uint8_t op_ = 0;
  std::vector<PickleValue*> stack_;
  std::vector<size_t> marks_;
  absl::flat_hash_map<uint64_t, PickleValue*> memo_;
};

}  // namespace

absl::StatusOr<PickleValue*> ParsePickle(absl::string_view data, PickleArena& arena,
                                         const PersistentLoad& persistent_load,
                                         const PickleLimits& limits) {
  Machine machine(data, arena, persistent_load, limits);
  return machine.Run();
}

}  // namespace reshard
