#include "lib/io/scratch_copy.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

// Opens an unlinked 0600 file in `dir`: O_TMPFILE where the filesystem has it, else a
// mkstemp name removed at once. The file's descriptor, or the errno's status.
absl::StatusOr<int> OpenUnlinkedFile(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  // Filesystems without O_TMPFILE answer EOPNOTSUPP (EISDIR or EINVAL on older kernels).
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
    return ErrnoToStatus(errno, absl::StrCat("creating a scratch file in ", dir));
  }
  std::string name = absl::StrCat(dir, "/.reshard-scratch-XXXXXX");
  fd = ::mkostemp(name.data(), O_CLOEXEC);  // mode 0600
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("creating a scratch file in ", dir));
  if (::unlink(name.c_str()) != 0) {
    const int error = errno;
    ::close(fd);
    return ErrnoToStatus(error, absl::StrCat("removing scratch file ", name));
  }
  return fd;
}

// Writes all of `data` at `offset` of `fd`.
absl::Status WriteFully(int fd, uint64_t offset, const std::byte* data, uint64_t length) {
  uint64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pwrite(fd, data + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("writing at byte offset ", offset + done));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

// Reads [offset, offset + length) of `source` into `out` and tells `on_piece`; errors name
// `what`, the source and the offset.
absl::Status ReadPiece(const MappedFile& source, uint64_t offset, uint64_t length, std::byte* out,
                       absl::string_view what, const ScratchCopy::PieceCallback& on_piece) {
  RETURN_IF_ERROR(source.ReadAt(offset, length, out),
                  absl::StrCat(what, ": reading ", length, " bytes of ", source.path(),
                               " at byte offset ", offset, " into a scratch copy"));
  if (on_piece) on_piece(offset, length, out);
  return absl::OkStatus();
}

}  // namespace

std::string ScratchCopy::ScratchDir() {
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && tmpdir[0] != '\0' ? std::string(tmpdir) : std::string("/tmp");
}

absl::StatusOr<ScratchCopy> ScratchCopy::Fetch(const MappedFile& source, uint64_t begin,
                                               uint64_t end, uint64_t memory_bytes,
                                               absl::string_view what,
                                               const PieceCallback& on_piece) {
  ScratchCopy copy;
  copy.begin_ = begin;
  copy.end_ = end;
  const uint64_t length = end - begin;
  if (length <= memory_bytes) {
    // One read: MappedFile::ReadRemote splits it into requests in flight at once.
    copy.in_memory_ = true;
    copy.memory_ = PageBuffer(static_cast<size_t>(length));
    copy.data_ = reinterpret_cast<const std::byte*>(copy.memory_.data());
    if (length > 0) {
      RETURN_IF_ERROR(ReadPiece(source, begin, length,
                                reinterpret_cast<std::byte*>(copy.memory_.data()), what, on_piece));
    }
    return copy;
  }
  const std::string dir = ScratchDir();
  // Errors of the scratch file name the reader, the source range and the folder.
  const std::string scratch =
      absl::StrCat(what, ": copying ", length, " bytes of ", source.path(), " (from byte offset ",
                   begin, ") to a scratch file in ", dir, " (TMPDIR names another folder)");
  absl::StatusOr<int> fd = OpenUnlinkedFile(dir);
  if (!fd.ok()) return Annotate(fd.status(), scratch);
  ASSIGN_OR_RETURN(copy.file_, FillFile(*fd, source, begin, end, what, scratch, on_piece));
  copy.data_ = copy.file_.data();
  return copy;
}

absl::StatusOr<MappedFile> ScratchCopy::FillFile(int fd, const MappedFile& source, uint64_t begin,
                                                 uint64_t end, absl::string_view what,
                                                 const std::string& scratch,
                                                 const PieceCallback& on_piece) {
  const uint64_t length = end - begin;
  // The blocks are reserved first, so that a full disk fails here rather than after the
  // fetch. Filesystems without fallocate take the writes as they come.
  if (::fallocate(fd, 0, 0, static_cast<off_t>(length)) != 0 && errno != EOPNOTSUPP) {
    const int error = errno;
    ::close(fd);
    return ErrnoToStatus(error, absl::StrCat(scratch, ": reserving ", length, " bytes"));
  }
  PageBuffer piece(static_cast<size_t>(std::min(length, kPieceBytes)));
  std::byte* buffer = reinterpret_cast<std::byte*>(piece.data());
  for (uint64_t offset = begin; offset < end; offset += kPieceBytes) {
    const uint64_t n = std::min(kPieceBytes, end - offset);
    absl::Status status = ReadPiece(source, offset, n, buffer, what, on_piece);
    if (status.ok()) status = Annotate(WriteFully(fd, offset - begin, buffer, n), scratch);
    if (!status.ok()) {
      ::close(fd);
      return status;
    }
  }
  return MappedFile::Adopt(fd,
                           absl::StrCat("scratch copy of ", source.path(), " bytes [", begin, ", ",
                                        end, ") in ", ScratchDir()),
                           static_cast<int64_t>(length));
}

void ScratchCopy::Release(uint64_t offset, uint64_t length) const {
  if (!in_memory()) file_.Release(offset - begin_, length);
}

}  // namespace reshard
