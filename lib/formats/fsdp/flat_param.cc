#include "lib/formats/fsdp/flat_param.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/formats/fsdp/dtensor.h"
#include "lib/formats/torch/torch_file.h"

namespace reshard {

bool IsFlatParamGlobal(const std::string& module, const std::string& name) {
  if (module == "torch._utils") {
    return name == "_rebuild_tensor_v2" || name == "_rebuild_tensor_v3" ||
           name == "_rebuild_parameter";
  }
  if (module == "torch") return name == "Size" || TorchDType(name).has_value();
  if (module == "collections") return name == "OrderedDict";
  return (module == "torch.distributed.fsdp._flat_param" ||
          module == "torch.distributed.fsdp.flat_param") &&
         name == "_ShardParamInfo";
}

absl::StatusOr<std::vector<FlatParamSlice>> ParseFlatParamHandle(const PickleValue* handle,
                                                                 int64_t flat_numel) {
  const auto* fqns = PickleItems(PickleField(handle, "flat_param._fqns"));
  const auto* shapes = PickleItems(PickleField(handle, "flat_param._shapes"));
  if (fqns == nullptr || shapes == nullptr || fqns->size() != shapes->size()) {
    return absl::DataLossError("lacks flat_param._fqns and _shapes of one length");
  }
  // (parameter index, first element, last element inclusive, offset in the shard)
  struct Slice {
    size_t param;
    int64_t first, last, offset;
  };
  std::vector<Slice> slices;
  if (const auto* infos = PickleItems(PickleField(handle, "flat_param._shard_param_infos"));
      infos != nullptr) {
    if (infos->size() != fqns->size()) {
      return absl::DataLossError(absl::StrCat("flat_param._shard_param_infos has ", infos->size(),
                                              " entries for ", fqns->size(), " parameters"));
    }
    for (size_t i = 0; i < infos->size(); ++i) {
      const PickleValue* info = (*infos)[i];
      std::optional<int64_t> in_shard = PickleInt(ObjectField(info, "in_shard", 0));
      if (!in_shard.has_value()) {
        return absl::DataLossError(
            absl::StrCat("_shard_param_infos[", i, "] is a ", DescribePickleValue(info)));
      }
      if (*in_shard == 0) continue;
      std::optional<int64_t> offset = PickleInt(ObjectField(info, "offset_in_shard", 1));
      std::optional<int64_t> numel = PickleInt(ObjectField(info, "numel_in_shard", 2));
      std::optional<int64_t> first = PickleInt(ObjectField(info, "intra_param_start_idx", 3));
      std::optional<int64_t> last = PickleInt(ObjectField(info, "intra_param_end_idx", 4));
      if (!offset || !numel || !first || !last || *numel != *last - *first + 1) {
        return absl::DataLossError(absl::StrCat(
            "_shard_param_infos[", i, "] of parameter \"", PickleKeyName((*fqns)[i]),
            "\" is not (in_shard, offset_in_shard, numel_in_shard, intra_param_start_idx, "
            "intra_param_end_idx) with numel_in_shard = end - start + 1"));
      }
      slices.push_back({i, *first, *last, *offset});
    }
  } else {
    // torch <= 2.0: parameters first..last, each (start, end) inclusive, back to back.
    const auto* indices = PickleItems(PickleField(handle, "flat_param._shard_indices"));
    const auto* offsets = PickleItems(PickleField(handle, "flat_param._shard_param_offsets"));
    std::optional<int64_t> first_param =
        indices != nullptr && indices->size() == 2 ? PickleInt((*indices)[0]) : std::nullopt;
    if (!first_param.has_value() || offsets == nullptr || *first_param < 0) {
      return absl::DataLossError(
          "has neither flat_param._shard_param_infos (torch >= 2.1) nor _shard_indices and "
          "_shard_param_offsets (torch <= 2.0)");
    }
    int64_t at = 0;
    for (size_t k = 0; k < offsets->size(); ++k) {
      const size_t i = static_cast<size_t>(*first_param) + k;
      const auto* pair = PickleItems((*offsets)[k]);
      std::optional<int64_t> start =
          pair != nullptr && pair->size() == 2 ? PickleInt((*pair)[0]) : std::nullopt;
      std::optional<int64_t> end =
          pair != nullptr && pair->size() == 2 ? PickleInt((*pair)[1]) : std::nullopt;
      if (i >= fqns->size() || !start || !end || *end < *start) {
        return absl::DataLossError(absl::StrCat("_shard_param_offsets[", k,
                                                "] is not an (start, end) pair of parameter ", i,
                                                " of ", fqns->size()));
      }
      slices.push_back({i, *start, *end, at});
      at += *end - *start + 1;
    }
  }
  std::vector<FlatParamSlice> out;
  for (const Slice& slice : slices) {
    std::optional<std::string> fqn = PickleString((*fqns)[slice.param]);
    std::optional<std::vector<int64_t>> shape = PickleShape((*shapes)[slice.param]);
    if (!fqn.has_value() || !shape.has_value()) {
      return absl::DataLossError(
          absl::StrCat("parameter ", slice.param, " has no str name or no shape"));
    }
    const int64_t numel = slice.last - slice.first + 1;
    if (slice.offset < 0 || slice.first < 0 || slice.offset > flat_numel - numel) {
      return absl::DataLossError(absl::StrCat("parameter \"", *fqn, "\": elements [", slice.first,
                                              ", ", slice.last + 1, ") at offset ", slice.offset,
                                              " of the shard leave its ", flat_numel, " elements"));
    }
    out.push_back(FlatParamSlice{*std::move(fqn), *std::move(shape), slice.first, slice.last + 1,
                                 slice.offset});
  }
  return out;
}

absl::Status CheckFlatRangesTile(std::vector<FlatRange>& ranges, int64_t numel,
                                 const std::function<std::string(const FlatRange&)>& describe) {
  std::sort(ranges.begin(), ranges.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  int64_t covered = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const FlatRange& r = ranges[i];
    if (r.begin < covered) {
      return absl::DataLossError(
          absl::StrCat("elements ", describe(r), " overlap ", describe(ranges[i - 1])));
    }
    if (r.begin > covered) {
      return absl::DataLossError(
          absl::StrCat("elements [", covered, ", ", r.begin, ") are in no rank's shard (",
                       i == 0 ? "the first is "
                              : absl::StrCat("after ", describe(ranges[i - 1]), " the next is "),
                       describe(r), ")"));
    }
    if (r.end > numel) {
      return absl::DataLossError(absl::StrCat("elements ", describe(r), " end past the parameter"));
    }
    covered = r.end;
  }
  if (covered != numel) {
    return absl::DataLossError(absl::StrCat(
        "elements [", covered, ", ", numel, ") are in no rank's shard",
        ranges.empty() ? "" : absl::StrCat(" (the last is ", describe(ranges.back()), ")")));
  }
  return absl::OkStatus();
}

}  // namespace reshard
