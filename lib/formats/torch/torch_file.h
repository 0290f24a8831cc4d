// One torch.save archive opened for its metadata: the object tree of its data.pkl, and where
// each tensor in that tree lives in the archive's bytes.
//
// This is the layer the torch reader and every format built from torch.save files (DeepSpeed
// ZeRO, Megatron, PyTorch DCP chunks) share. Nothing is loaded: a tensor is located as (byte
// offset, dtype, shape, element strides) inside the bytes the archive was parsed from, checked
// to lie inside its storage record. Navigation helpers read the plain values that checkpoints
// keep next to their tensors (ints, shapes, string-keyed dicts, dataclass fields).

#ifndef RESHARD_LIB_FORMATS_TORCH_TORCH_FILE_H_
#define RESHARD_LIB_FORMATS_TORCH_TORCH_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/formats/torch/pickle.h"
#include "lib/formats/torch/zip_archive.h"
#include "lib/io/byte_source.h"

namespace reshard {

// Where a tensor's elements are: element i (a multi-index) is at
// `byte_offset + sum_d(i[d] * strides[d]) * DTypeSize(dtype)` of the parsed bytes.
struct TensorLocation {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<int64_t> strides;
  uint64_t byte_offset = 0;
  std::string storage_key;  // the storage record ("0", "1", ...), shared by views of it
};

class TorchArchive {
 public:
  // Parses the torch.save archive in `bytes` (a whole file, or a slice of one such as a DCP
  // chunk; offsets are relative to `bytes`), runs its data.pkl with the safe pickle VM and
  // indexes its storages. `path` names it in errors. The bytes are not kept. The legacy
  // (pre-1.6, non-zip) format is refused as Unimplemented with the reason.
  static absl::StatusOr<std::unique_ptr<TorchArchive>> Parse(absl::string_view bytes,
                                                             const std::string& path);
  // The same for the whole file `source` (a mapped local file, or range reads of a remote
  // one: the zip's end records and central directory, the local headers, and data.pkl; see
  // ZipArchive). Its path names it in errors.
  static absl::StatusOr<std::unique_ptr<TorchArchive>> Parse(ByteSource& source);
  // The same, reading the zip's last `zip_tail_bytes` first (ZipArchive::ParseOptions::
  // tail_bytes): for archives whose ends the caller prefetched.
  static absl::StatusOr<std::unique_ptr<TorchArchive>> Parse(ByteSource& source,
                                                             uint64_t zip_tail_bytes);
  // Opens the file at `path` (local: mapped; remote: range reads), parses it, and gives the
  // mapped pages back.
  static absl::StatusOr<std::unique_ptr<TorchArchive>> Open(const std::string& path);

  const PickleValue* root() const { return root_; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // bytes parsed (the file size for Open)
  size_t pickle_values() const { return arena_.size(); }
  // The memory its parsed values hold (what their parse charged; PickleArena::charged).
  uint64_t metadata_bytes() const { return arena_.charged(); }

  // The tensor `value` stands for (a rebuilt tensor, a Parameter, or a tensor subclass such as
  // DeepSpeed's flat groups with Python attributes), or nullopt when `value` is not a tensor.
  // DataLoss naming `name` when it is a tensor whose view leaves its storage or is malformed;
  // Unimplemented for tensor kinds that cannot be located (quantized, sparse, ...).
  absl::StatusOr<std::optional<TensorLocation>> Tensor(const PickleValue* value,
                                                       absl::string_view name) const;
  // Whether `value` is a tensor (cheap; no checks).
  static bool IsTensor(const PickleValue* value);

  // The storage records of the archive with the CRC-32s its central directory gives them, at
  // `base` plus their offset in the parsed bytes (`base` places an archive embedded in a larger
  // file, such as a DCP chunk). The Executor checks those it reads from.
  std::vector<ChecksummedRange> ChecksummedRanges(uint64_t base = 0) const;
  // The source file of a whole-file archive (Open, or Parse of a whole file): its path, size,
  // checksummed storage records and, opened remote, its version (SourceFile::version).
  SourceFile Source() const;

 private:
  struct Storage {
    std::string key;
    std::optional<DType> dtype;  // none for UntypedStorage (the tensor gives its dtype)
    int64_t numel = 0;
    uint64_t data_offset = 0;
    uint64_t size = 0;
    uint32_t crc32 = 0;      // of the record, from the central directory
    std::string entry_name;  // the record's zip entry, "<top>/data/<key>"
  };
  absl::StatusOr<PickleValue*> LoadStorage(PickleValue* pid, PickleArena& arena,
                                           const ZipArchive& archive);

  std::string path_;
  uint64_t size_ = 0;
  std::string version_;  // MappedFile::version of the file Open parsed
  PickleArena arena_;
  const PickleValue* root_ = nullptr;
  absl::flat_hash_map<std::string, Storage> storages_;
};

// The Catalog tensor `name` held whole by `location` in source file `file` (one piece).
CatalogTensor CatalogTensorAt(std::string name, TensorLocation location, int file);

// The first bytes of a pre-1.6 torch.save file (PROTO 2, then LONG1 of the magic number).
inline constexpr char kLegacyTorchMagic[] =
    "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
inline constexpr size_t kLegacyTorchMagicSize = 14;

// Whether `head` (the first 32 bytes of a file, or fewer) starts a pre-1.6 torch.save file:
// PROTO, an optional FRAME (pickle protocol >= 4), then LONG1 of torch's magic number.
bool IsLegacyTorchSave(absl::string_view head);

// dtype of a typed storage class name ("FloatStorage") or a torch dtype global ("bfloat16").
std::optional<DType> TorchDType(absl::string_view name);

// --- Reading plain values out of a pickle tree. All return null / nullopt on a mismatch. ---

// The value under string key `key` of a dict, an OrderedDict, or an object's BUILD state dict
// (dataclasses, argparse.Namespace): `obj.key` in Python.
const PickleValue* PickleField(const PickleValue* value, absl::string_view key);
// An int, a bool, or an int Enum rebuilt from one int (DeepSpeed's ZeroStageEnum(3)).
std::optional<int64_t> PickleInt(const PickleValue* value);
std::optional<std::string> PickleString(const PickleValue* value);
// A torch.Size, tuple or list of non-negative ints.
std::optional<std::vector<int64_t>> PickleShape(const PickleValue* value);
// The (key, value) entries of a dict or a dict subclass (OrderedDict); null when not a dict.
const std::vector<std::pair<PickleValue*, PickleValue*>>* PickleEntries(const PickleValue* value);
// The items of a list or tuple; null otherwise.
const std::vector<PickleValue*>* PickleItems(const PickleValue* value);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_TORCH_FILE_H_
