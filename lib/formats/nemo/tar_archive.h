// A tar archive (POSIX ustar, GNU long names, pax extended headers) read in place: its members
// listed with the byte range of their data inside the archive, never unpacked.
//
// NeMo 1 saves a model as a `.nemo` tar (members usually prefixed "./"): a reader serves each
// member it needs as a range of the archive's bytes (SliceByteSource for parsing, and Catalog
// pieces at the member's data offset of the archive for the conversion), so the archive is read
// from a local disk, memory or S3 alike.
//
// Each 512-byte header is read through a ByteSource and checked before it is trusted: its
// checksum, its octal (or GNU base-256) size, and its data against the archive's end. A GNU
// `L`/`K` header gives the next member's long name / link name; a pax `x` header its `path`,
// `linkpath` and `size` (sizes past 8 GiB); pax `g` headers are skipped. Names are normalized
// ("./a//b" -> "a/b"; the "./" folder itself is dropped). Refused, before any member is used:
//   - a header whose checksum does not match, a malformed number, a member whose data (or the
//     archive's end-of-archive blocks) pass the archive's end: DataLoss naming the member and
//     the byte offset ("truncated archive");
//   - a name that leaves the archive (absolute, or with a ".." component), or an empty one:
//     InvalidArgument naming the member;
//   - two members of the same name: InvalidArgument naming both offsets;
//   - more than kMaxMembers members, a long name or pax header past its cap: ResourceExhausted.
// Links and special files are listed (kind) but are not files: File() refuses them by name.

#ifndef RESHARD_LIB_FORMATS_NEMO_TAR_ARCHIVE_H_
#define RESHARD_LIB_FORMATS_NEMO_TAR_ARCHIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/byte_source.h"

namespace reshard {

struct TarMember {
  enum class Kind { kFile, kFolder, kSymlink, kHardlink, kOther };
  std::string name;  // normalized: "model_weights/metadata.json"
  Kind kind = Kind::kFile;
  uint64_t header_offset = 0;  // the member's first header (its long-name or pax one included)
  uint64_t data_offset = 0;    // where its bytes start in the archive
  uint64_t size = 0;           // its bytes (0 for folders and links)
  std::string link_target;     // links: what they point at
};

class TarArchive {
 public:
  static constexpr uint64_t kBlock = 512;
  static constexpr uint64_t kMaxMembers = 1'000'000;
  static constexpr uint64_t kMaxLongNameBytes = 64 << 10;
  static constexpr uint64_t kMaxPaxBytes = 1 << 20;

  // Lists the members of the archive in `source` (its path names it in messages). Errors as
  // above.
  static absl::StatusOr<TarArchive> Parse(ByteSource& source);

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // In archive order.
  const std::vector<TarMember>& members() const { return members_; }
  // The member named `name` (normalized), or nullptr.
  const TarMember* Find(absl::string_view name) const;
  // The regular file `name`: NotFound naming the archive and member when absent;
  // InvalidArgument when it is a folder, a link or a special file (a link is never followed).
  absl::StatusOr<const TarMember*> File(absl::string_view name) const;
  // The member's name as messages give it: "<archive> member <name>".
  std::string Describe(const TarMember& member) const;

 private:
  std::string path_;
  uint64_t size_ = 0;
  std::vector<TarMember> members_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

// `name` normalized as TarArchive does ("./a//b/" -> "a/b", "./" -> ""): InvalidArgument when it
// is absolute or has a ".." component.
absl::StatusOr<std::string> NormalizeTarName(absl::string_view name);

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_NEMO_TAR_ARCHIVE_H_
