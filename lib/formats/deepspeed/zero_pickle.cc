#include "lib/formats/deepspeed/zero_pickle.h"

#include <map>
#include <string>

#include "absl/strings/match.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace zero_internal {

using Kind = PickleValue::Kind;

std::optional<int64_t> ZeroStage(const PickleValue* value) {
  if (std::optional<int64_t> stage = PickleInt(value); stage.has_value()) return stage;
  // Python >= 3.11 pickles the member as getattr(ZeroStageEnum, "gradients"), which the pickle
  // VM reads as the global "ZeroStageEnum.gradients" (a nested name); an object calling getattr
  // is the same member as a VM without that reading would leave it.
  std::string member;
  if (value != nullptr && value->kind == Kind::kGlobal &&
      absl::StartsWith(value->name, "ZeroStageEnum.")) {
    member = value->name.substr(std::string("ZeroStageEnum.").size());
  } else if (value != nullptr && value->kind == Kind::kObject && value->callable != nullptr &&
             value->callable->IsGlobal("builtins", "getattr") && value->args != nullptr &&
             value->args->kind == Kind::kTuple && value->args->items.size() == 2 &&
             value->args->items[0]->kind == Kind::kGlobal &&
             value->args->items[0]->name == "ZeroStageEnum" &&
             value->args->items[1]->kind == Kind::kString) {
    member = value->args->items[1]->text;
  } else {
    return std::nullopt;
  }
  static const auto* const kNames = new std::map<std::string, int64_t>{
      {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
  auto it = kNames->find(member);
  if (it == kNames->end()) return std::nullopt;
  return it->second;
}

const PickleValue* IntKeyField(const PickleValue* dict, int64_t key) {
  const auto* entries = PickleEntries(dict);
  if (entries == nullptr) return nullptr;
  for (const auto& [k, v] : *entries) {
    if (k->kind == Kind::kInt && k->integer == key) return v;
  }
  return nullptr;
}

bool IsNone(const PickleValue* value) { return value == nullptr || value->kind == Kind::kNone; }

}  // namespace zero_internal
}  // namespace reshard
