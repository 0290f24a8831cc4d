// The block-style YAML that OmegaConf writes (NeMo's model_config.yaml, NeMo 2's model.yaml),
// parsed strictly: a small subset of YAML 1.2, enough for configs and nothing more.
//
// Accepted: block mappings and block sequences nested by space indentation (a sequence may sit
// at its key's indentation, and an item may open a mapping: "- key: value"), plain, 'single' and
// "double" quoted scalars (\" \\ \n \t escapes), null (`null`, `~`, nothing), `[]`, `{}` and flow
// sequences of plain scalars (`[0.9, 0.98]`), comments, a leading `---`. Refused with
// InvalidArgument naming the file and line: tabs in indentation, anchors and aliases (& *), tags
// (!), block scalars (| >), complex keys (?), directives (%), other flow collections, duplicate
// keys, inconsistent indentation, nesting deeper than kMaxDepth; ResourceExhausted past
// kMaxNodes nodes. Scalars keep their text; YamlInt and friends read it.

#ifndef RESHARD_LIB_FORMATS_NEMO_YAML_SUBSET_H_
#define RESHARD_LIB_FORMATS_NEMO_YAML_SUBSET_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

struct YamlNode {
  enum class Kind { kNull, kScalar, kMap, kList };
  Kind kind = Kind::kNull;
  std::string scalar;  // kScalar
  std::vector<std::pair<std::string, YamlNode>> map;  // kMap, in file order
  std::vector<YamlNode> list;                          // kList

  // map[key], or null when this is not a mapping or has no such key.
  const YamlNode* Get(absl::string_view key) const;
};

inline constexpr int kMaxYamlDepth = 64;
inline constexpr int64_t kMaxYamlNodes = 1'000'000;

// Parses `text`; `path` names it in errors.
absl::StatusOr<YamlNode> ParseYamlSubset(absl::string_view text, absl::string_view path);

// A scalar as an integer ("2", "-1"); nullopt for anything else (null, a mapping, "2.0").
std::optional<int64_t> YamlInt(const YamlNode* node);
// A scalar's text; nullopt for null, mappings and sequences.
std::optional<std::string> YamlString(const YamlNode* node);
// A scalar "true"/"false" (also True/False); nullopt otherwise.
std::optional<bool> YamlBool(const YamlNode* node);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_NEMO_YAML_SUBSET_H_
