// A local copy of one byte range of a remote file (MappedFile's remote mode), for readers that
// need the bytes in memory at once: the elements of a piece strided in its source (a DCP chunk
// saved column-major) are gathered from all over its range, in an order that a span-by-span
// read cannot follow without reading the range again for every window.
//
// The range is fetched once, front to back, with range reads of up to kPieceBytes (each split
// by MappedFile::ReadRemote into requests in flight at once). A range of at most the memory the
// caller allows is kept in a buffer of anonymous memory; a larger one goes to a scratch file:
// an unlinked file (O_TMPFILE, else mkstemp and unlink) in $TMPDIR or /tmp, created 0600, its
// blocks reserved first (a full disk is an error then, not a SIGBUS in the mapping), written
// piece by piece from one buffer of kPieceBytes and then mapped read-only like a local input.
// Nothing of it survives the copy: the file has no name, and its pages go when it is closed.
//
// Memory: the buffer (at most the allowance), or one piece buffer while the file is written
// plus the mapped pages the reader touches, which it hands back with Release.

#ifndef RESHARD_LIB_IO_SCRATCH_COPY_H_
#define RESHARD_LIB_IO_SCRATCH_COPY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/mapped_file.h"
#include "lib/io/page_buffer.h"

namespace reshard {

class ScratchCopy {
 public:
  // The longest range read at once: what a file copy buffers. 4 MiB is four requests of
  // MappedFile::kRemotePieceBytes in flight.
  static constexpr uint64_t kPieceBytes = 4 << 20;

  // Told every piece fetched: [offset, offset + length) of the source, at `data` (valid for the
  // call only). For checksums of the bytes as they arrive.
  using PieceCallback =
      std::function<void(uint64_t offset, uint64_t length, const std::byte* data)>;

  // Copies bytes [begin, end) of `source` (remote; a local file works too, read with pread):
  // into memory when end - begin <= `memory_bytes`, else into a scratch file in ScratchDir().
  // `what` names the reader in errors (`tensor "w"`). Errors name `what`, the source and the
  // byte offset of the failed read, or, for the scratch file, the folder.
  static absl::StatusOr<ScratchCopy> Fetch(const MappedFile& source, uint64_t begin, uint64_t end,
                                           uint64_t memory_bytes, absl::string_view what,
                                           const PieceCallback& on_piece = nullptr);

  // Where scratch files go: $TMPDIR when set and not empty, else /tmp.
  static std::string ScratchDir();

  ScratchCopy() = default;
  ScratchCopy(ScratchCopy&&) = default;
  ScratchCopy& operator=(ScratchCopy&&) = default;

  // The copy of the source byte at `offset` (begin <= offset < end).
  const std::byte* at(uint64_t offset) const { return data_ + (offset - begin_); }
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  // Whether the copy is in memory (not a scratch file).
  bool in_memory() const { return in_memory_; }
  // Bytes of memory the copy holds (the buffer; a file's mapped pages come and go).
  uint64_t memory_bytes() const { return memory_.size(); }

  // Hands back to the kernel the mapped pages of a scratch file fully inside the source bytes
  // [offset, offset + length) (MappedFile::Release): they stay in the file, and are faulted in
  // again when read. Nothing for a copy in memory.
  void Release(uint64_t offset, uint64_t length) const;

 private:
  // Writes [begin, end) of `source` into the open scratch file `fd` (taken over), then maps it.
  // Its own errors are prefixed with `scratch`, the reads' with `what`.
  static absl::StatusOr<MappedFile> FillFile(int fd, const MappedFile& source, uint64_t begin,
                                             uint64_t end, absl::string_view what,
                                             const std::string& scratch,
                                             const PieceCallback& on_piece);

  uint64_t begin_ = 0;
  uint64_t end_ = 0;
  const std::byte* data_ = nullptr;  // the copy of the byte at begin_
  bool in_memory_ = false;
  PageBuffer memory_;  // the copy in memory, or
  MappedFile file_;    // the scratch file, mapped
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_SCRATCH_COPY_H_
