#include "lib/plan/planner.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

// Drops unit dimensions and merges neighbours that are contiguous on both sides, so the
// Executor's inner loop runs over the longest possible rows. A 0-d item becomes one element.
void CollapseDimensions(CopyItem& item) {
  CopyItem out = item;
  out.extent.clear();
  out.src_strides.clear();
  out.dst_strides.clear();
  for (size_t d = 0; d < item.extent.size(); ++d) {
    if (item.extent[d] == 1) continue;
    if (!out.extent.empty()) {
      const size_t last = out.extent.size() - 1;
      if (out.src_strides[last] == item.src_strides[d] * item.extent[d] &&
          out.dst_strides[last] == item.dst_strides[d] * item.extent[d]) {
        out.extent[last] *= item.extent[d];
        out.src_strides[last] = item.src_strides[d];
        out.dst_strides[last] = item.dst_strides[d];
        continue;
      }
    }
    out.extent.push_back(item.extent[d]);
    out.src_strides.push_back(item.src_strides[d]);
    out.dst_strides.push_back(item.dst_strides[d]);
  }
  // The Executor copies "rows": runs along the last dimension that are contiguous in the
  // output. When the innermost kept dimension is not (a one-column slice, a 0-d tensor), rows
  // are single elements.
  if (out.extent.empty() || out.dst_strides.back() != 1) {
    out.extent.push_back(1);
    out.src_strides.push_back(1);
    out.dst_strides.push_back(1);
  }
  item = std::move(out);
}

// Proves the boxes tile `region` exactly: no two overlap and their volumes add up.
absl::Status ProveCoverage(const std::string& tensor_name, const Box& region,
                           std::vector<Box> boxes) {
  const int64_t want = NumElementsUnchecked(region.extent);
  int64_t have = 0;
  for (const Box& box : boxes) have += NumElementsUnchecked(box.extent);
  if (region.rank() > 0) {
    std::sort(boxes.begin(), boxes.end(),
              [](const Box& a, const Box& b) { return a.origin[0] < b.origin[0]; });
  }
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      if (region.rank() > 0 && boxes[j].origin[0] >= boxes[i].origin[0] + boxes[i].extent[0]) {
        break;  // sorted by origin[0]: no later box can overlap box i
      }
      if (Intersect(boxes[i], boxes[j]).has_value()) {
        return absl::DataLossError(absl::StrCat(
            "tensor \"", tensor_name, "\": source pieces ", BoxToString(boxes[i]), " and ",
            BoxToString(boxes[j]), " overlap; the checkpoint does not tile the tensor exactly"));
      }
    }
  }
  if (have != want) {
    return absl::DataLossError(absl::StrCat("tensor \"", tensor_name, "\": source pieces cover ",
                                            have, " of the ", want, " elements of region ",
                                            BoxToString(region),
                                            "; the checkpoint is missing data for this tensor"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorCopy> PlanRegion(const Catalog& catalog, const OutputTensor& out) {
  const CatalogTensor& source = catalog.tensors[out.source];
  if (!CanConvert(source.dtype, out.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", source.name, "\": cannot convert ",
                                                   DTypeName(source.dtype), " to ",
                                                   DTypeName(out.dtype)));
  }
  // The part of the region the source holds; with zero_fill the rest is written as zeros.
  Box inside = out.region;
  if (!Contains(Box::Full(source.shape), out.region)) {
    std::optional<Box> common = Intersect(out.region, Box::Full(source.shape));
    if (!out.zero_fill || out.region.rank() != source.shape.size()) {
      return absl::InternalError(absl::StrCat("tensor \"", source.name, "\": output region ",
                                              BoxToString(out.region), " is outside shape ",
                                              ShapeToString(source.shape)));
    }
    inside = common.has_value() ? *common : Box{out.region.origin, Shape(out.region.rank(), 0)};
  }
  TensorCopy copy;
  copy.name = out.name;
  copy.src_dtype = source.dtype;
  copy.dst_dtype = out.dtype;
  copy.num_elements = NumElementsUnchecked(out.region.extent);
  copy.zero_fill = NumElementsUnchecked(inside.extent) != copy.num_elements;
  if (copy.num_elements == 0 || NumElementsUnchecked(inside.extent) == 0) return copy;
  const std::vector<int64_t> dst_strides = RowMajorStrides(out.region.extent);
  const uint64_t element_size = DTypeSize(source.dtype);
  std::vector<Box> covered;
  for (const SourcePiece& piece : source.pieces) {
    std::optional<Box> common = Intersect(out.region, piece.box);
    if (!common.has_value()) continue;
    CopyItem item;
    item.src_file = piece.file;
    item.extent = common->extent;
    item.src_strides = piece.strides;
    item.dst_strides = dst_strides;
    uint64_t src_element = 0;
    int64_t dst_element = 0;
    for (size_t d = 0; d < common->rank(); ++d) {
      src_element += (common->origin[d] - piece.box.origin[d]) * piece.strides[d];
      dst_element += (common->origin[d] - out.region.origin[d]) * dst_strides[d];
    }
    item.src_offset = piece.byte_offset + src_element * element_size;
    item.dst_offset = dst_element;
    CollapseDimensions(item);
    copy.items.push_back(std::move(item));
    covered.push_back(*std::move(common));
  }
  RETURN_IF_ERROR(ProveCoverage(source.name, inside, std::move(covered)));
  // Front-to-back order in the output, so the Executor's cursors advance monotonically.
  std::sort(copy.items.begin(), copy.items.end(),
            [](const CopyItem& a, const CopyItem& b) { return a.dst_offset < b.dst_offset; });
  return copy;
}

uint64_t ItemSourceBytes(const TensorCopy& copy) {
  if (!copy.zero_fill) return copy.num_elements * DTypeSize(copy.src_dtype);
  uint64_t elements = 0;
  for (const CopyItem& item : copy.items) elements += NumElementsUnchecked(item.extent);
  return elements * DTypeSize(copy.src_dtype);
}

// The other terms of an OutputTensor::mean_of (the first is `out.source`): float32 tensors of
// the first's shape, each read in the same region.
absl::StatusOr<std::vector<TensorCopy>> PlanMeanTerms(const Catalog& catalog,
                                                      const OutputTensor& out) {
  std::vector<TensorCopy> terms;
  if (out.mean_of.empty()) return terms;
  if (out.mean_of.front() != out.source || out.dtype != DType::kF32 || out.zero_fill) {
    return absl::InternalError(
        absl::StrCat("\"", out.name, "\": a mean starts at its source, in float32"));
  }
  const CatalogTensor& first = catalog.tensors[out.source];
  for (size_t i = 1; i < out.mean_of.size(); ++i) {
    const int source = out.mean_of[i];
    if (source < 0 || source >= static_cast<int>(catalog.tensors.size())) {
      return absl::InternalError(absl::StrCat("\"", out.name, "\": mean term out of range"));
    }
    const CatalogTensor& term = catalog.tensors[source];
    if (term.dtype != DType::kF32 || first.dtype != DType::kF32 || term.shape != first.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", out.name, "\" is the mean of \"", first.name, "\" (", DTypeName(first.dtype), " ",
          ShapeToString(first.shape), ") and \"", term.name, "\" (", DTypeName(term.dtype), " ",
          ShapeToString(term.shape), "): a mean needs float32 tensors of one shape"));
    }
    OutputTensor term_out = out;
    term_out.source = source;
    term_out.mean_of.clear();
    ASSIGN_OR_RETURN(TensorCopy copy, PlanRegion(catalog, term_out));
    terms.push_back(std::move(copy));
  }
  return terms;
}

}  // namespace

bool CanConvert(DType from, DType to) {
  return from == to || (IsConvertibleFloat(from) && IsConvertibleFloat(to));
}

absl::StatusOr<CopyPlan> BuildCopyPlan(const Catalog& catalog, const TargetLayout& layout,
                                       const std::vector<FileFraming>& framings) {
  if (framings.size() != layout.files.size()) {
    return absl::InternalError("one framing per output file expected");
  }
  CopyPlan plan;
  plan.sources = catalog.files;
  for (size_t f = 0; f < layout.files.size(); ++f) {
    const OutputFileLayout& file = layout.files[f];
    FilePlan file_plan;
    file_plan.name = file.name;
    for (const OutputTensor& out : file.tensors) {
      ASSIGN_OR_RETURN(TensorCopy copy, PlanRegion(catalog, out),
                       absl::StrCat("planning ", file.name));
      plan.source_bytes_read += ItemSourceBytes(copy);
      ASSIGN_OR_RETURN(copy.mean_terms, PlanMeanTerms(catalog, out),
                       absl::StrCat("planning ", file.name));
      for (const TensorCopy& term : copy.mean_terms)
        plan.source_bytes_read += ItemSourceBytes(term);
      file_plan.tensors.push_back(std::move(copy));
    }
    std::vector<int> seen(file.tensors.size(), 0);
    for (const FramingSegment& segment : framings[f].segments) {
      if (segment.kind == FramingSegment::Kind::kBytes) {
        file_plan.bytes += segment.bytes.size();
      } else if (segment.kind == FramingSegment::Kind::kDeferred) {
        if (!framings[f].deferred) {
          return absl::InternalError(absl::StrCat("writer framing of ", file.name,
                                                  " has a deferred segment but no producer"));
        }
        file_plan.bytes += segment.size;
      } else {
        if (segment.tensor < 0 || segment.tensor >= static_cast<int>(seen.size()) ||
            seen[segment.tensor]++ > 0) {
          return absl::InternalError(absl::StrCat("writer framing of ", file.name,
                                                  " places tensor #", segment.tensor, " wrongly"));
        }
        file_plan.bytes += file_plan.tensors[segment.tensor].dst_bytes();
      }
      file_plan.segments.push_back(segment);
    }
    for (size_t t = 0; t < seen.size(); ++t) {
      if (seen[t] == 0 && file.tensors[t].alias_of < 0) {
        return absl::InternalError(absl::StrCat(
            "writer framing of ", file.name, " leaves out tensor \"", file.tensors[t].name, "\""));
      }
    }
    file_plan.deferred = framings[f].deferred;
    file_plan.needs_crc32 = framings[f].needs_crc32;
    plan.total_bytes += file_plan.bytes;
    plan.files.push_back(std::move(file_plan));
  }
  return plan;
}

absl::StatusOr<TensorCopy> PlanWholeTensor(const Catalog& catalog, int index, DType dtype) {
  const CatalogTensor& tensor = catalog.tensors[index];
  return PlanRegion(catalog, OutputTensor{tensor.name, index, Box::Full(tensor.shape), dtype});
}

}  // namespace reshard
