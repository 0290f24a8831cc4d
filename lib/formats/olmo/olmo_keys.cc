#include "lib/formats/olmo/olmo_keys.h"

#include <cstdint>
#include <string>

#include "absl/base/internal/endian.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/formats/torch/pickle.h"

namespace reshard {
namespace {

using Kind = PickleValue::Kind;

// The longest encoded key decoded: a key path is a handful of names; this bounds the work a
// hostile header can ask for per entry.
constexpr size_t kMaxEncodedKeyBytes = 1 << 20;

// Pickle opcodes of protocol 4 that CPython's pickler uses for ((str | int, ...), bool).
constexpr char kProto = '\x80';
constexpr char kFrame = '\x95';
constexpr char kMark = '(';
constexpr char kTuple = 't';
constexpr char kEmptyTuple = ')';
constexpr char kTuple1 = '\x85';
constexpr char kShortBinUnicode = '\x8c';
constexpr char kBinUnicode = 'X';
constexpr char kMemoize = '\x94';
constexpr char kBinInt1 = 'K';
constexpr char kBinInt2 = 'M';
constexpr char kBinInt = 'J';
constexpr char kLong1 = '\x8a';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kStop = '.';

void PutInt(int64_t value, std::string& out) {
  if (value >= 0 && value <= 0xff) {
    out.push_back(kBinInt1);
    out.push_back(static_cast<char>(value));
  } else if (value >= 0 && value <= 0xffff) {
    out.push_back(kBinInt2);
    out.push_back(static_cast<char>(value & 0xff));
    out.push_back(static_cast<char>(value >> 8));
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    out.push_back(kBinInt);
    char bytes[4];
    absl::little_endian::Store32(bytes, static_cast<uint32_t>(static_cast<int32_t>(value)));
    out.append(bytes, 4);
  } else {  // LONG1: the shortest little-endian two's complement, as encode_long writes it
    char bytes[8];
    absl::little_endian::Store64(bytes, static_cast<uint64_t>(value));
    int length = 8;
    while (length > 1) {
      const char sign_of_next = (bytes[length - 2] & 0x80) ? '\xff' : '\0';
      if (bytes[length - 1] != sign_of_next) break;
      --length;
    }
    out.push_back(kLong1);
    out.push_back(static_cast<char>(length));
    out.append(bytes, length);
  }
}

void PutString(absl::string_view text, std::string& out) {
  if (text.size() < 256) {
    out.push_back(kShortBinUnicode);
    out.push_back(static_cast<char>(text.size()));
  } else {
    out.push_back(kBinUnicode);
    char bytes[4];
    absl::little_endian::Store32(bytes, static_cast<uint32_t>(text.size()));
    out.append(bytes, 4);
  }
  out.append(text.data(), text.size());
  out.push_back(kMemoize);
}

bool IsUrlSafeBase64(absl::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return false;
  size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') {
    ++padding;
  }
  for (size_t i = 0; i < text.size() - padding; ++i) {
    const char c = text[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> EncodeOlmoKey(const OlmoKey& key) {
  if (key.keys.empty()) return absl::InvalidArgumentError("an OLMo key needs at least one part");
  std::string body;
  const bool marked = key.keys.size() > 3;
  if (marked) body.push_back(kMark);
  for (const StructureNode& part : key.keys) {
    if (part.kind == StructureNode::Kind::kString) {
      if (part.text.size() > UINT32_MAX) {
        return absl::InvalidArgumentError("an OLMo key part is longer than 4 GiB");
      }
      PutString(part.text, body);
    } else if (part.kind == StructureNode::Kind::kInt) {
      PutInt(part.integer, body);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("OLMo key parts are str or int; ", OlmoKeyTuple(key), " holds another"));
    }
  }
  // TUPLE1 .. TUPLE3 for short tuples, MARK ... TUPLE otherwise; then memoized.
  body.push_back(marked ? kTuple : static_cast<char>(kTuple1 + key.keys.size() - 1));
  body.push_back(kMemoize);
  body.push_back(key.value_is_pickled ? kNewTrue : kNewFalse);
  body.push_back(static_cast<char>(kTuple1 + 1));  // TUPLE2: (keys, value_is_pickled)
  body.push_back(kMemoize);
  body.push_back(kStop);
  std::string pickle = {kProto, '\x04', kFrame};
  char length[8];
  absl::little_endian::Store64(length, body.size());
  pickle.append(length, 8);
  pickle += body;
  std::string encoded = absl::WebSafeBase64Escape(pickle);
  encoded.append((4 - encoded.size() % 4) % 4, '=');  // Python pads; absl does not
  return encoded;
}

absl::StatusOr<OlmoKey> DecodeOlmoKey(absl::string_view encoded) {
  if (encoded.size() > kMaxEncodedKeyBytes) {
    return absl::DataLossError(
        absl::StrCat("the name is ", encoded.size(), " bytes long, more than an OLMo key can be"));
  }
  std::string pickle;
  if (!IsUrlSafeBase64(encoded) || !absl::WebSafeBase64Unescape(encoded, &pickle)) {
    return absl::DataLossError(
        "the name is not url-safe base64 (OLMo's encode_key writes base64.urlsafe_b64encode of "
        "a pickle)");
  }
  PickleArena arena;
  PickleLimits limits;
  limits.max_values = 4096;
  limits.max_memo = 4096;
  limits.max_depth = 8;
  absl::StatusOr<PickleValue*> value = ParsePickle(pickle, arena, {}, limits);
  if (!value.ok()) {
    return absl::DataLossError(
        absl::StrCat("the name's base64 does not hold a pickle: ", value.status().message()));
  }
  const PickleValue* root = *value;
  if (root->kind != Kind::kTuple || root->items.size() != 2 ||
      root->items[0]->kind != Kind::kTuple || root->items[1]->kind != Kind::kBool) {
    return absl::DataLossError(absl::StrCat("the name's pickle holds ", DescribePickleValue(root),
                                            ", not OLMo's (keys tuple, value_is_pickled bool)"));
  }
  OlmoKey key;
  key.value_is_pickled = root->items[1]->boolean;
  for (const PickleValue* part : root->items[0]->items) {
    if (part->kind == Kind::kString) {
      key.keys.push_back(StructureNode::String(part->text));
    } else if (part->kind == Kind::kInt) {
      key.keys.push_back(StructureNode::Int(part->integer));
    } else {
      return absl::DataLossError(absl::StrCat("the name's key path holds ",
                                              DescribePickleValue(part), ", not a str or int"));
    }
  }
  if (key.keys.empty()) return absl::DataLossError("the name's key path is empty");
  return key;
}

bool LooksLikeOlmoKey(absl::string_view name) {
  if (name.size() < 4 || name.size() > kMaxEncodedKeyBytes || !IsUrlSafeBase64(name)) {
    return false;
  }
  std::string head;
  if (!absl::WebSafeBase64Unescape(name.substr(0, 4), &head) || head.size() < 2) return false;
  return head[0] == kProto && head[1] >= 2 && head[1] <= 5;
}

std::string OlmoDottedName(const OlmoKey& key) {
  return absl::StrJoin(key.keys, ".", [](std::string* out, const StructureNode& part) {
    if (part.kind == StructureNode::Kind::kInt) {
      absl::StrAppend(out, part.integer);
    } else {
      out->append(part.text);
    }
  });
}

std::string OlmoKeyTuple(const OlmoKey& key) {
  std::string out = absl::StrJoin(key.keys, ", ", [](std::string* out, const StructureNode& part) {
    if (part.kind == StructureNode::Kind::kInt) {
      absl::StrAppend(out, part.integer);
    } else if (part.kind == StructureNode::Kind::kString) {
      absl::StrAppend(out, "'", absl::CEscape(part.text), "'");
    } else {
      out->append("?");
    }
  });
  return absl::StrCat("(", out, key.keys.size() == 1 ? ",)" : ")");
}

}  // namespace reshard
