// libFuzzer target: the YAML subset parser must never crash, hang or recurse past its depth
// limit, and what it accepts must be a tree whose mappings have distinct keys.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "lib/formats/nemo/yaml_subset.h"

namespace {

int Check(const reshard::YamlNode& node, int depth) {
  if (depth > reshard::kMaxYamlDepth + 2) std::abort();
  std::set<std::string> keys;
  for (const auto& [key, value] : node.map) {
    if (!keys.insert(key).second) std::abort();
    Check(value, depth + 1);
  }
  for (const reshard::YamlNode& item : node.list) Check(item, depth + 1);
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto root = reshard::ParseYamlSubset(text, "fuzz.yaml");
  if (root.ok()) {
    Check(*root, 0);
    (void)reshard::YamlInt(root->Get("tensor_model_parallel_size"));
  }
  return 0;
}
