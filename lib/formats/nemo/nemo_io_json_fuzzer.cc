// libFuzzer target: the io.json reader must never crash, hang or recurse, and the config it
// returns must be a mapping with distinct keys, each a scalar, a null or a {_target_} mapping.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "lib/formats/nemo/nemo_io_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = reshard::NemoIoJsonModelConfig(text, "io.json");
  if (!config.ok() || !config->has_value()) return 0;
  const reshard::YamlNode& root = **config;
  if (root.kind != reshard::YamlNode::Kind::kMap) std::abort();
  std::set<std::string> keys;
  for (const auto& [key, value] : root.map) {
    if (!keys.insert(key).second) std::abort();
    if (value.kind == reshard::YamlNode::Kind::kList) std::abort();
    if (value.kind == reshard::YamlNode::Kind::kMap &&
        (value.map.size() != 1 || value.map[0].first != "_target_")) {
      std::abort();
    }
  }
  return 0;
}
