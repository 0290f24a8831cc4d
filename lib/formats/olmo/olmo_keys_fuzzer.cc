// libFuzzer target: any safetensors entry name must decode as an OLMo key or be refused,
// without crashing; a key that decodes must encode again and decode to the same key.

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "lib/formats/olmo/olmo_keys.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view name(reinterpret_cast<const char*>(data), size);
  (void)reshard::LooksLikeOlmoKey(name);
  auto key = reshard::DecodeOlmoKey(name);
  if (!key.ok()) return 0;
  auto encoded = reshard::EncodeOlmoKey(*key);
  if (!encoded.ok()) std::abort();
  auto again = reshard::DecodeOlmoKey(*encoded);
  if (!again.ok() || again->value_is_pickled != key->value_is_pickled ||
      reshard::OlmoKeyTuple(*again) != reshard::OlmoKeyTuple(*key)) {
    std::abort();
  }
  return 0;
}
