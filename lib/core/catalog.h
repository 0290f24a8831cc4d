// The Catalog: what a checkpoint holds, independent of its file format.
//
// A Reader turns input files into a Catalog by reading metadata only. For every global tensor
// the Catalog lists its name, dtype, global shape and the source pieces that hold its data. A
// piece is an N-d box of the global tensor stored at (file, byte offset, element strides), so
// tensor-parallel shards, DCP chunks and strided torch views are all pieces. Flat element ranges
// (ZeRO partitions of the flattened tensor) are added with `AddFlatRangePieces`, which expresses
// them as at most 2*rank-1 boxes; the planner and executor only ever see boxes.

#ifndef RESHARD_LIB_CORE_CATALOG_H_
#define RESHARD_LIB_CORE_CATALOG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "lib/core/dtype.h"
#include "lib/core/shape.h"

namespace reshard {

// A byte range of an input file whose CRC-32 the input records: a stored zip entry of a
// torch.save archive. The Executor checks the CRC-32 of every range it reads data from.
struct ChecksummedRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t crc32 = 0;  // IEEE, as zlib computes it
  // What the range is, for messages, in the format's words: `zip entry "archive/data/0"`.
  std::string name;
};

// One input file. The Executor maps it read-only; `size` bounds every piece located in it.
struct SourceFile {
  std::string path;
  uint64_t size = 0;
  // Ranges of the file with a recorded CRC-32, any order; empty for formats without them.
  std::vector<ChecksummedRange> checksummed;
  // The version of the file whose metadata the reader read (kvstore::PathStat::version, S3's
  // ETag); empty for posix files and drivers without versions. The Executor opens the file
  // only when it is still that version: the pieces above describe that version's bytes.
  std::string version;
};

// A box of a global tensor stored in one file. Element `box.origin + i` (i within box.extent)
// is at byte `byte_offset + sum_d(i[d] * strides[d]) * DTypeSize(dtype)` of `files[file]`.
struct SourcePiece {
  int file = 0;
  uint64_t byte_offset = 0;
  Box box;
  std::vector<int64_t> strides;  // in elements; row-major dense for safetensors
};

struct CatalogTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<SourcePiece> pieces;
  // Further copies of pieces that the input stores more than once (replicated parameters, one
  // in every tensor-parallel rank's file: ColossalAI's, and those of parts merged by
  // MergeParts): conversions never read them;
  // `verify` compares each with the piece of the same box.
  std::vector<SourcePiece> replicas;
};

// The nesting of a checkpoint whose tensors sit in containers among other values (a torch
// checkpoint: {"model": {...}, "optimizer": {...}, "step": 10}), for writers that can
// reproduce it. Tensors are kTensor leaves that name a Catalog tensor.
//
// Training checkpoints also hold Python objects that a checkpoint meant to resume training must
// carry over verbatim: Megatron's `args` (an argparse.Namespace holding torch.float16),
// DeepSpeed's loss scaler, torch.Size, enums. Those are kGlobal (a module-level name such as
// torch.float16) and kObject (a callable global applied to arguments, as pickle's REDUCE and
// NEWOBJ make them, then optionally given a state by BUILD). Only writers that run pickles
// (torch) can reproduce them.
struct StructureNode {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kTensor,
    kDict,
    kList,
    kTuple,
    kBytes,   // `text` holds the bytes
    kBigInt,  // an int beyond int64: `text` holds its little-endian two's complement bytes
    kGlobal,  // `module`.`name`, e.g. torch.float16
    kObject,  // `module`.`name`(*args), then APPENDs (`items`), SETITEMs, BUILD (`state`)
  };
  // How a kObject was made: callable(*args) (REDUCE), or cls.__new__(cls, *args) (NEWOBJ, what
  // pickle protocol 2 uses for instances of ordinary classes).
  enum class Construction { kReduce, kNewObj };
  Kind kind = Kind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;                   // kString, kBytes, kBigInt; the tensor's name for kTensor
  bool ordered = false;               // kDict: an OrderedDict
  std::vector<StructureNode> keys;    // kDict, kObject (SETITEMs), paired with `values`
  std::vector<StructureNode> values;  // kDict, kObject
  std::vector<StructureNode> items;   // kList, kTuple, kObject (APPENDs)
  std::string module;                 // kGlobal; kObject: its callable
  std::string name;                   // kGlobal; kObject: its callable
  Construction construction = Construction::kReduce;  // kObject
  std::vector<StructureNode> args;                    // kObject: the call's arguments
  // kObject, kDict: empty, or the one state given by BUILD (an object's attributes; an
  // OrderedDict's attributes such as a torch state dict's `_metadata`).
  std::vector<StructureNode> state;

  // Leaves and an empty dict, for writers that build structures.
  static StructureNode Int(int64_t value) {
    StructureNode node;
    node.kind = Kind::kInt;
    node.integer = value;
    return node;
  }
  static StructureNode Bool(bool value) {
    StructureNode node;
    node.kind = Kind::kBool;
    node.boolean = value;
    return node;
  }
  static StructureNode String(std::string text) {
    StructureNode node;
    node.kind = Kind::kString;
    node.text = std::move(text);
    return node;
  }
  static StructureNode Tensor(std::string tensor_name) {
    StructureNode node;
    node.kind = Kind::kTensor;
    node.text = std::move(tensor_name);
    return node;
  }
  static StructureNode Dict(bool ordered = false) {
    StructureNode node;
    node.kind = Kind::kDict;
    node.ordered = ordered;
    return node;
  }
  // kDict: appends `key` -> `value`.
  void Add(StructureNode key, StructureNode value) {
    keys.push_back(std::move(key));
    values.push_back(std::move(value));
  }
  // kDict: the value of the string key `key`; null when absent or not a dict.
  const StructureNode* Find(absl::string_view key) const;
  StructureNode* Find(absl::string_view key);
  // The attributes of an instance: a kDict itself, or a kObject's dict BUILD state (an
  // argparse.Namespace, a dataclass); null otherwise.
  const StructureNode* Attributes() const;
  StructureNode* Attributes();
};

struct Catalog {
  std::string format;  // the Reader's id, e.g. "safetensors"
  std::vector<SourceFile> files;
  std::vector<CatalogTensor> tensors;  // in the input's order (file order, then offset order)
  // String metadata carried from the input (safetensors `__metadata__`), for writers that can
  // hold it and for `inspect`.
  std::map<std::string, std::string> metadata;
  // Entries of the input that are not tensors (a torch checkpoint's step counters, configs,
  // optimizer hyper-parameters), as "dotted.name: description", for `inspect` and for writers
  // that can carry them.
  std::vector<std::string> other_entries;
  // How tensors and other values nest in the input, when the format has such a thing (torch);
  // null for flat formats.
  std::shared_ptr<const StructureNode> structure;

  // Index of a tensor by name, or -1.
  int Find(absl::string_view name) const;
  // Rebuilds the name index; call after adding or reordering tensors.
  void Reindex();

 private:
  absl::flat_hash_map<std::string, int> index_;
};

// Appends to `tensor` the pieces holding flat elements [begin, end) of the row-major
// flattening of the tensor, stored contiguously from `byte_offset` of `file`.
// Precondition: 0 <= begin <= end <= number of elements of tensor.shape.
void AddFlatRangePieces(CatalogTensor& tensor, int file, uint64_t byte_offset, int64_t begin,
                        int64_t end);

// Checks what the planner relies on: files exist in the list, boxes lie inside their tensor,
// strides are non-negative and every piece's bytes and checksummed range lie inside its file.
// DataLoss naming the file, tensor (or range) and byte offset otherwise.
absl::Status ValidateCatalog(const Catalog& catalog);

// StructureNode::Find on a node that may be null.
inline const StructureNode* FindKey(const StructureNode* dict, absl::string_view key) {
  return dict == nullptr ? nullptr : dict->Find(key);
}
inline StructureNode* FindKey(StructureNode* dict, absl::string_view key) {
  return dict == nullptr ? nullptr : dict->Find(key);
}

// An int (or bool, as 0 / 1) value of `dict` (an args Namespace's attributes); nullopt when
// absent, None or another kind.
std::optional<int64_t> IntAttribute(const StructureNode* dict, absl::string_view key);

// StructureNode as JSON (the form safetensors output carries in `__metadata__`, so that
// nesting survives a trip through safetensors), and back.
// Scalars are tagged: {"int": 3}, {"float": 0.5}, {"str": "x"}, {"bool": true}, {"none": 0},
// {"tensor": "name"}; containers: {"dict": [[key, value], ...], "ordered": true},
// {"list": [...]}, {"tuple": [...]}. JSON has no infinities or NaN: those floats are
// {"float": "inf"}, {"float": "-inf"}, {"float": "nan"}. Bytes and big ints are hex:
// {"bytes": "00ff"}, {"bigint": "<little-endian two's complement bytes>"}; a global is
// {"global": [module, name]}; an object is {"object": {"callable": [module, name],
// "newobj": false, "args": [...], "items": [...], "dict": [[key, value], ...], "state": node}}
// ("items", "dict" and "state" only when present), and a dict with a BUILD state carries
// "state" too. Parsing is depth- and size-bounded; InvalidArgument on anything else.
std::string StructureToJson(const StructureNode& node);
absl::StatusOr<StructureNode> StructureFromJson(absl::string_view json);

// For each tensor, the index of the first earlier tensor that is the very same data (same
// dtype, shape and pieces: tied weights saved as one storage), or -1.
std::vector<int> FindAliases(const Catalog& catalog);

// Bytes of a tensor's data in its dtype: elements x element size.
uint64_t TensorBytes(const CatalogTensor& tensor);

}  // namespace reshard

#endif  // RESHARD_LIB_CORE_CATALOG_H_
