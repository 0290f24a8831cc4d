// libFuzzer target: the tokenizer.model reader must never crash or read out of bounds, and the
// ids it gives must name pieces of the model.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "lib/formats/hf/sentencepiece_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto model = reshard::ParseSentencePieceModel(bytes, "tokenizer.model");
  if (!model.ok()) return 0;
  for (const auto& id : {model->bos_id, model->eos_id, model->pad_id}) {
    if (id.has_value() && (*id < 0 || *id >= model->pieces)) std::abort();
  }
  return 0;
}
