// A SentencePiece tokenizer.model: the serialized ModelProto of sentencepiece_model.proto,
// read with the protobuf wire format (no libprotobuf), for the vocabulary size and the special
// token ids a Hugging Face config records.
//
//   message ModelProto {
//     repeated SentencePiece pieces = 1;   // {string piece = 1; float score = 2; Type type = 3}
//     optional TrainerSpec trainer_spec = 2;
//     ...                                  // normalizer_spec = 3, ... skipped
//   }
//   message TrainerSpec {
//     optional int32 unk_id = 40 [default = 0];  optional int32 bos_id = 41 [default = 1];
//     optional int32 eos_id = 42 [default = 2];  optional int32 pad_id = 43 [default = -1];
//     optional string bos_piece = 46 [default = "<s>"];  eos_piece = 47 ["</s>"];
//     pad_piece = 48 ["<pad>"];  ...          // every other field skipped
//   }
//
// Every field is walked by its wire type (varint, fixed64, length-delimited, fixed32; groups,
// which the proto has none of, refused), the pieces and the trainer spec one level down; a
// known field of another wire type is refused. Nothing is allocated per piece.

#ifndef RESHARD_LIB_FORMATS_HF_SENTENCEPIECE_MODEL_H_
#define RESHARD_LIB_FORMATS_HF_SENTENCEPIECE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

// What a tokenizer.model says.
struct SentencePieceModel {
  int64_t pieces = 0;
  // trainer_spec's ids as SentencePiece's processor reports them (bos_id(), eos_id(), pad_id()):
  // the id when it is at least 0, nullopt when it is negative (the token is disabled).
  std::optional<int64_t> bos_id;
  std::optional<int64_t> eos_id;
  std::optional<int64_t> pad_id;
};

// Parses tokenizer.model `bytes`; `what` names it in errors (the file, or the archive and its
// member). DataLoss naming `what` and the byte offset when it is not a well-formed ModelProto (a
// truncated varint or length, a group, a known field of another wire type), and when a special
// id (bos_id, eos_id, pad_id at least 0) names no piece, or a piece other than the control piece
// trainer_spec names for it (bos_piece, ...): SentencePiece trains each special token as a
// control piece at its id, so such a model is damaged.
absl::StatusOr<SentencePieceModel> ParseSentencePieceModel(absl::string_view bytes,
                                                           absl::string_view what);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_HF_SENTENCEPIECE_MODEL_H_
