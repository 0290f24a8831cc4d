// A tar archive's members as a read-only storage location (a kvstore driver, scheme "tar"), so
// that a reader of folders runs unchanged on a folder inside an archive: a `.nemo` whose
// weights are a `model_weights/` torch_dist folder is read by the torch_dist reader through
// "tar://<archive>!/model_weights".
//
//   ASSIGN_OR_RETURN(std::unique_ptr<MountedTar> mount, MountedTar::Mount("s3://b/m.nemo"));
//   TorchDistInput().Read(mount->PathOf("model_weights"), options);
//
// While a MountedTar lives, "tar://<archive>!/<member>" names member <member> (normalized as
// TarArchive names it) of the archive, whatever the archive's own driver (posix, s3, mem): a
// regular member is a file of the member's size, a member's parent names a folder (whether or
// not the archive holds a header for it), and "tar://<archive>!" is the archive's root folder.
// A read of a member is a read of the archive at the member's data offset through the
// archive's own driver (a mapping or pread of a local archive, a range request of a remote one,
// pinned to the version listed). Nothing is unpacked; a remote archive's small members (at most
// 64 KiB each, 4 MiB in all: configs, metadata) are loaded at Mount in few requests and read
// from memory, the rest read where it lies.
// Links and special members are listed as neither files nor folders (Stat's `special`), so
// readers refuse them by name; their targets are never followed.
//
// The location is read-only: writes and deletes are PermissionDenied. Only archives a reader
// mounted are served: any other "tar://" path is NotFound, and ConfinedPath refuses every
// "tar://" path, so a user's path (reshardd's allowed roots) never names one.

#ifndef RESHARD_LIB_FORMATS_NEMO_TAR_STORE_H_
#define RESHARD_LIB_FORMATS_NEMO_TAR_STORE_H_

#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/formats/nemo/tar_archive.h"
#include "lib/io/byte_source.h"
#include "lib/io/kvstore/driver.h"
#include "lib/io/mapped_file.h"

namespace reshard {

// An archive opened and listed, served under "tar://<archive>!" until destroyed.
class MountedTar {
 public:
  // Opens `archive` (a path of any driver) and lists its members (TarArchive's errors: a
  // truncated archive, a member leaving it, ... name the archive and member).
  static absl::StatusOr<std::unique_ptr<MountedTar>> Mount(const std::string& archive);
  ~MountedTar();
  MountedTar(const MountedTar&) = delete;
  MountedTar& operator=(const MountedTar&) = delete;

  // "tar://<archive>!": the archive's root folder.
  const std::string& root() const { return root_; }
  // The path of member (or folder) `name`: "tar://<archive>!/<name>".
  std::string PathOf(absl::string_view name) const;
  // The member `path` (a path under root()) names, normalized; NotFound naming `path` when it
  // is not under root().
  absl::StatusOr<std::string> MemberOf(absl::string_view path) const;

  const TarArchive& tar() const { return tar_; }
  // The archive file (its path, size and version) and a byte source over it for parsers.
  const MappedFile& file() const { return *file_; }
  ByteSource& source() const { return *source_; }

  // The driver's view: what `name` (normalized) is, and what folder `name` holds.
  absl::StatusOr<kvstore::PathStat> Stat(const std::string& path, const std::string& name) const;
  absl::StatusOr<kvstore::Listing> List(const std::string& path, const std::string& name) const;
  absl::Status ReadRange(const std::string& path, const std::string& name, uint64_t offset,
                         absl::Span<char> out) const;

 private:
  MountedTar() = default;

  std::string root_;
  std::unique_ptr<MappedFile> file_;
  std::unique_ptr<ByteSource> source_;
  TarArchive tar_;
  // A remote archive's members at most this large are loaded at Mount, up to kMaxHeldBytes in
  // all, and read from memory.
  static constexpr uint64_t kMaxHeldMemberBytes = 64 << 10;
  static constexpr uint64_t kMaxHeldBytes = 4 << 20;

  // Every folder ("" the root) and what it holds directly.
  std::map<std::string, kvstore::Listing> folders_;
  // The members loaded at Mount (a remote archive's small ones), by name.
  std::set<std::string> held_;
};

// The driver of "tar://" paths: the MountedTar objects alive, by root. Thread safe.
class TarStore final : public kvstore::Driver {
 public:
  static constexpr char kScheme[] = "tar";
  absl::string_view scheme() const override { return kScheme; }
  absl::StatusOr<std::string> ConfinedPath(const std::string& path, bool must_exist) const override;
  absl::StatusOr<kvstore::PathStat> Stat(const std::string& path) const override;
  absl::StatusOr<kvstore::Listing> List(const std::string& path) const override;
  absl::Status ReadRange(const std::string& path, uint64_t offset, absl::Span<char> out,
                         const kvstore::PathStat& opened) const override;
  absl::Status CreateExclusive(const std::string& path, absl::string_view bytes) const override;
  absl::StatusOr<std::unique_ptr<kvstore::Writer>> Write(
      const std::string& path, const kvstore::WriteOptions& options) const override;
  absl::Status Delete(const std::string& path) const override;
};

}  // namespace reshard

#endif  // RESHARD_LIB_FORMATS_NEMO_TAR_STORE_H_
