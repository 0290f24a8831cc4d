// A safe pickle reader: runs the pickle opcodes of protocols 2 to 5 as torch.save and DCP
// write them, without executing anything.
//
// Python 2 names of globals (which protocol 2 pickles written by Python 3 use: __builtin__.long)
// become their Python 3 names, as Python's unpickler maps them. Known globals become built-in
// values (collections.OrderedDict -> dict, builtins.set -> set,
// _codecs.encode -> bytes, ...); any other global is an inert kGlobal node, and calling or
// instantiating it (REDUCE, NEWOBJ) makes a kObject node holding the callable, its arguments
// and its BUILD state, for the caller to interpret (torch's _rebuild_tensor_v2, for one).
// Persistent ids (torch storages) are handed to a callback. Every length is checked against the
// remaining input before anything is allocated; the memo, the number of values and the nesting
// depth are capped; an opcode outside the supported set is an error naming it and its offset.

#ifndef RESHARD_LIB_FORMATS_TORCH_PICKLE_H_
#define RESHARD_LIB_FORMATS_TORCH_PICKLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

struct PickleValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kBigInt,  // beyond int64: `text` holds the little-endian two's complement bytes
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kDict,
    kSet,
    kGlobal,      // `module`, `name`
    kObject,      // `callable` (a kGlobal) applied to `args`; `state` from BUILD
    kPersistent,  // whatever the persistent-load callback returned is used instead
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                                            // kString, kBytes, kBigInt
  std::string module;                                          // kGlobal
  std::string name;                                            // kGlobal
  std::vector<PickleValue*> items;                             // tuple, list, set; object APPENDs
  std::vector<std::pair<PickleValue*, PickleValue*>> entries;  // dict; object SETITEMs
  PickleValue* callable = nullptr;                             // kObject
  PickleValue* args = nullptr;                                 // kObject
  PickleValue* state = nullptr;                                // kObject, kDict (BUILD)
  int depth = 1;  // nesting depth of this value (1 for scalars)
  // Placed inside another value. Such a value is complete: mutating it afterwards (which only
  // self-referencing structures do) is refused, so `depth` stays exact.
  bool placed = false;
  bool ordered = false;  // kDict made by collections.OrderedDict() rather than {}
  // kObject made by NEWOBJ or NEWOBJ_EX (cls.__new__(cls, *args)) rather than REDUCE.
  bool new_object = false;

  bool IsGlobal(absl::string_view m, absl::string_view n) const {
    return kind == Kind::kGlobal && module == m && name == n;
  }
  // For a kObject, whether its callable is module.name.
  bool IsObjectOf(absl::string_view m, absl::string_view n) const {
    return kind == Kind::kObject && callable != nullptr && callable->IsGlobal(m, n);
  }
};

// Owns every value of one parse.
class PickleArena {
 public:
  PickleValue* New(PickleValue::Kind kind);
  size_t size() const { return values_.size(); }

 private:
  std::vector<std::unique_ptr<PickleValue>> values_;
};

struct PickleLimits {
  uint64_t max_values = 20'000'000;
  uint64_t max_memo = 10'000'000;
  int max_depth = 512;
};

// Resolves a persistent id (the value BINPERSID popped) to a value, or fails.
using PersistentLoad =
    std::function<absl::StatusOr<PickleValue*>(PickleValue* pid, PickleArena& arena)>;

// Runs the pickle in `data` and returns its result. `persistent_load` may be empty, then
// persistent ids are an error. Errors say which opcode failed at which byte offset.
absl::StatusOr<PickleValue*> ParsePickle(absl::string_view data, PickleArena& arena,
                                         const PersistentLoad& persistent_load,
                                         const PickleLimits& limits = {});

// "OrderedDict", "tuple of 3", ... for messages.
std::string DescribePickleValue(const PickleValue* value);

// A dict key as one part of a dotted name: a str as itself, an int in decimal, True, False,
// None; anything else as "<description>".
std::string PickleKeyName(const PickleValue* key);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_PICKLE_H_
