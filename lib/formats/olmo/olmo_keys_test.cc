#include "lib/formats/olmo/olmo_keys.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

using S = StructureNode;

OlmoKey Key(std::vector<StructureNode> keys, bool pickled = false) {
  OlmoKey key;
  key.keys = std::move(keys);
  key.value_is_pickled = pickled;
  return key;
}

// Keys CPython 3.11 writes with base64.urlsafe_b64encode(pickle.dumps((keys, pickled))).
struct Known {
  OlmoKey key;
  std::string encoded;
};

std::vector<Known> KnownKeys() {
  return {
      {Key({S::String("transformer.wte.weight")}),
       "gASVHwAAAAAAAACMFnRyYW5zZm9ybWVyLnd0ZS53ZWlnaHSUhZSJhpQu"},
      {Key({S::String("optim"), S::String("state"), S::Int(0), S::String("exp_avg")}),
       "gASVIwAAAAAAAAAojAVvcHRpbZSMBXN0YXRllEsAjAdleHBfYXZnlHSUiYaULg=="},
      {Key({S::String("optim"), S::String("param_groups")}, /*pickled=*/true),
       "gASVHQAAAAAAAACMBW9wdGltlIwMcGFyYW1fZ3JvdXBzlIaUiIaULg=="},
      {Key({S::String("a"), S::Int(300), S::Int(-5), S::Int(int64_t{1} << 40), S::Int(70000)}),
       "gASVIAAAAAAAAAAojAFhlE0sAUr7____igYAAAAAAAFKcBEBAHSUiYaULg=="},
  };
}

TEST(OlmoKeysTest, EncodesAsCPythonDoes) {
  for (const Known& known : KnownKeys()) {
    absl::StatusOr<std::string> encoded = EncodeOlmoKey(known.key);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    EXPECT_EQ(*encoded, known.encoded);
    EXPECT_TRUE(LooksLikeOlmoKey(*encoded));
  }
}

TEST(OlmoKeysTest, DecodesWhatCPythonWrites) {
  for (const Known& known : KnownKeys()) {
    absl::StatusOr<OlmoKey> key = DecodeOlmoKey(known.encoded);
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_EQ(OlmoKeyTuple(*key), OlmoKeyTuple(known.key));
    EXPECT_EQ(key->value_is_pickled, known.key.value_is_pickled);
  }
  // Protocol 2, as Python 2 or pickle.dumps(..., protocol=2) writes it.
  absl::StatusOr<OlmoKey> key = DecodeOlmoKey("gAJYAQAAAGFxAIVxAYmGcQIu");
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(OlmoDottedName(*key), "a");
}

TEST(OlmoKeysTest, LongStringsRoundTrip) {
  // CPython: BINUNICODE for 300 bytes.
  absl::StatusOr<std::string> python = EncodeOlmoKey(Key({S::String(std::string(300, 'x'))}));
  ASSERT_TRUE(python.ok());
  EXPECT_EQ(python->size(), 432u);
  EXPECT_EQ(python->substr(0, 20), "gASVOAEAAAAAAABYLAEA");
  const OlmoKey key = Key({S::String(std::string(300, 'x')), S::Int(-1)}, true);
  absl::StatusOr<std::string> encoded = EncodeOlmoKey(key);
  ASSERT_TRUE(encoded.ok());
  absl::StatusOr<OlmoKey> back = DecodeOlmoKey(*encoded);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(OlmoDottedName(*back), std::string(300, 'x') + ".-1");
  EXPECT_TRUE(back->value_is_pickled);
}

TEST(OlmoKeysTest, DottedNamesAndTuples) {
  const OlmoKey key = Key({S::String("optim"), S::String("state"), S::Int(3), S::String("step")});
  EXPECT_EQ(OlmoDottedName(key), "optim.state.3.step");
  EXPECT_EQ(OlmoKeyTuple(key), "('optim', 'state', 3, 'step')");
  EXPECT_EQ(OlmoKeyTuple(Key({S::String("w")})), "('w',)");
}

TEST(OlmoKeysTest, RefusesWhatIsNotAnOlmoKey) {
  // A key cut short: base64 (so the probe takes it), but not a whole pickle.
  EXPECT_EQ(DecodeOlmoKey("gASVHwAAAAAAAACMFnRy").status().code(), absl::StatusCode::kDataLoss);
  // Not base64 (a Hugging Face name), wrong padding, standard-alphabet '+'.
  for (const char* name : {"model.embed_tokens.weight", "gASVHwAAAAAAAACMFnR", "gASV+wAA"}) {
    absl::StatusOr<OlmoKey> key = DecodeOlmoKey(name);
    EXPECT_EQ(key.status().code(), absl::StatusCode::kDataLoss) << name;
    EXPECT_FALSE(LooksLikeOlmoKey(name)) << name;
  }
  // A pickle, but of a list; of a float key part; of a truncated pickle.
  EXPECT_EQ(DecodeOlmoKey("gASVCQAAAAAAAABdlChLAUsCZS4=").status().code(),
            absl::StatusCode::kDataLoss);
  absl::StatusOr<OlmoKey> float_key = DecodeOlmoKey("gASVDwAAAAAAAABHP_gAAAAAAACFlImGlC4=");
  EXPECT_EQ(float_key.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(float_key.status().message().find("not a str or int"), std::string::npos)
      << float_key.status();
  absl::StatusOr<OlmoKey> cut = DecodeOlmoKey("gASV");
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  // An empty key path cannot be encoded.
  EXPECT_EQ(EncodeOlmoKey(OlmoKey{}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard
