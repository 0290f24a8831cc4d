#include "lib/formats/torch/pickle_writer.h"

#include <cstring>

#include "absl/base/internal/endian.h"

namespace reshard {

PickleWriter::PickleWriter() {
  out_.push_back('\x80');
  out_.push_back('\x02');
}

void PickleWriter::None() { Op('N'); }

void PickleWriter::Bool(bool value) { Op(value ? '\x88' : '\x89'); }

void PickleWriter::Int(int64_t value) {
  if (value >= 0 && value < 256) {
    Op('K');
    out_.push_back(static_cast<char>(value));
  } else if (value >= 0 && value < 65536) {
    Op('M');
    out_.push_back(static_cast<char>(value & 0xff));
    out_.push_back(static_cast<char>(value >> 8));
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    Op('J');
    char bytes[4];
    absl::little_endian::Store32(bytes, static_cast<uint32_t>(static_cast<int32_t>(value)));
    out_.append(bytes, 4);
  } else {  // LONG1: minimal little-endian two's complement
    char bytes[8];
    absl::little_endian::Store64(bytes, static_cast<uint64_t>(value));
    int length = 8;
    while (length > 1) {
      const char top = bytes[length - 1];
      const char next_sign = (bytes[length - 2] & 0x80) ? '\xff' : '\0';
      if (top != next_sign) break;
      --length;
    }
    BigInt(absl::string_view(bytes, length));
  }
}

void PickleWriter::BigInt(absl::string_view little_endian) {
  if (little_endian.size() < 256) {
    Op('\x8a');  // LONG1
    out_.push_back(static_cast<char>(little_endian.size()));
  } else {
    Op('\x8b');  // LONG4
    char length[4];
    absl::little_endian::Store32(length, static_cast<uint32_t>(little_endian.size()));
    out_.append(length, 4);
  }
  out_.append(little_endian.data(), little_endian.size());
}

void PickleWriter::Float(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  char bytes[8];
  absl::big_endian::Store64(bytes, bits);
  Op('G');
  out_.append(bytes, 8);
}

void PickleWriter::String(absl::string_view value) {
  Op('X');
  char length[4];
  absl::little_endian::Store32(length, static_cast<uint32_t>(value.size()));
  out_.append(length, 4);
  out_.append(value.data(), value.size());
}

void PickleWriter::Bytes(absl::string_view value) {
  // What Python's pickler writes for bytes below protocol 3: each byte becomes the code point
  // of the same value, UTF-8 encoded in the str.
  std::string latin1;
  latin1.reserve(value.size());
  for (char c : value) {
    const uint8_t byte = static_cast<uint8_t>(c);
    if (byte < 0x80) {
      latin1.push_back(c);
    } else {
      latin1.push_back(static_cast<char>(0xC0 | (byte >> 6)));
      latin1.push_back(static_cast<char>(0x80 | (byte & 0x3F)));
    }
  }
  Global("_codecs", "encode");
  String(latin1);
  String("latin1");
  Op('\x86');  // TUPLE2
  Reduce();
}

void PickleWriter::Global(absl::string_view module, absl::string_view name) {
  Op('c');
  out_.append(module.data(), module.size());
  out_.push_back('\n');
  out_.append(name.data(), name.size());
  out_.push_back('\n');
}

void PickleWriter::BeginDict(bool ordered) {
  if (ordered) {
    Global("collections", "OrderedDict");
    Op(')');
    Reduce();
  } else {
    Op('}');
  }
  BeginItems();
}

void PickleWriter::EndDict() { EndSetItems(); }

void PickleWriter::BeginList() {
  Op(']');
  BeginItems();
}

void PickleWriter::EndList() { EndAppends(); }

void PickleWriter::Reduce() { Op('R'); }

void PickleWriter::NewObj() { Op('\x81'); }

void PickleWriter::BeginItems() { Op('('); }  // MARK

void PickleWriter::EndAppends() { Op('e'); }  // APPENDS (one batch: unpicklers take any size)

void PickleWriter::EndSetItems() { Op('u'); }  // SETITEMS

void PickleWriter::Build() { Op('b'); }

void PickleWriter::BeginTuple() { Op('('); }

void PickleWriter::EndTuple() { Op('t'); }

void PickleWriter::IntTuple(const std::vector<int64_t>& values) {
  Op('(');
  for (int64_t value : values) Int(value);
  Op('t');
}

void PickleWriter::Tensor(absl::string_view storage_class, absl::string_view key, int64_t numel,
                          const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  Global("torch._utils", "_rebuild_tensor_v2");
  Op('(');
  Op('(');  // the persistent id tuple
  String("storage");
  Global("torch", storage_class);
  String(key);
  String("cpu");
  Int(numel);
  Op('t');
  Op('Q');  // BINPERSID
  Int(0);   // storage offset
  IntTuple(shape);
  IntTuple(strides);
  Bool(false);  // requires_grad
  Global("collections", "OrderedDict");
  Op(')');
  Reduce();
  Op('t');
  Reduce();
}

std::string PickleWriter::Finish() {
  Op('.');
  return std::move(out_);
}

}  // namespace reshard
