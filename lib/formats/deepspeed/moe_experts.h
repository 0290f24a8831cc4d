// The experts of a DeepSpeed mixture-of-experts save without ZeRO (engine._save_moe_checkpoint):
// which file holds which expert of which MoE layer, checked to hold every expert exactly once,
// and the experts' tensors added beside the dense ones of mp_rank_XX_model_states.pt.
//
// DeepSpeed writes, per model-parallel rank XX, the dense parameters (every key without
// "expert", plus the routers `...deepspeed_moe.gate.wg.weight`) in mp_rank_XX_model_states.pt
// with `num_experts` (a list: the experts of each MoE layer, in module order), and every expert
// of MoE layer m (its index among the model's MoE modules) in
// layer_{m}_expert_{g}_mp_rank_XX_model_states.pt, g = ep_rank * E_local + local id, keyed by the
// full parameter name with the local id in `.deepspeed_moe.experts.deepspeed_experts.{id}.`
// already replaced by g. load_moe_state_dict maps g back to the loading rank's local id; with
// every expert in one model (EP 1) the local id is g, so the keys as saved are the consolidated
// names. Each expert-parallel rank saves expp_rank_{ep}_mp_rank_XX_optim_states.pt, whose count
// is the save's EP.
//
// DeepSpeed before v0.6.0 (engine._get_moe_state_dict, replaced by per-layer files in PR
// #1705) saved expert g of every MoE layer in one file, expert_{g}_mp_rank_XX_model_states.pt,
// under the same keys, with `num_experts` one int (every MoE layer's experts); its loader
// (load_moe_state_dict with old_moe_load, still in DeepSpeed) tells the layouts apart by
// `num_experts` not being a list.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_MOE_EXPERTS_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_MOE_EXPERTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/formats/deepspeed/zero_catalog_builder.h"
#include "lib/formats/deepspeed/zero_folder_files.h"

namespace reshard {
namespace zero_internal {

// What sits between an expert parameter's module name and its expert id.
inline constexpr char kExpertKeyInfix[] = ".deepspeed_moe.experts.deepspeed_experts.";
// Experts per MoE layer accepted.
inline constexpr int64_t kMaxExpertsPerLayer = 1 << 16;

// An expert parameter's key split where DeepSpeed's `.*{infix}([0-9]+).*` splits it: the module
// before the last infix, the expert id, and the parameter after it ("" or ".w1.weight").
struct ExpertKey {
  std::string module;
  int64_t id = 0;
  std::string param;

  // The key of the same parameter of expert `expert`.
  std::string WithId(int64_t expert) const;
};

// `key` split, or nullopt when it holds no `{infix}{id}` followed by "." or its end.
std::optional<ExpertKey> ParseExpertKey(const std::string& key);

struct MoeSave {
  // Per MoE layer, its number of experts; with `legacy` one entry, every layer's.
  std::vector<int> experts;
  bool legacy = false;       // expert_{g}_mp_rank_XX files: [0][g] below names expert g's file
  int ep = 0;                // expert-parallel ranks (expp_rank files); 0 when none are present
  // Per model-parallel rank, [layer][global expert id] -> file name.
  std::map<int, std::vector<std::vector<std::string>>> files;
};

// Arranges the expert files of `files` for model-parallel ranks [0, parts), checked against
// `num_experts` (the dense model states' `num_experts`; empty when not recorded, the files then
// say how many layers and experts there are). DataLoss, naming the file and the expert: an
// expert missing, two files of one expert, a file outside the layers or experts recorded, a
// model-parallel rank without model states, expp_rank files not numbered 0..EP-1 or EP not
// dividing a layer's experts, legacy and per-layer expert files together.
absl::StatusOr<MoeSave> ArrangeMoeFiles(const std::string& dir, const ZeroFolderFiles& files,
                                        int parts, absl::Span<const int64_t> num_experts);

// Adds to `builder`, after the dense tensors it holds, the tensors of one model-parallel rank's
// expert files (`layers`: [layer][expert] -> file name in `dir`; `legacy`: [0][expert], each
// file holding that expert of every layer) under their keys, then moves
// each layer's experts to just after the dense tensors of its `...deepspeed_moe.` module (the
// router), where the model's own state dict has them. DataLoss, naming the file, the expert and
// the key: a key without an expert id, an id other than the file's, a layer's files holding
// different modules or different parameters (files of two saves), a key the dense module holds.
absl::Status AddExpertTensors(const std::string& dir,
                              const std::vector<std::vector<std::string>>& layers, bool legacy,
                              ZeroCatalogBuilder& builder);

}  // namespace zero_internal
}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_MOE_EXPERTS_H_
