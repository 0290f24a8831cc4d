#include "lib/formats/hf/sentencepiece_model.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {

namespace {

// Field numbers of sentencepiece_model.proto.
constexpr uint32_t kPieces = 1;       // ModelProto.pieces
constexpr uint32_t kTrainerSpec = 2;  // ModelProto.trainer_spec
constexpr uint32_t kPieceText = 1;    // SentencePiece.piece
constexpr uint32_t kPieceType = 3;    // SentencePiece.type
constexpr int64_t kControl = 3;       // SentencePiece.Type.CONTROL

enum WireType { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

// One field of a message: its number and wire type, a varint's value or a length-delimited
// payload, and where it starts in the whole model.
struct Field {
  uint32_t number = 0;
  int type = 0;
  uint64_t varint = 0;
  absl::string_view payload;
  uint64_t offset = 0;
};

// The fields of one message, `bytes` starting at byte `base` of the model.
class Fields {
 public:
  Fields(absl::string_view bytes, uint64_t base, absl::string_view what)
      : bytes_(bytes), base_(base), what_(what) {}

  bool done() const { return at_ == bytes_.size(); }

  absl::Status Next(Field& field) {
    field = Field();
    field.offset = base_ + at_;
    ASSIGN_OR_RETURN(const uint64_t tag, Varint());
    field.number = static_cast<uint32_t>(tag >> 3);
    field.type = static_cast<int>(tag & 7);
    if ((tag >> 3) == 0 || (tag >> 3) > (1u << 29)) {
      return Error(field.offset, absl::StrCat("field number ", tag >> 3));
    }
    uint64_t skip = 0;
    switch (field.type) {
      case kVarint: {
        ASSIGN_OR_RETURN(field.varint, Varint());
        return absl::OkStatus();
      }
      case kFixed64:
        skip = 8;
        break;
      case kLength: {
        ASSIGN_OR_RETURN(skip, Varint());
        break;
      }
      case kFixed32:
        skip = 4;
        break;
      default:
        return Error(field.offset,
                     absl::StrCat("wire type ", field.type, " of field ", field.number,
                                  " (no group or other type is in "
                                  "sentencepiece_model.proto)"));
    }
    if (skip > bytes_.size() - at_) {
      return Error(field.offset,
                   absl::StrCat("field ", field.number, " runs ", skip - (bytes_.size() - at_),
                                " bytes past the end of its message"));
    }
    field.payload = bytes_.substr(at_, skip);
    at_ += skip;
    return absl::OkStatus();
  }

  // DataLoss unless `field` has wire type `type`.
  absl::Status Expect(const Field& field, int type, absl::string_view name) const {
    if (field.type == type) return absl::OkStatus();
    return Error(field.offset, absl::StrCat(name, " (field ", field.number, ") has wire type ",
                                            field.type, ", not ", type));
  }

  absl::Status Error(uint64_t offset, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(
        what_, ": not a SentencePiece model (ModelProto): ", what, " at byte offset ", offset));
  }

 private:
  absl::StatusOr<uint64_t> Varint() {
    const uint64_t start = base_ + at_;
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && at_ < bytes_.size(); shift += 7) {
      const uint8_t byte = static_cast<uint8_t>(bytes_[at_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return Error(start, "a truncated or overlong varint");
  }

  absl::string_view bytes_;
  uint64_t base_ = 0;
  absl::string_view what_;
  size_t at_ = 0;
};

// A special token of TrainerSpec: its id and piece fields, defaults and name.
struct Special {
  const char* name;      // "bos"
  uint32_t id_field;     // 41
  uint32_t piece_field;  // 46
  int64_t id;            // the default, then what the spec says
  std::string piece;     // likewise
  std::optional<int64_t>* out;
};

}  // namespace

absl::StatusOr<SentencePieceModel> ParseSentencePieceModel(absl::string_view bytes,
                                                           absl::string_view what) {
  SentencePieceModel model;
  std::array<Special, 3> specials = {{{"bos", 41, 46, 1, "<s>", &model.bos_id},
                                      {"eos", 42, 47, 2, "</s>", &model.eos_id},
                                      {"pad", 43, 48, -1, "<pad>", &model.pad_id}}};
  // First pass: the pieces counted and walked, the trainer spec read.
  Fields top(bytes, 0, what);
  Field field;
  while (!top.done()) {
    RETURN_IF_ERROR(top.Next(field));
    if (field.number == kPieces) {
      RETURN_IF_ERROR(top.Expect(field, kLength, "a piece"));
      Fields piece(field.payload, field.payload.data() - bytes.data(), what);
      Field inner;
      while (!piece.done()) RETURN_IF_ERROR(piece.Next(inner));
      ++model.pieces;
    } else if (field.number == kTrainerSpec) {
      RETURN_IF_ERROR(top.Expect(field, kLength, "trainer_spec"));
      Fields spec(field.payload, field.payload.data() - bytes.data(), what);
      Field inner;
      while (!spec.done()) {
        RETURN_IF_ERROR(spec.Next(inner));
        for (Special& special : specials) {
          if (inner.number == special.id_field) {
            RETURN_IF_ERROR(spec.Expect(inner, kVarint, absl::StrCat(special.name, "_id")));
            // An int32: negative values are sign-extended to 64 bits.
            special.id = static_cast<int32_t>(static_cast<uint32_t>(inner.varint));
          } else if (inner.number == special.piece_field) {
            RETURN_IF_ERROR(spec.Expect(inner, kLength, absl::StrCat(special.name, "_piece")));
            special.piece = std::string(inner.payload);
          }
        }
      }
    }
  }
  // Second pass: the piece at each special id must be that token's control piece.
  for (Special& special : specials) {
    if (special.id < 0) continue;
    if (special.id >= model.pieces) {
      return absl::DataLossError(absl::StrCat(what, ": trainer_spec.", special.name, "_id is ",
                                              special.id, ", but the model has ", model.pieces,
                                              " pieces"));
    }
    *special.out = special.id;
  }
  int64_t index = 0;
  Fields again(bytes, 0, what);
  while (!again.done()) {
    RETURN_IF_ERROR(again.Next(field));
    if (field.number != kPieces) continue;
    const int64_t id = index++;
    const Special* wanted = nullptr;
    for (const Special& special : specials) {
      if (special.id == id) wanted = &special;
    }
    if (wanted == nullptr) continue;
    Fields piece(field.payload, field.payload.data() - bytes.data(), what);
    Field inner;
    absl::string_view text;
    int64_t type = 1;  // NORMAL, the default
    while (!piece.done()) {
      RETURN_IF_ERROR(piece.Next(inner));
      if (inner.number == kPieceText) {
        RETURN_IF_ERROR(piece.Expect(inner, kLength, "a piece's text"));
        text = inner.payload;
      } else if (inner.number == kPieceType) {
        RETURN_IF_ERROR(piece.Expect(inner, kVarint, "a piece's type"));
        type = static_cast<int64_t>(inner.varint);
      }
    }
    if (type != kControl || text != wanted->piece) {
      return absl::DataLossError(absl::StrCat(
          what, ": trainer_spec.", wanted->name, "_id is ", id, ", but piece ", id, " is \"", text,
          "\"", type == kControl ? "" : " (not a control piece)", ", not the control piece \"",
          wanted->piece, "\" SentencePiece trains there"));
    }
  }
  return model;
}

}  // namespace reshard
