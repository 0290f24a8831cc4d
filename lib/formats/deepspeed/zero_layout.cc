#include "lib/formats/deepspeed/zero_layout.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

// Runs (pieces before box decomposition) one layout may produce: bounds the Catalog a hostile
// param_shapes can ask for.
constexpr int64_t kMaxRuns = int64_t{64} << 20;

// Consumes 1 to 9 decimal digits from the front of `text` into `value`.
bool ConsumeNumber(absl::string_view& text, int& value) {
  size_t n = 0;
  while (n < text.size() && n < 10 && absl::ascii_isdigit(static_cast<unsigned char>(text[n]))) {
    ++n;
  }
  if (n == 0 || n > 9) return false;
  int v = 0;
  for (size_t i = 0; i < n; ++i) v = v * 10 + (text[i] - '0');
  value = v;
  text.remove_prefix(n);
  return true;
}

absl::Status CheckWorld(int world) {
  if (world < 1 || world > kZeroMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", world, " is outside [1, ", kZeroMaxWorld, "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SumElements(absl::Span<const int64_t> numels, absl::string_view what) {
  int64_t total = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " #", i, " has a negative size: ", numels[i]));
    }
    if (numels[i] > kZeroMaxElements - total) {
      return absl::InvalidArgumentError(absl::StrCat(what, " add up to more than 2^62 elements"));
    }
    total += numels[i];
  }
  return total;
}

}  // namespace

std::optional<ZeroFileName> ParseZeroFileName(absl::string_view name) {
  ZeroFileName parsed;
  absl::string_view rest = name;
  if (absl::ConsumePrefix(&rest, "layer_")) {
    if (ConsumeNumber(rest, parsed.dp) && absl::ConsumePrefix(&rest, "-model_") &&
        ConsumeNumber(rest, parsed.mp) && rest == "-model_states.pt") {
      parsed.kind = ZeroFileName::Kind::kPipelineLayer;
      return parsed;
    }
    return std::nullopt;
  }
  if (absl::ConsumePrefix(&rest, "mp_rank_")) {
    if (ConsumeNumber(rest, parsed.mp) && rest == "_model_states.pt") {
      parsed.kind = ZeroFileName::Kind::kModel;
      return parsed;
    }
    return std::nullopt;
  }
  for (absl::string_view prefix : {"bf16_", "fp16_"}) {
    if (absl::ConsumePrefix(&rest, prefix)) {
      parsed.prefix = std::string(prefix);
      break;
    }
  }
  if (!absl::ConsumePrefix(&rest, "zero_pp_rank_") || !ConsumeNumber(rest, parsed.dp) ||
      !absl::ConsumePrefix(&rest, "_mp_rank_") || !ConsumeNumber(rest, parsed.mp)) {
    return std::nullopt;
  }
  if (rest == "_optim_states.pt") {
    parsed.kind = ZeroFileName::Kind::kOptimizer;
    return parsed;
  }
  if (rest == "_model_states.pt" && parsed.prefix.empty()) {
    parsed.kind = ZeroFileName::Kind::kRankModel;
    return parsed;
  }
  return std::nullopt;
}

std::optional<MoeFileName> ParseMoeFileName(absl::string_view name) {
  MoeFileName parsed;
  absl::string_view rest = name;
  if (absl::ConsumePrefix(&rest, "expp_rank_")) {
    parsed.kind = MoeFileName::Kind::kExpertOptimizer;
    if (ConsumeNumber(rest, parsed.ep) && absl::ConsumePrefix(&rest, "_mp_rank_") &&
        ConsumeNumber(rest, parsed.mp) && rest == "_optim_states.pt") {
      return parsed;
    }
    return std::nullopt;
  }
  parsed.kind = MoeFileName::Kind::kLegacyExpert;
  if (absl::ConsumePrefix(&rest, "layer_")) {
    parsed.kind = MoeFileName::Kind::kExpert;
    if (!ConsumeNumber(rest, parsed.layer) || !absl::ConsumePrefix(&rest, "_")) {
      return std::nullopt;
    }
  }
  if (absl::ConsumePrefix(&rest, "expert_") && ConsumeNumber(rest, parsed.expert) &&
      absl::ConsumePrefix(&rest, "_mp_rank_") && ConsumeNumber(rest, parsed.mp) &&
      rest == "_model_states.pt") {
    return parsed;
  }
  return std::nullopt;
}

int64_t Zero12Align(int64_t n, int world) {
  const int64_t alignment = 2 * static_cast<int64_t>(world);
  return (n + alignment - 1) / alignment * alignment;
}

int64_t Zero12GroupLayout::UnpaddedLength(int rank) const {
  const int64_t start = partition * rank;
  return std::clamp<int64_t>(total - start, 0, partition);
}

absl::StatusOr<Zero12GroupLayout> LayoutZero12Group(int world, int group,
                                                    absl::Span<const int64_t> numels) {
  RETURN_IF_ERROR(CheckWorld(world));
  if (static_cast<int64_t>(numels.size()) > kZeroMaxParams) {
    return absl::InvalidArgumentError(
        absl::StrCat(numels.size(), " params in one group; at most ", kZeroMaxParams));
  }
  ASSIGN_OR_RETURN(int64_t total, SumElements(numels, "params"));
  Zero12GroupLayout layout;
  layout.world = world;
  layout.total = total;
  layout.aligned = Zero12Align(total, world);
  layout.partition = layout.aligned / world;
  layout.params.reserve(numels.size());
  int64_t offset = 0;
  for (int64_t n : numels) {
    std::vector<ZeroRun> param;
    for (int64_t done = 0; done < n;) {
      const int64_t flat = offset + done;
      const int rank = static_cast<int>(flat / layout.partition);
      const int64_t local = flat - rank * layout.partition;
      const int64_t count = std::min(n - done, layout.partition - local);
      param.push_back(ZeroRun{rank, group, local, done, count});
      done += count;
    }
    offset += n;
    layout.params.push_back(std::move(param));
  }
  return layout;
}

absl::StatusOr<Zero3Layout> LayoutZero3(int world, absl::Span<const int64_t> numels,
                                        absl::Span<const int64_t> sub_group_sizes) {
  RETURN_IF_ERROR(CheckWorld(world));
  if (static_cast<int64_t>(numels.size()) > kZeroMaxParams) {
    return absl::InvalidArgumentError(
        absl::StrCat(numels.size(), " params; at most ", kZeroMaxParams));
  }
  Zero3Layout layout;
  layout.world = world;
  layout.partitions.reserve(numels.size());
  int64_t runs = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t n = numels[i];
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("param #", i, " has a negative size: ", n));
    }
    const int64_t partition = n / world + (n % world != 0 ? 1 : 0);
    if (partition > kZeroMaxElements - layout.per_rank) {
      return absl::InvalidArgumentError("params add up to more than 2^62 elements");
    }
    layout.per_rank += partition;
    layout.partitions.push_back(partition);
    runs += std::min<int64_t>(n, world);
    if (runs > kMaxRuns) {
      return absl::InvalidArgumentError(absl::StrCat("the params would need more than ", kMaxRuns,
                                                     " pieces over ", world, " ranks"));
    }
  }
  ASSIGN_OR_RETURN(int64_t groups_total, SumElements(sub_group_sizes, "flat groups"));
  if (groups_total != layout.per_rank) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", numels.size(), " params need ", world, " x ", layout.per_rank,
                     " elements (sum of ceil(numel / ", world, ") per rank), but each rank's ",
                     sub_group_sizes.size(), " flat groups hold ", groups_total, " (", world, " x ",
                     groups_total, ")"));
  }
  // Start of each sub-group in a rank's concatenated flat groups.
  std::vector<int64_t> starts(sub_group_sizes.size());
  for (size_t s = 0, at = 0; s < sub_group_sizes.size(); ++s) {
    starts[s] = static_cast<int64_t>(at);
    at += sub_group_sizes[s];
  }
  layout.params.reserve(numels.size());
  int64_t offset = 0;  // off_p: where this param's slice starts on every rank
  for (size_t p = 0; p < numels.size(); ++p) {
    const int64_t n = numels[p];
    const int64_t partition = layout.partitions[p];
    // The last sub-group starting at or before `offset`; empty ones are skipped below.
    const size_t first_group = static_cast<size_t>(std::max<ptrdiff_t>(
        std::upper_bound(starts.begin(), starts.end(), offset) - starts.begin() - 1, 0));
    std::vector<ZeroRun> param;
    for (int rank = 0; rank < world; ++rank) {
      const int64_t begin = rank * partition;
      if (begin >= n) break;
      const int64_t count = std::min(partition, n - begin);
      int64_t position = offset;
      size_t s = first_group;
      for (int64_t done = 0; done < count;) {
        if (s >= starts.size()) {
          return absl::InternalError("ZeRO-3 layout ran past the last sub-group");
        }
        const int64_t group_end = starts[s] + sub_group_sizes[s];
        if (position >= group_end) {
          ++s;
          continue;
        }
        const int64_t take = std::min(count - done, group_end - position);
        param.push_back(
            ZeroRun{rank, static_cast<int>(s), position - starts[s], begin + done, take});
        position += take;
        done += take;
      }
    }
    offset += partition;
    layout.params.push_back(std::move(param));
  }
  return layout;
}

}  // namespace reshard
