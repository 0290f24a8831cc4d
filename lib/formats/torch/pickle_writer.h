// Writes pickles of protocol 2. What reshard writes of its own uses only the opcodes and
// globals that torch.load(weights_only=True) accepts (see the format reference, §1.5.3):
// containers, str, int, float, bool, None, OrderedDict, and tensors rebuilt by
// torch._utils._rebuild_tensor_v2 from persistent storage ids. Python objects carried over from
// an input checkpoint (Global, Reduce, NewObj, Build: an argparse.Namespace, a loss scaler) are
// written only when the caller holds them, and make a pickle that needs weights_only=False.
// Nothing is memoized (allowed, and never needed here).

#ifndef RESHARD_LIB_FORMATS_TORCH_PICKLE_WRITER_H_
#define RESHARD_LIB_FORMATS_TORCH_PICKLE_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace reshard {

class PickleWriter {
 public:
  PickleWriter();  // writes PROTO 2

  void None();
  void Bool(bool value);
  void Int(int64_t value);
  void Float(double value);
  void String(absl::string_view value);
  // bytes, as protocol 2 spells them: _codecs.encode(<latin-1 str>, "latin1").
  void Bytes(absl::string_view value);
  // An int of any size from its little-endian two's complement bytes (LONG1 or LONG4).
  void BigInt(absl::string_view little_endian);
  // GLOBAL: the object `module`.`name` (module and name hold no newline).
  void Global(absl::string_view module, absl::string_view name);

  // Containers: Begin*, the items (a dict's keys and values alternating), End*.
  void BeginDict(bool ordered);  // OrderedDict() when ordered, else {}
  void EndDict();
  void BeginList();
  void EndList();
  void BeginTuple();
  void EndTuple();

  // Objects: the callable (Global), its arguments (a tuple), then Reduce() for callable(*args)
  // or NewObj() for cls.__new__(cls, *args). Then, onto the object: BeginItems(), the items,
  // EndAppends() (obj.append / extend) or EndSetItems() (obj[key] = value, keys and values
  // alternating); and a state followed by Build() (__setstate__, or an update of __dict__).
  void Reduce();
  void NewObj();
  void BeginItems();
  void EndAppends();
  void EndSetItems();
  void Build();

  // torch._utils._rebuild_tensor_v2(storage, 0, shape, strides, False, OrderedDict()) where
  // storage is the persistent id ('storage', torch.<storage_class>, key, 'cpu', numel).
  void Tensor(absl::string_view storage_class, absl::string_view key, int64_t numel,
              const std::vector<int64_t>& shape, const std::vector<int64_t>& strides);

  // Writes STOP and returns the pickle.
  std::string Finish();

 private:
  void Op(char op) { out_.push_back(op); }
  void IntTuple(const std::vector<int64_t>& values);

  std::string out_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_PICKLE_WRITER_H_
