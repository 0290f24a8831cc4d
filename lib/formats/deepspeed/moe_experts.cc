#include "lib/formats/deepspeed/moe_experts.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"
#include "lib/core/status.h"
#include "lib/formats/checkpoint_folder.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {
namespace zero_internal {
namespace {

std::string TwoDigits(int n) { return absl::StrCat(n < 10 ? "0" : "", n); }

std::string ExpertFileName(bool legacy, int layer, int expert, int mp) {
  return absl::StrCat(legacy ? "" : absl::StrCat("layer_", layer, "_"), "expert_", expert,
                      "_mp_rank_", TwoDigits(mp), "_model_states.pt");
}

}  // namespace

std::string ExpertKey::WithId(int64_t expert) const {
  return absl::StrCat(module, kExpertKeyInfix, expert, param);
}

std::optional<ExpertKey> ParseExpertKey(const std::string& key) {
  const size_t at = key.rfind(kExpertKeyInfix);
  if (at == std::string::npos) return std::nullopt;
  size_t end = at + sizeof(kExpertKeyInfix) - 1;
  const size_t digits = end;
  int64_t id = 0;
  while (end < key.size() && end - digits < 10 &&
         absl::ascii_isdigit(static_cast<unsigned char>(key[end]))) {
    id = id * 10 + (key[end] - '0');
    ++end;
  }
  if (end == digits || end - digits > 9 || (end < key.size() && key[end] != '.')) {
    return std::nullopt;
  }
  return ExpertKey{key.substr(0, at), id, key.substr(end)};
}

absl::StatusOr<MoeSave> ArrangeMoeFiles(const std::string& dir, const ZeroFolderFiles& files,
                                        int parts, absl::Span<const int64_t> num_experts) {
  MoeSave save;
  // mp -> (layer, expert) -> name, and mp -> ep -> name.
  std::map<int, std::map<std::pair<int, int>, std::string>> experts;
  std::map<int, std::map<int, std::string>> optimizers;
  int max_layer = -1;
  std::map<int, int> max_expert;  // layer -> largest expert id named
  for (const auto& [parsed, name] : files.moe_files) {
    if (parsed.kind != MoeFileName::Kind::kExpertOptimizer) {
      const bool legacy = parsed.kind == MoeFileName::Kind::kLegacyExpert;
      if (!experts.empty() && legacy != save.legacy) {
        return absl::DataLossError(absl::StrCat(
            dir, ": ", name, " beside ", experts.begin()->second.begin()->second,
            ": expert files of DeepSpeed's legacy layout (expert_{g}_mp_rank_XX, every MoE "
            "layer's expert g in one file) and of the per-layer one (layer_{m}_expert_{g}_...) "
            "are of two saves"));
      }
      save.legacy = legacy;
    }
    if (parsed.mp >= parts) {
      return absl::DataLossError(
          absl::StrCat(dir, ": ", name, " is of model-parallel rank ", parsed.mp,
                       ", but the folder holds ", parts, " mp_rank_XX_model_states.pt file",
                       parts == 1 ? "" : "s", " (files of two saves mixed?)"));
    }
    if (parsed.kind == MoeFileName::Kind::kExpertOptimizer) {
      auto [slot, inserted] = optimizers[parsed.mp].try_emplace(parsed.ep, name);
      if (!inserted) {
        return absl::DataLossError(absl::StrCat(dir, ": ", slot->second, " and ", name,
                                                " are both the optimizer file of expert-parallel "
                                                "rank ",
                                                parsed.ep, " (two saves mixed?)"));
      }
      continue;
    }
    auto [slot, inserted] =
        experts[parsed.mp].try_emplace(std::make_pair(parsed.layer, parsed.expert), name);
    if (!inserted) {
      return absl::DataLossError(absl::StrCat(
          dir, ": ", slot->second, " and ", name, " are both expert ", parsed.expert,
          save.legacy ? std::string() : absl::StrCat(" of MoE layer ", parsed.layer),
          " (two saves mixed?)"));
    }
    max_layer = std::max(max_layer, parsed.layer);
    max_expert[parsed.layer] = std::max(max_expert[parsed.layer], parsed.expert);
  }
  if (experts.empty()) {
    return absl::DataLossError(absl::StrCat(
        dir, ": ", files.moe_files.front().second,
        " is the optimizer file of a DeepSpeed mixture-of-experts save, but the folder holds no "
        "expert files (layer_{m}_expert_{g}_mp_rank_XX_model_states.pt). ",
        kPartialSaveHint));
  }
  const std::string recorded = num_experts.empty()
                                   ? std::string("the expert files")
                                   : std::string("num_experts in mp_rank_00_model_states.pt");
  if (save.legacy && num_experts.size() > 1) {
    return absl::DataLossError(absl::StrCat(
        dir, ": ", experts.begin()->second.begin()->second, " is an expert file of DeepSpeed's "
        "legacy layout, but ", recorded, " lists the experts of ", num_experts.size(),
        " MoE layers, as only the per-layer layout records them (two saves mixed?)"));
  }
  if (!num_experts.empty()) {
    for (size_t m = 0; m < num_experts.size(); ++m) {
      if (num_experts[m] < 1 || num_experts[m] > kMaxExpertsPerLayer) {
        return absl::DataLossError(absl::StrCat(dir, ": ", recorded, " gives MoE layer ", m, " ",
                                                num_experts[m], " experts; expected 1 to ",
                                                kMaxExpertsPerLayer));
      }
      save.experts.push_back(static_cast<int>(num_experts[m]));
    }
  } else {
    for (int m = 0; m <= max_layer; ++m) {
      auto it = max_expert.find(m);
      save.experts.push_back(it == max_expert.end() ? 1 : it->second + 1);
    }
  }
  const int layers = static_cast<int>(save.experts.size());
  for (int mp = 0; mp < parts; ++mp) {
    const auto& named = experts[mp];
    for (const auto& [key, name] : named) {
      const auto [layer, expert] = key;
      if (layer >= layers) {
        return absl::DataLossError(absl::StrCat(
            dir, ": ", name, " is expert ", expert, " of MoE layer ", layer, ", but ", recorded,
            " records ", layers, " MoE layer", layers == 1 ? "" : "s", " (two saves mixed?)"));
      }
      if (expert >= save.experts[layer]) {
        return absl::DataLossError(absl::StrCat(
            dir, ": ", name, " is expert ", expert,
            save.legacy ? std::string() : absl::StrCat(" of MoE layer ", layer), ", but ",
            save.legacy ? "every MoE layer" : "the layer", " has ", save.experts[layer],
            " experts (", recorded, "; two saves mixed?)"));
      }
    }
    std::vector<std::vector<std::string>>& arranged = save.files[mp];
    arranged.resize(layers);
    for (int m = 0; m < layers; ++m) {
      for (int g = 0; g < save.experts[m]; ++g) {
        auto it = named.find({m, g});
        if (it == named.end()) {
          return absl::DataLossError(absl::StrCat(
              dir, ": expert ", g,
              save.legacy ? std::string() : absl::StrCat(" of MoE layer ", m), " is missing: ",
              ExpertFileName(save.legacy, m, g, mp), " is not in the folder. ", kPartialSaveHint));
        }
        arranged[m].push_back(it->second);
      }
    }
  }
  // EP: the expert-parallel ranks' optimizer files, 0..EP-1 for every model-parallel rank.
  if (!optimizers.empty()) {
    const std::map<int, std::string>& first = optimizers.begin()->second;
    save.ep = first.rbegin()->first + 1;
    for (int mp = 0; mp < parts; ++mp) {
      for (int ep = 0; ep < save.ep; ++ep) {
        if (optimizers[mp].count(ep) == 0) {
          return absl::DataLossError(
              absl::StrCat(dir, ": expp_rank_", ep, "_mp_rank_", TwoDigits(mp),
                           "_optim_states.pt (the optimizer file of expert-parallel rank ", ep,
                           ") is missing. ", kPartialSaveHint));
        }
      }
      if (optimizers[mp].size() != static_cast<size_t>(save.ep)) {
        return absl::DataLossError(absl::StrCat(
            dir, ": ", optimizers[mp].rbegin()->second, " names expert-parallel rank ",
            optimizers[mp].rbegin()->first, ", but mp_rank_", TwoDigits(optimizers.begin()->first),
            " has ", save.ep, " (two saves mixed?)"));
      }
    }
    for (int m = 0; m < layers; ++m) {
      if (save.experts[m] % save.ep != 0) {
        return absl::DataLossError(
            absl::StrCat(dir, ": MoE layer ", m, " has ", save.experts[m], " experts, which ",
                         save.ep, " expert-parallel ranks (expp_rank_0..", save.ep - 1,
                         " optimizer files) cannot share equally (two saves mixed?)"));
      }
    }
  }
  return save;
}

absl::Status AddExpertTensors(const std::string& dir,
                              const std::vector<std::vector<std::string>>& layers, bool legacy,
                              ZeroCatalogBuilder& builder) {
  const size_t dense = builder.catalog().tensors.size();
  std::vector<std::string> modules(layers.size());      // per layer, its MoE module
  std::vector<size_t> layer_end(layers.size(), dense);  // per layer, one past its last tensor
  // Legacy files: the MoE modules in the order expert 0's file holds them.
  std::vector<std::string> legacy_modules;
  // What is compared across the experts of a layer: the parameter after the id, and in a
  // legacy file, which holds every layer's expert, the module before it too.
  auto param_key = [legacy](const ExpertKey& key) {
    return legacy ? absl::StrCat(key.module, kExpertKeyInfix, "*", key.param) : key.param;
  };
  for (size_t m = 0; m < layers.size(); ++m) {
    // The parameters of expert 0 of this layer (after the id): what every expert must hold.
    std::map<std::string, std::pair<DType, Shape>> params;
    for (size_t g = 0; g < layers[m].size(); ++g) {
      const std::string& name = layers[m][g];
      ASSIGN_OR_RETURN(std::unique_ptr<TorchArchive> archive,
                       TorchArchive::Open(JoinPath(dir, name)));
      const std::string expert =
          legacy ? absl::StrCat("expert ", g) : absl::StrCat("expert ", g, " of MoE layer ", m);
      if (PickleEntries(archive->root()) == nullptr) {
        return Corrupt(*archive, absl::StrCat("holds ", DescribePickleValue(archive->root()),
                                              "; expected the state dict of ", expert));
      }
      const size_t before = builder.catalog().tensors.size();
      std::set<std::string> seen;
      RETURN_IF_ERROR(builder.AddStateDict(
          *archive, archive->root(), name, [&](const std::string& key) -> absl::Status {
            std::optional<ExpertKey> parsed = ParseExpertKey(key);
            if (!parsed.has_value()) {
              return Corrupt(*archive, absl::StrCat("\"", key, "\" (in the file of ", expert,
                                                    ") is not an expert parameter: no `",
                                                    kExpertKeyInfix, "{id}.`"));
            }
            if (parsed->id != static_cast<int64_t>(g)) {
              return Corrupt(*archive, absl::StrCat("\"", key, "\" is a parameter of expert ",
                                                    parsed->id, ", but the file is ", expert,
                                                    "'s (a duplicated or renamed expert file)"));
            }
            if (legacy) {
              if (g == 0 && std::find(legacy_modules.begin(), legacy_modules.end(),
                                      parsed->module) == legacy_modules.end()) {
                legacy_modules.push_back(parsed->module);
              }
            } else if (modules[m].empty()) {
              for (size_t other = 0; other < m; ++other) {
                if (modules[other] == parsed->module) {
                  return Corrupt(*archive, absl::StrCat("\"", key, "\" (", expert,
                                                        ") is of the experts of MoE layer ", other,
                                                        " (two saves mixed?)"));
                }
              }
              modules[m] = parsed->module;
            } else if (parsed->module != modules[m]) {
              return Corrupt(*archive,
                             absl::StrCat("\"", key, "\" (", expert, ") is of module ",
                                          parsed->module, ", but MoE layer ", m,
                                          "'s experts are of ", modules[m], " (two saves mixed?)"));
            }
            if (const int index = builder.Find(key); index >= 0) {
              return Corrupt(*archive, absl::StrCat("\"", key, "\" (", expert, ") is also in ",
                                                    static_cast<size_t>(index) < dense
                                                        ? "the dense model states' module"
                                                        : "another expert file"));
            }
            seen.insert(param_key(*parsed));
            return absl::OkStatus();
          }));
      // Every expert of a layer holds the same parameters, shapes and dtypes.
      for (size_t i = before; i < builder.catalog().tensors.size(); ++i) {
        const CatalogTensor& tensor = builder.catalog().tensors[i];
        const std::string param = param_key(*ParseExpertKey(tensor.name));
        if (g == 0) {
          params[param] = {tensor.dtype, tensor.shape};
          continue;
        }
        auto it = params.find(param);
        if (it == params.end() || it->second.first != tensor.dtype ||
            it->second.second != tensor.shape) {
          return absl::DataLossError(absl::StrCat(
              archive->path(), ": \"", tensor.name, "\" (", expert, ") is ",
              DTypeName(tensor.dtype), " ", ShapeToString(tensor.shape), ", but expert 0 ",
              it == params.end() ? "has no such parameter"
                                 : absl::StrCat("has ", DTypeName(it->second.first), " ",
                                                ShapeToString(it->second.second)),
              " (experts of two saves mixed?)"));
        }
      }
      if (g > 0 && seen.size() != params.size()) {
        return absl::DataLossError(absl::StrCat(archive->path(), ": ", expert, " holds ",
                                                seen.size(), " parameters, expert 0 ",
                                                params.size(), " (experts of two saves mixed?)"));
      }
      if (seen.empty()) {
        return absl::DataLossError(
            absl::StrCat(archive->path(), ": ", expert, "'s file holds no tensors"));
      }
    }
    layer_end[m] = builder.catalog().tensors.size();
  }
  if (legacy) {
    // Each file holds one expert of every layer: regroup layer by layer, experts in id order,
    // as the per-layer layout reads them.
    std::vector<CatalogTensor>& added = builder.catalog().tensors;
    auto rank = [&](const CatalogTensor& tensor) {
      const ExpertKey key = *ParseExpertKey(tensor.name);
      const size_t layer =
          std::find(legacy_modules.begin(), legacy_modules.end(), key.module) -
          legacy_modules.begin();
      return std::make_pair(layer, key.id);
    };
    std::stable_sort(added.begin() + dense, added.end(),
                     [&](const CatalogTensor& a, const CatalogTensor& b) {
                       return rank(a) < rank(b);
                     });
    modules = legacy_modules;
    layer_end.assign(modules.size(), dense);
    for (size_t i = dense; i < added.size(); ++i) layer_end[rank(added[i]).first] = i + 1;
  }
  // Each layer's experts go after the last dense tensor of its `<module>.` (its router), as in
  // the model's state dict; a layer whose module holds no dense tensor stays at the end.
  std::vector<CatalogTensor>& tensors = builder.catalog().tensors;
  std::vector<std::vector<size_t>> after(dense);  // dense index -> layers placed after it
  std::vector<size_t> trailing;
  for (size_t m = 0; m < modules.size(); ++m) {
    const std::string moe_prefix = absl::StrCat(modules[m], ".deepspeed_moe.");
    int anchor = -1;
    for (size_t i = 0; i < dense; ++i) {
      if (absl::StartsWith(tensors[i].name, moe_prefix)) {
        anchor = static_cast<int>(i);
      }
    }
    (anchor < 0 ? trailing : after[anchor]).push_back(m);
  }
  std::vector<CatalogTensor> ordered;
  ordered.reserve(tensors.size());
  auto append_layer = [&](size_t m) {
    const size_t begin = m == 0 ? dense : layer_end[m - 1];
    for (size_t i = begin; i < layer_end[m]; ++i) ordered.push_back(std::move(tensors[i]));
  };
  for (size_t i = 0; i < dense; ++i) {
    ordered.push_back(std::move(tensors[i]));
    for (size_t m : after[i]) append_layer(m);
  }
  for (size_t m : trailing) append_layer(m);
  tensors = std::move(ordered);
  return absl::OkStatus();
}

}  // namespace zero_internal
}  // namespace reshard
