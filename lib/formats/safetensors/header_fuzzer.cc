// libFuzzer target: the safetensors header parser must never crash, hang or read out of bounds
// on any file prefix, and anything it accepts must satisfy the format's invariants.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "lib/formats/safetensors/header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto header = reshard::ParseSafetensorsHeader(bytes, size);
  if (!header.ok()) return 0;
  // Accepted headers tile the buffer exactly and end at the end of the file.
  uint64_t expected = 0;
  for (const auto& tensor : header->tensors) {
    if (tensor.begin != expected || tensor.end < tensor.begin) std::abort();
    expected = tensor.end;
  }
  if (header->data_start + expected != size) std::abort();
  return 0;
}
