#include "lib/formats/hf/sentencepiece_model.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

using ::testing::HasSubstr;

// The protobuf wire format, as sentencepiece serializes its ModelProto.
std::string Varint(uint64_t value) {
  std::string out;
  do {
    uint8_t byte = value & 0x7f;
    value >>= 7;
    out.push_back(static_cast<char>(byte | (value != 0 ? 0x80 : 0)));
  } while (value != 0);
  return out;
}
std::string Bytes(uint32_t number, const std::string& payload) {
  return Varint(number << 3 | 2) + Varint(payload.size()) + payload;
}
std::string Int(uint32_t number, int32_t value) {
  // int32 fields: negative values sign-extended to 64 bits (10 bytes).
  return Varint(number << 3) + Varint(static_cast<uint64_t>(static_cast<int64_t>(value)));
}
std::string Piece(const std::string& text, int type) {
  return Bytes(
      1, Bytes(1, text) + std::string("\x15\x00\x00\x80\xbf", 5) + (type == 1 ? "" : Int(3, type)));
}

// A Gemma-like model: <pad> 0, </s> 1, <s> 2, <unk> 3 (bos 2, eos 1, pad 0), 8 pieces.
std::string Gemma() {
  std::string model = Piece("<pad>", 3) + Piece("</s>", 3) + Piece("<s>", 3) + Piece("<unk>", 2);
  for (int i = 0; i < 4; ++i) model += Piece("\xe2\x96\x81t" + std::to_string(i), 1);
  model += Bytes(
      2, Bytes(1, "corpus.txt") + Int(3, 1) + Int(40, 3) + Int(41, 2) + Int(42, 1) + Int(43, 0));
  return model + Bytes(3, Bytes(1, "nmt_nfkc"));
}

TEST(SentencePieceModelTest, PiecesAndSpecialIds) {
  const absl::StatusOr<SentencePieceModel> model = ParseSentencePieceModel(Gemma(), "t.model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->pieces, 8);
  EXPECT_EQ(model->bos_id, 2);
  EXPECT_EQ(model->eos_id, 1);
  EXPECT_EQ(model->pad_id, 0);
}

TEST(SentencePieceModelTest, DefaultsWithoutTrainerSpecFieldsAndDisabledIds) {
  std::string llama = Piece("<unk>", 2) + Piece("<s>", 3) + Piece("</s>", 3) + Piece("a", 1);
  absl::StatusOr<SentencePieceModel> model = ParseSentencePieceModel(llama, "t.model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->bos_id, 1);
  EXPECT_EQ(model->eos_id, 2);
  EXPECT_EQ(model->pad_id, std::nullopt);
  model = ParseSentencePieceModel(llama + Bytes(2, Int(41, -1)), "t.model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->bos_id, std::nullopt);
  EXPECT_EQ(model->eos_id, 2);
}

TEST(SentencePieceModelTest, DamagedModelsAreDataLossWithTheOffset) {
  const std::string good = Gemma();
  const struct {
    std::string bytes;
    std::string message;
  } cases[] = {
      {good.substr(0, good.size() - 3),
       "t.model: not a SentencePiece model (ModelProto): field 3 runs 3 bytes past the end of "
       "its message at byte offset"},
      {good + "\x0b",
       "wire type 3 of field 1 (no group or other type is in "
       "sentencepiece_model.proto) at byte offset " +
           std::to_string(good.size())},
      {"\x08\x01", "a piece (field 1) has wire type 0, not 2 at byte offset 0"},
      {Piece("<unk>", 2) + Piece("<s>", 3),
       "t.model: trainer_spec.eos_id is 2, but the model "
       "has 2 pieces"},
      {Piece("<unk>", 2) + Piece("x", 1) + Piece("</s>", 3),
       "t.model: trainer_spec.bos_id is 1, but piece 1 is \"x\" (not a control piece), not the "
       "control piece \"<s>\" SentencePiece trains there"},
      {std::string("\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
       "a truncated or overlong varint at byte offset 1"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<SentencePieceModel> model = ParseSentencePieceModel(c.bytes, "t.model");
    ASSERT_FALSE(model.ok()) << c.message;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace reshard
