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
// remaining input before anything is allocated; an opcode outside the supported set is an error
// naming it and its offset (DataLoss).
//
// Memory is bounded: every allocation the VM makes (each value at sizeof(PickleValue) plus its
// arena slot, string bytes, the capacity of item, entry, stack, mark and memo tables) is
// charged before it is made against PickleLimits::max_bytes and against the calling thread's
// MetadataAllowance, if one is installed; the memo, the number of values, the MARKs open and the
// nesting depth are capped too. Exceeding a cap is ResourceExhausted naming the opcode, its byte
// offset and the cap. Every value costs at least one opcode byte, so a parse builds at most as
// many values as the pickle has bytes, and at most ~230 bytes of values per byte of pickle.

#ifndef RESHARD_LIB_FORMATS_TORCH_PICKLE_H_
#define RESHARD_LIB_FORMATS_TORCH_PICKLE_H_

#include <cstdint>
#include <atomic>
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

// Bytes that the pickles parsed for one piece of work (an Inspect or Plan call of reshardd)
// may hold at once: arenas charge what their values take and give it back when destroyed.
// Thread-safe.
class MetadataAllowance {
 public:
  explicit MetadataAllowance(uint64_t bytes) : bytes_(bytes) {}
  MetadataAllowance(const MetadataAllowance&) = delete;
  MetadataAllowance& operator=(const MetadataAllowance&) = delete;

  // Takes `n` bytes, or returns false (taking nothing) when fewer than `n` remain.
  bool TryCharge(uint64_t n);
  void Release(uint64_t n) { used_.fetch_sub(n, std::memory_order_relaxed); }
  uint64_t bytes() const { return bytes_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }

 private:
  const uint64_t bytes_;
  std::atomic<uint64_t> used_{0};
};

// Installs `allowance` (may be null: none) for the calling thread until destroyed; nests.
// PickleArenas created on the thread meanwhile charge it.
class ScopedMetadataAllowance {
 public:
  explicit ScopedMetadataAllowance(std::shared_ptr<MetadataAllowance> allowance);
  ~ScopedMetadataAllowance();
  ScopedMetadataAllowance(const ScopedMetadataAllowance&) = delete;
  ScopedMetadataAllowance& operator=(const ScopedMetadataAllowance&) = delete;

 private:
  std::shared_ptr<MetadataAllowance> previous_;
};

// The calling thread's allowance, or null.
std::shared_ptr<MetadataAllowance> CurrentMetadataAllowance();

// Owns every value of one parse, and the bytes charged for them to the allowance that was the
// thread's when the arena was made (given back on destruction).
class PickleArena {
 public:
  PickleArena() : allowance_(CurrentMetadataAllowance()) {}
  ~PickleArena();
  PickleArena(const PickleArena&) = delete;
  PickleArena& operator=(const PickleArena&) = delete;

  PickleValue* New(PickleValue::Kind kind);
  size_t size() const { return values_.size(); }
  // Charges `n` more bytes to the allowance; false when it has no room (nothing charged).
  bool Charge(uint64_t n);
  const MetadataAllowance* allowance() const { return allowance_.get(); }
  uint64_t charged() const { return charged_; }

 private:
  std::shared_ptr<MetadataAllowance> allowance_;
  uint64_t charged_ = 0;
  std::vector<std::unique_ptr<PickleValue>> values_;
};

struct PickleLimits {
  uint64_t max_values = 20'000'000;
  uint64_t max_memo = 10'000'000;
  int max_depth = 512;
  // Bytes of values, strings and tables one parse may build (see the file comment).
  uint64_t max_bytes = kDefaultMaxBytes;

  // 1 GiB, about 4.6M values: what any reader without a tighter allowance applies.
  static constexpr uint64_t kDefaultMaxBytes = uint64_t{1} << 30;
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
