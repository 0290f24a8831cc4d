// Frames torch.save archives inside output files: the zip layout torch.save writes (stored
// records whose payloads start 64-byte aligned behind an "FB" padding field, data descriptors,
// ZIP64 end records, real CRC-32s) around a pickle and the storages the Executor fills.
//
// A file may hold several archives back to back (a DCP `.distcp` file is the concatenation of
// one archive per write item); each archive's zip offsets are relative to its own first byte,
// as torch.save writes them onto a stream. The records are torch.save's: `<top>/data.pkl`,
// `<top>/byteorder`, `<top>/data/<key>` per storage (keys "0", "1", ... in the order given) and
// `<top>/version`. `.format_version` and `.storage_alignment` are not written, so torch reads
// every offset from the headers.

#ifndef RESHARD_LIB_FORMATS_TORCH_TORCH_ARCHIVE_WRITER_H_
#define RESHARD_LIB_FORMATS_TORCH_TORCH_ARCHIVE_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/catalog.h"
#include "lib/core/dtype.h"
#include "lib/formats/torch/pickle_writer.h"
#include "lib/plan/layout.h"

namespace reshard {

// The legacy storage class torch.save uses for `dtype` ("FloatStorage"); Unimplemented naming
// `tensor` for dtypes that need UntypedStorage (_rebuild_tensor_v3).
absl::StatusOr<std::string> TorchStorageClass(DType dtype, absl::string_view tensor);
// The torch dtype global of `dtype` ("bfloat16", as in `torch.bfloat16`); the same dtypes.
absl::StatusOr<std::string> TorchDTypeGlobal(DType dtype, absl::string_view tensor);

// Pickles `node` (a checkpoint's nesting, see StructureNode) into `pickle`: kTensor leaves are
// looked up by name in `tensor_index` and written by `write_tensor`; Python objects are written
// as their REDUCE / NEWOBJ / BUILD. InvalidArgument for a global that cannot be pickled.
absl::Status PickleStructure(const StructureNode& node,
                             const absl::flat_hash_map<std::string, int>& tensor_index,
                             const std::function<absl::Status(int)>& write_tensor,
                             PickleWriter& pickle);

// Lays out torch.save archives one after the other in one output file, then hands the
// FileFraming to the engine.
class TorchArchiveFramer {
 public:
  TorchArchiveFramer();

  // Appends an archive with top folder `top` (torch names it after the file; "archive" for a
  // stream) holding `pickle` as data.pkl and, as `data/<i>`, the data of the file's tensor
  // `storages[i]` (an index into OutputFileLayout::tensors, `storage_bytes[i]` bytes).
  // Returns the archive's byte offset in the file.
  uint64_t Add(absl::string_view top, std::string pickle, const std::vector<int>& storages,
               const std::vector<uint64_t>& storage_bytes);

  // Bytes of the archives added so far.
  uint64_t size() const { return cursor_; }

  // The framing of the whole file. The framer is spent.
  FileFraming Finish();

 private:
  struct Archive;
  std::shared_ptr<std::vector<Archive>> archives_;
  // Per kDeferred id: (archive, record) for a data descriptor, (archive, -1) for end records.
  std::shared_ptr<std::vector<std::pair<int, int>>> deferred_;
  std::vector<FramingSegment> segments_;
  uint64_t cursor_ = 0;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_TORCH_TORCH_ARCHIVE_WRITER_H_
