// Target layouts (what the output should look like) and the copy plan (how to produce it).
//
// A TargetLayout lists output files, each with the tensors it holds: a region (box) of a global
// tensor of the Catalog, in an output dtype. A Writer turns each output file into a FileFraming:
// the bytes it owns (headers) and where each tensor's data goes. The Planner then intersects
// every output region with the Catalog's source pieces and produces the CopyPlan that the
// Executor runs. None of these types know any file format.

#ifndef RESHARD_LIB_PLAN_LAYOUT_H_
#define RESHARD_LIB_PLAN_LAYOUT_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"

namespace reshard {

// File names chosen by the output Writer (each OutputFormat supplies its own).
struct OutputNaming {
  // Name of shard `index` (0-based) of `count` consolidated files.
  std::function<std::string(int index, int count)> shard_file;
  // Name of model-parallel part `rank` of `parts`.
  std::function<std::string(int rank, int parts)> part_file;
};

// One tensor of an output file: `region` of the Catalog tensor `source`, stored densely
// (row-major) under `name` in `dtype`. Its shape is region.extent.
struct OutputTensor {
  std::string name;
  int source = 0;  // index into Catalog::tensors
  Box region;
  DType dtype = DType::kF32;
  // Index of an earlier tensor of the same file holding the very same data (tied weights), or
  // -1. Writers store the data once: safetensors records the alias in its metadata, torch
  // shares one storage. The Executor writes no data for aliases.
  int alias_of = -1;
  // The shape the tensor is written with, when it differs from region.extent: a region of a
  // fused tensor's [blocks, block size, ...] view is written flattened (same elements, same
  // order). Empty: region.extent.
  Shape written_shape;
  // The region may reach beyond the source tensor's shape; the elements outside it are written
  // as zeros. (A Megatron vocabulary padded again for another tensor-parallel degree gets zero
  // rows appended.) Without it a region outside the shape is an internal error.
  bool zero_fill = false;
  // When not empty, the data is the element-wise mean of `region` of these Catalog tensors
  // (float32, same shape; `source` is the first), computed as PyTorch's
  // `sum(slices) / len(slices)` does: ((0 + t0) + t1 + ...) / n, each step rounded to float32.
  // (DeepSpeed's ds_to_universal merges the tensor-parallel slices of some parameters so.)
  std::vector<int> mean_of;
  // The shape of the whole tensor `region` is a box of, for formats whose files record each
  // chunk's place in it (PyTorch DCP's `.metadata`). Set by such a format's Arrange; empty
  // otherwise.
  Shape global_shape;

  const Shape& shape() const { return written_shape.empty() ? region.extent : written_shape; }

  uint64_t bytes() const {
    return static_cast<uint64_t>(NumElementsUnchecked(region.extent)) * DTypeSize(dtype);
  }
};

struct OutputFileLayout {
  std::string name;  // file name inside the output folder
  std::vector<OutputTensor> tensors;
  // String metadata for writers whose format can carry it (safetensors `__metadata__`).
  std::map<std::string, std::string> metadata;
  // The input's nesting, for writers that reproduce it (torch), when this one file holds the
  // whole model under the input's names; null otherwise.
  std::shared_ptr<const StructureNode> structure;
  // The file is the bytes of its one tensor and nothing else (an input file copied verbatim,
  // see AddVerbatimCopy): the engine frames it, not the OutputFormat.
  bool verbatim = false;
};

struct TargetLayout {
  // kConsolidated: the files together hold one model (shards). kParts: each file is one
  // model-parallel part holding a slice of every tensor.
  enum class Kind { kConsolidated, kParts };
  Kind kind = Kind::kConsolidated;
  std::vector<OutputFileLayout> files;
  // Small files an OutputFormat's Arrange composes from the input (an hf output's config.json),
  // (name, contents): its CompanionFiles returns them with the others.
  std::vector<std::pair<std::string, std::string>> format_files;
};

// How the Writer lays out one output file: a sequence of segments written front to back.
// Writers own the bytes of kBytes segments (headers, padding); kTensor segments are filled by
// the Executor with the dense data of `OutputFileLayout::tensors[tensor]`. A kDeferred segment
// has a known size, but its bytes depend on the data written before it (zip data descriptors
// and central directories carry CRC-32s): the Executor asks the framing's `deferred` for them
// when it reaches the segment.
struct FramingSegment {
  enum class Kind { kBytes, kTensor, kDeferred };
  Kind kind = Kind::kBytes;
  std::string bytes;  // kBytes
  int tensor = -1;    // kTensor
  uint64_t size = 0;  // kDeferred
  int deferred = -1;  // kDeferred: the id passed to FileFraming::deferred
};

// CRC-32 (IEEE, as zlib computes it) of each tensor's bytes as written, indexed like
// OutputFileLayout::tensors; entries of tensors not written yet are 0.
using TensorChecksums = std::vector<uint32_t>;

struct FileFraming {
  std::vector<FramingSegment> segments;
  // Produces a kDeferred segment's bytes (exactly its size). Needed when there are any.
  std::function<std::string(int deferred, const TensorChecksums& crc32)> deferred;
  // Whether the Executor must compute TensorChecksums (costs a pass over the data).
  bool needs_crc32 = false;
};

// A box copy from one source piece into one output tensor. Element `i` of `extent` is read at
// byte `src_offset + sum(i[d] * src_strides[d]) * source element size` of `sources[src_file]`
// and written at element `dst_offset + sum(i[d] * dst_strides[d])` of the output tensor.
// Dimensions are collapsed where both sides are contiguous, so the last dimension is the
// longest run; dst_strides are decreasing and the items of a tensor never overlap.
struct CopyItem {
  int src_file = 0;
  uint64_t src_offset = 0;
  std::vector<int64_t> extent;
  std::vector<int64_t> src_strides;
  int64_t dst_offset = 0;
  std::vector<int64_t> dst_strides;

  // Elements of the box.
  uint64_t num_elements() const {
    uint64_t elements = 1;
    for (int64_t e : extent) elements *= static_cast<uint64_t>(std::max<int64_t>(e, 0));
    return elements;
  }
  // One past the last source byte the box reads (its elements of `element_size` bytes), for
  // a box of at least one element: [src_offset, src_end) holds every byte it reads, and the
  // bytes between its rows when it is strided.
  uint64_t src_end(uint64_t element_size) const {
    uint64_t last = 0;  // element offset of the last element, from the first
    for (size_t d = 0; d < extent.size(); ++d) {
      last += static_cast<uint64_t>(std::max<int64_t>(extent[d] - 1, 0)) *
              static_cast<uint64_t>(src_strides[d]);
    }
    return src_offset + (last + 1) * element_size;
  }
};

// Everything needed to produce the dense data of one output tensor.
struct TensorCopy {
  std::string name;
  DType src_dtype = DType::kF32;
  DType dst_dtype = DType::kF32;
  int64_t num_elements = 0;
  std::vector<CopyItem> items;
  // The items cover only part of the tensor (OutputTensor::zero_fill): every other element is 0.
  bool zero_fill = false;
  // OutputTensor::mean_of: the copies of the other terms (the first is this one's items); the
  // executor adds them element by element in order and divides by their count.
  std::vector<TensorCopy> mean_terms;

  uint64_t dst_bytes() const { return num_elements * DTypeSize(dst_dtype); }
};

struct FilePlan {
  std::string name;
  std::vector<FramingSegment> segments;  // kTensor segments index `tensors`
  std::vector<TensorCopy> tensors;
  uint64_t bytes = 0;  // total file size
  std::function<std::string(int deferred, const TensorChecksums& crc32)> deferred;
  bool needs_crc32 = false;
};

struct CopyPlan {
  std::vector<SourceFile> sources;
  std::vector<FilePlan> files;
  uint64_t total_bytes = 0;        // bytes of all output files
  uint64_t source_bytes_read = 0;  // bytes of source data the plan reads
};

}  // namespace reshard

#endif  // RESHARD_LIB_PLAN_LAYOUT_H_
