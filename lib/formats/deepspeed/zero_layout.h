// DeepSpeed ZeRO checkpoint arithmetic, without any IO: what the file names of a checkpoint
// folder say, and where each parameter's flattened elements lie in the ranks' flat fp32 groups
// (ZeRO-1/2: one flat buffer per param group, padded to 2 x world and cut into equal
// partitions; ZeRO-3: every parameter padded to world x ceil(n / world), each rank holding its
// slice of every parameter back to back, across sub-groups). The ZeRO reader
// (zero_format.h) turns these runs into Catalog pieces; docs/formats.md ("DeepSpeed ZeRO") has
// the arithmetic and the worked examples the tests use.

#ifndef RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_LAYOUT_H_
#define RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace reshard {

// The format id of ZeroInput, and of the Catalogs its readers make.
inline constexpr char kZeroFormatId[] = "deepspeed-zero";
// Directory entries looked at when probing or listing a checkpoint folder.
inline constexpr int kMaxZeroFolderEntries = 100'000;

// --- File names -----------------------------------------------------------------------------

struct ZeroFileName {
  enum class Kind {
    kOptimizer,     // [bf16_|fp16_]zero_pp_rank_{dp}_mp_rank_{mp}_optim_states.pt
    kRankModel,     // zero_pp_rank_{dp}_mp_rank_{mp}_model_states.pt (ZeRO-3)
    kModel,         // mp_rank_{mp}_model_states.pt (ZeRO-0/1/2)
    kPipelineLayer  // layer_{L}-model_{TP}-model_states.pt
  };
  Kind kind = Kind::kOptimizer;
  std::string prefix;  // "", "bf16_" or "fp16_" (optimizer files)
  int dp = 0;          // data-parallel rank (0 for kModel, the layer index for kPipelineLayer)
  int mp = 0;          // model-parallel rank
};

// What a file name of a DeepSpeed checkpoint folder says, or nullopt for other names. Rank
// numbers are decimal, at most 9 digits.
std::optional<ZeroFileName> ParseZeroFileName(absl::string_view name);

// A file of a DeepSpeed mixture-of-experts save (engine._save_moe_checkpoint), which
// ParseZeroFileName does not name.
struct MoeFileName {
  enum class Kind {
    kExpert,           // layer_{layer}_expert_{expert}_mp_rank_{mp}_model_states.pt
    kLegacyExpert,     // expert_{expert}_mp_rank_{mp}_model_states.pt (every MoE layer's expert)
    kExpertOptimizer,  // expp_rank_{ep}_mp_rank_{mp}_optim_states.pt
  };
  Kind kind = Kind::kExpert;
  int layer = 0;   // the MoE layer's index among the model's MoE layers (kExpert)
  int expert = 0;  // the global expert id (kExpert, kLegacyExpert)
  int ep = 0;      // the expert-parallel rank (kExpertOptimizer)
  int mp = 0;      // model-parallel rank
};

// What a mixture-of-experts file name says, or nullopt for other names. Numbers as for
// ParseZeroFileName.
std::optional<MoeFileName> ParseMoeFileName(absl::string_view name);

// --- The flat-buffer arithmetic ---------------------------------------------------------------

// Largest world size and parameter count accepted (numbers from a file are checked against them).
inline constexpr int64_t kZeroMaxWorld = 1 << 16;
inline constexpr int64_t kZeroMaxParams = 10'000'000;
// Largest element count of one tensor or flat group.
inline constexpr int64_t kZeroMaxElements = int64_t{1} << 62;

// A contiguous run of a parameter's flattened elements inside one rank's flat group: elements
// [begin, begin + count) of the parameter are elements [offset, offset + count) of flat group
// `group` (a ZeRO-1/2 param group or a ZeRO-3 sub-group) of rank `rank`.
struct ZeroRun {
  int rank = 0;
  int group = 0;
  int64_t offset = 0;
  int64_t begin = 0;
  int64_t count = 0;

  friend bool operator==(const ZeroRun& a, const ZeroRun& b) {
    return a.rank == b.rank && a.group == b.group && a.offset == b.offset && a.begin == b.begin &&
           a.count == b.count;
  }
};

// ZeRO-1/2: one param group's flat buffer across `world` ranks.
struct Zero12GroupLayout {
  int world = 1;
  int64_t total = 0;      // T_g: elements of the group's params
  int64_t aligned = 0;    // A_g = ceil(T_g / 2W) * 2W
  int64_t partition = 0;  // P_g = A_g / W
  // Per param (in param_shapes order), its runs in element order. Empty params have none.
  std::vector<std::vector<ZeroRun>> params;

  // Elements of real data rank `rank` holds: clamp(T_g - rank * P_g, 0, P_g). A saved partition
  // has this length (unpadded) or P_g (padded).
  int64_t UnpaddedLength(int rank) const;
};

// The layout of param group `group` whose params have `numels` elements, in flat order.
// InvalidArgument for a world size outside [1, kZeroMaxWorld], negative numels or totals
// beyond 2^62.
absl::StatusOr<Zero12GroupLayout> LayoutZero12Group(int world, int group,
                                                    absl::Span<const int64_t> numels);

// zero_to_fp32's alignment of a flat length: ceil(n / 2W) * 2W.
int64_t Zero12Align(int64_t n, int world);

// ZeRO-3: all trainable params, partitioned one by one, across sub-groups.
struct Zero3Layout {
  int world = 1;
  std::vector<int64_t> partitions;  // P_p = ceil(n / W) per param
  int64_t per_rank = 0;             // sum of P_p: what every rank holds across its sub-groups
  std::vector<std::vector<ZeroRun>> params;
};

// The layout of params with `numels` elements (the merged param_shapes order) when every rank's
// flat groups have `sub_group_sizes` elements. A param's slice is split where it crosses a
// sub-group boundary. FailedPrecondition when sum(P_p) != sum(sub_group_sizes) (zero_to_fp32's
// check), naming both numbers; InvalidArgument as for LayoutZero12Group.
absl::StatusOr<Zero3Layout> LayoutZero3(int world, absl::Span<const int64_t> numels,
                                        absl::Span<const int64_t> sub_group_sizes);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_DEEPSPEED_ZERO_LAYOUT_H_
