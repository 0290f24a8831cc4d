#include "lib/engine/verify.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/core/status.h"
#include "lib/engine/conversion.h"
#include "lib/exec/executor.h"
#include "lib/exec/span_reader.h"
#include "lib/exec/tensor_compare.h"
#include "lib/exec/tensor_filler.h"
#include "lib/io/kvstore/posix_driver.h"
#include "lib/plan/planner.h"

namespace reshard {
namespace {

// Each side's window (the elements compared at a time) when the memory budget allows it.
constexpr uint64_t kChunkBytes = 16 << 20;
// ...and when either side reads remote sources: their reads go by the spans (range requests of
// a span, the next read ahead), which a shorter window does not shorten, so the spans keep the
// budget. Two sides of s3:// sources then hold 2 x 1 MiB of windows and 4 x 8 MiB of spans
// beside the ~26 MiB of the process (a conversion's kProcessMemory and a second S3 side).
constexpr uint64_t kRemoteChunkBytes = 1 << 20;
// The least span of a side with remote sources (one range request's least piece, as for a
// conversion's workers).
constexpr uint64_t kRemoteMinSpanBytes = 1 << 20;

// What a verify holds: per side a window of the elements compared at a time and, for remote
// sources, a SpanReader of two spans.
struct VerifyMemory {
  uint64_t window_bytes = 0;
  uint64_t span_bytes = 0;
};

// A verify reads as a conversion with two workers would, one per side, each filling its window
// of one side's tensors (through its spans for remote sources). So its window and spans come
// from the budget conversions share (ShareConversionMemory), planned as such a conversion of the
// whole tensors of both sides that writes nothing: with remote sources they fit in the cap
// with the process's own memory; local ones keep kChunkBytes.
absl::StatusOr<VerifyMemory> ShareVerifyMemory(const Catalog& ca, const Catalog& cb, bool remote) {
  ConversionSpec spec;
  spec.threads = 2;
  spec.window_bytes = 2 * (remote ? kRemoteChunkBytes : kChunkBytes);
  spec.skip_crc_check = true;  // verify checks no source CRC-32
  CopyPlan plan;
  for (const Catalog* side : {&ca, &cb}) {
    const int base = static_cast<int>(plan.sources.size());
    plan.sources.insert(plan.sources.end(), side->files.begin(), side->files.end());
    FilePlan file;
    for (int i = 0; i < static_cast<int>(side->tensors.size()); ++i) {
      ASSIGN_OR_RETURN(TensorCopy copy, PlanWholeTensor(*side, i, side->tensors[i].dtype));
      for (CopyItem& item : copy.items) item.src_file += base;
      file.bytes += copy.dst_bytes();
      file.segments.push_back(
          FramingSegment{FramingSegment::Kind::kTensor, "", static_cast<int>(file.tensors.size())});
      file.tensors.push_back(std::move(copy));
    }
    plan.source_bytes_read += file.bytes;
    plan.total_bytes += file.bytes;
    plan.files.push_back(std::move(file));
  }
  const ConversionMemory memory = ShareConversionMemory(spec, plan, kvstore::GetPosixDriver());
  return VerifyMemory{std::max<uint64_t>(memory.window_bytes / 2, 4096),
                      std::max(kRemoteMinSpanBytes, memory.remote_span_bytes / 2)};
}

int MantissaBits(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return 7;
    case DType::kF16:
      return 10;
    default:
      return 23;
  }
}

// The compared dtype of a pair, or nullopt when the pair is not comparable.
std::optional<DType> CompareDType(DType a, DType b) {
  if (a == b) return a;
  if (IsConvertibleFloat(a) && IsConvertibleFloat(b)) {
    return MantissaBits(a) <= MantissaBits(b) ? a : b;
  }
  return std::nullopt;
}

uint64_t LoadBits(const std::byte* p, size_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, size);  // little-endian host
  return bits;
}

bool IsNaN(DType dtype, uint64_t bits) {
  switch (dtype) {
    case DType::kF32:
      return (bits & 0x7fffffffu) > 0x7f800000u;
    case DType::kF16:
      return (bits & 0x7fffu) > 0x7c00u;
    case DType::kBF16:
      return (bits & 0x7fffu) > 0x7f80u;
    case DType::kF64:
      return (bits & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DType::kF8E4M3:
      return (bits & 0x7fu) == 0x7fu;
    case DType::kF8E5M2:
      return (bits & 0x7fu) > 0x7cu;
    case DType::kF8E8M0:
      return bits == 0xffu;
    default:
      return false;
  }
}

// The offset in its file of byte `byte` of `piece`'s bytes in row-major order (elements of
// `dtype`, stored at the piece's strides).
uint64_t FileOffset(const SourcePiece& piece, DType dtype, int64_t byte) {
  const int64_t size = static_cast<int64_t>(DTypeSize(dtype));
  const std::vector<int64_t>& extent = piece.box.extent;
  int64_t offset = 0;  // in elements
  int64_t rest = byte / size;
  int64_t dense = 1;  // the row-major stride of dimension d, for pieces without strides
  for (int d = static_cast<int>(extent.size()) - 1; d >= 0; --d) {
    const int64_t index = extent[d] > 0 ? rest % extent[d] : 0;
    rest = extent[d] > 0 ? rest / extent[d] : 0;
    offset += index * (piece.strides.empty() ? dense : piece.strides[d]);
    dense *= extent[d];
  }
  return piece.byte_offset + static_cast<uint64_t>(offset * size + byte % size);
}

// Where `tensor` of `catalog` stores element `index` (flat, row-major) compared as `dtype`:
// its file, and the offset there of byte `byte` of the element as `dtype` when the tensor is
// stored as `dtype`, of the element's first byte otherwise. {"", -1} when no piece holds it.
std::pair<std::string, int64_t> Locate(const Catalog& catalog, const CatalogTensor& tensor,
                                       int64_t index, int64_t byte, DType dtype) {
  std::vector<int64_t> at(tensor.shape.size());
  for (int d = static_cast<int>(at.size()) - 1; d >= 0; --d) {
    at[d] = tensor.shape[d] > 0 ? index % tensor.shape[d] : 0;
    index = tensor.shape[d] > 0 ? index / tensor.shape[d] : 0;
  }
  for (const SourcePiece& piece : tensor.pieces) {
    if (piece.box.rank() != at.size()) continue;
    int64_t local = 0;  // row-major in the piece's box
    bool inside = true;
    for (size_t d = 0; inside && d < at.size(); ++d) {
      const int64_t i = at[d] - piece.box.origin[d];
      inside = i >= 0 && i < piece.box.extent[d];
      local = local * piece.box.extent[d] + i;
    }
    if (!inside) continue;
    const int64_t size = static_cast<int64_t>(DTypeSize(tensor.dtype));
    const int64_t offset =
        FileOffset(piece, tensor.dtype, local * size + (tensor.dtype == dtype ? byte : 0));
    return {catalog.files[piece.file].path, offset};
  }
  return {"", -1};
}

}  // namespace

absl::StatusOr<VerifyResult> VerifyCheckpoints(const std::string& a, const std::string& b,
                                               const VerifyOptions& options) {
  ASSIGN_OR_RETURN(PartitionRules rules_a, LoadRules("", options.rules_a));
  ASSIGN_OR_RETURN(PartitionRules rules_b, LoadRules("", options.rules_b));
  ASSIGN_OR_RETURN(LoadedInput input_a,
                   LoadInput(a, std::move(rules_a), /*require_model=*/true, options.read));
  ASSIGN_OR_RETURN(LoadedInput input_b,
                   LoadInput(b, std::move(rules_b), /*require_model=*/true, options.read));
  const Catalog& ca = input_a.catalog;
  const Catalog& cb = input_b.catalog;
  ASSIGN_OR_RETURN(std::vector<MappedFile> sources_a, MapSources(ca.files));
  ASSIGN_OR_RETURN(std::vector<MappedFile> sources_b, MapSources(cb.files));
  // Remote sources are read span by span, the next span fetched while one is compared (local
  // ones through pread and the mapping, with the kernel's readahead).
  auto any_remote = [](const std::vector<MappedFile>& sources) {
    return std::any_of(sources.begin(), sources.end(),
                       [](const MappedFile& source) { return !source.mapped(); });
  };
  ASSIGN_OR_RETURN(const VerifyMemory memory,
                   ShareVerifyMemory(ca, cb, any_remote(sources_a) || any_remote(sources_b)));
  std::optional<SpanReader> spans_a, spans_b;
  if (any_remote(sources_a)) spans_a.emplace(memory.span_bytes);
  if (any_remote(sources_b)) spans_b.emplace(memory.span_bytes);

  VerifyResult result;
  result.tolerance =
      "same dtype: bit-exact (NaN == NaN); F32/F16/BF16 pairs: the finer side rounded to the "
      "coarser with round-to-nearest-even must be bit-exact";
  for (const CatalogTensor& tensor : cb.tensors) {
    if (ca.Find(tensor.name) < 0) result.only_in_b.push_back(tensor.name);
  }
  std::vector<std::byte> buffer_a, buffer_b;
  // What one side of a comparison reads, and from where.
  struct Side {
    const TensorCopy& copy;
    const std::vector<MappedFile>& sources;
    std::optional<SpanReader>& spans;
  };
  // Reads both sides window by window and counts the elements that differ (compared as
  // `dtype`; any NaN equals any NaN unless `bytewise`) into `mismatch`.
  auto compare = [&](const Side& a, const Side& b, DType dtype, bool bytewise,
                     TensorMismatch& mismatch) -> absl::Status {
    TensorFiller fill_a(a.copy, a.sources, a.spans.has_value() ? &*a.spans : nullptr);
    TensorFiller fill_b(b.copy, b.sources, b.spans.has_value() ? &*b.spans : nullptr);
    const size_t size = DTypeSize(dtype);
    return CompareInWindows(
        fill_a, fill_b, a.copy.num_elements, size,
        std::max<int64_t>(1, static_cast<int64_t>(memory.window_bytes / size)), buffer_a, buffer_b,
        options.cancelled, "verify", [&](int64_t begin, int64_t count) {
          for (int64_t i = 0; i < count; ++i) {
            const uint64_t x = LoadBits(buffer_a.data() + i * size, size);
            const uint64_t y = LoadBits(buffer_b.data() + i * size, size);
            if (x == y || (!bytewise && IsNaN(dtype, x) && IsNaN(dtype, y))) continue;
            if (mismatch.mismatches++ == 0) {
              mismatch.first_index = begin + i;
              mismatch.first_byte = static_cast<int64_t>((begin + i) * size) +
                                    __builtin_ctzll(x ^ y) / 8;  // little-endian host
              mismatch.a_value = absl::StrFormat("0x%0*x", static_cast<int>(size * 2), x);
              mismatch.b_value = absl::StrFormat("0x%0*x", static_cast<int>(size * 2), y);
            }
          }
          return true;
        });
  };
  for (int ia = 0; ia < static_cast<int>(ca.tensors.size()); ++ia) {
    const CatalogTensor& ta = ca.tensors[ia];
    const int ib = cb.Find(ta.name);
    if (ib < 0) {
      result.only_in_a.push_back(ta.name);
      continue;
    }
    const CatalogTensor& tb = cb.tensors[ib];
    ++result.tensors_compared;
    TensorMismatch mismatch;
    mismatch.name = ta.name;
    if (ta.shape != tb.shape) {
      mismatch.reason =
          absl::StrCat("shape differs: ", ShapeToString(ta.shape), " vs ", ShapeToString(tb.shape));
      result.mismatched.push_back(std::move(mismatch));
      continue;
    }
    std::optional<DType> dtype = CompareDType(ta.dtype, tb.dtype);
    if (!dtype.has_value()) {
      mismatch.reason =
          absl::StrCat("dtype differs: ", DTypeName(ta.dtype), " vs ", DTypeName(tb.dtype));
      result.mismatched.push_back(std::move(mismatch));
      continue;
    }
    ASSIGN_OR_RETURN(TensorCopy copy_a, PlanWholeTensor(ca, ia, *dtype));
    ASSIGN_OR_RETURN(TensorCopy copy_b, PlanWholeTensor(cb, ib, *dtype));
    RETURN_IF_ERROR(compare({copy_a, sources_a, spans_a}, {copy_b, sources_b, spans_b}, *dtype,
                            /*bytewise=*/false, mismatch));
    result.elements_compared += copy_a.num_elements;
    if (mismatch.mismatches > 0) {
      mismatch.reason = absl::StrCat("values differ (compared as ", DTypeName(*dtype), ")");
      const int64_t byte = mismatch.first_byte % static_cast<int64_t>(DTypeSize(*dtype));
      std::tie(mismatch.a_file, mismatch.a_offset) =
          Locate(ca, ta, mismatch.first_index, byte, *dtype);
      std::tie(mismatch.b_file, mismatch.b_offset) =
          Locate(cb, tb, mismatch.first_index, byte, *dtype);
      result.mismatched.push_back(std::move(mismatch));
    }
  }
  // The copies an input keeps of its replicated pieces (ColossalAI, FSDP, Megatron's
  // expert-parallel ranks, the tensors replicated in every model-parallel part merged with
  // partition rules), each byte by byte against the piece of its box that conversions read
  // (not counted in tensors_ or elements_compared).
  for (auto [catalog, sources, spans] :
       {std::tie(ca, sources_a, spans_a), std::tie(cb, sources_b, spans_b)}) {
    Catalog pair;  // the two copies as tensors of the box's shape
    pair.files = catalog.files;
    for (const CatalogTensor& tensor : catalog.tensors) {
      for (const SourcePiece& replica : tensor.replicas) {
        auto read =
            std::find_if(tensor.pieces.begin(), tensor.pieces.end(), [&](const SourcePiece& piece) {
              return piece.box.origin == replica.box.origin &&
                     piece.box.extent == replica.box.extent;
            });
        if (read == tensor.pieces.end()) {
          return absl::InternalError(
              absl::StrCat("tensor \"", tensor.name, "\": a replicated copy of no box it reads"));
        }
        pair.tensors.clear();
        for (const SourcePiece* piece : {&*read, &replica}) {
          pair.tensors.push_back(
              CatalogTensor{tensor.name, tensor.dtype, piece->box.extent, {*piece}, {}});
          pair.tensors.back().pieces[0].box.origin.assign(piece->box.extent.size(), 0);
        }
        ASSIGN_OR_RETURN(TensorCopy first, PlanWholeTensor(pair, 0, tensor.dtype));
        ASSIGN_OR_RETURN(TensorCopy copy, PlanWholeTensor(pair, 1, tensor.dtype));
        TensorMismatch mismatch;
        mismatch.name = absl::StrCat(tensor.name, " (replicated copy in ",
                                     catalog.files[replica.file].path, ")");
        RETURN_IF_ERROR(compare({first, sources, spans}, {copy, sources, spans}, tensor.dtype,
                                /*bytewise=*/true, mismatch));
        if (mismatch.mismatches > 0) {
          mismatch.a_file = catalog.files[read->file].path;
          mismatch.a_offset = FileOffset(*read, tensor.dtype, mismatch.first_byte);
          mismatch.b_file = catalog.files[replica.file].path;
          mismatch.b_offset = FileOffset(replica, tensor.dtype, mismatch.first_byte);
          mismatch.reason = absl::StrCat(
              "values differ from the copy read, in ", catalog.files[read->file].path,
              "; first differing byte: byte ", mismatch.first_byte, " of the copies (offset ",
              FileOffset(replica, tensor.dtype, mismatch.first_byte), " of ",
              catalog.files[replica.file].path, ", offset ",
              FileOffset(*read, tensor.dtype, mismatch.first_byte), " of ",
              catalog.files[read->file].path, ")");
          result.mismatched.push_back(std::move(mismatch));
        }
      }
    }
  }
  result.equal = result.mismatched.empty() && result.only_in_a.empty() && result.only_in_b.empty();
  return result;
}

}  // namespace reshard
