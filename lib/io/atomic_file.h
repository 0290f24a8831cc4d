// An output file written under a temporary name and renamed into place only when complete.
//
// `Create` opens `<dir>/<name>.partial` (exclusively); `Append` writes; `Commit` fsyncs,
// closes, renames to `<dir>/<name>` and fsyncs the folder (CommitMode::kVisible leaves the two
// fsyncs out). Destroying an uncommitted file
// removes the partial one, so no file ever appears under its final name half-written. All of
// it goes through the folder's handle (lib/io/directory.h), never its path name.
//
// Data files of a conversion are written with direct I/O where the filesystem takes it
// (IoMode, lib/io/io_mode.h): whole aligned blocks go from the caller's buffer to the device;
// an unaligned stretch is staged in a small aligned buffer; the last block is padded with zeros
// and the file truncated to its exact size before the fsync. Written buffered instead, the
// pages already written back are dropped from the page cache behind the writer (except with
// IoMode::kBuffered).

#ifndef RESHARD_LIB_IO_ATOMIC_FILE_H_
#define RESHARD_LIB_IO_ATOMIC_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/directory.h"
#include "lib/io/io_mode.h"
#include "lib/io/page_buffer.h"

namespace reshard {

// What AtomicFile::Commit waits for.
enum class CommitMode {
  // The file and its name survive a crash of the machine: the file is fsynced before the
  // rename, its folder after.
  kDurable,
  // The file appears under its name whole, without waiting for the disk: a crash of the
  // process leaves it whole or absent, but after a crash of the machine its name may be
  // missing, or the file empty or cut short. For files whose reader checks them and whose
  // loss costs only work to redo (the output commit's records, lib/engine/output_commit.h).
  kVisible,
};

class AtomicFile {
 public:
  // Alignment of direct writes: file offsets, lengths and buffer addresses (a page; covers the
  // logical block size of the devices reshard meets).
  static constexpr size_t kDirectAlignment = 4096;

  // `dir` must stay open until the file is committed or destroyed. With IoMode::kDirect, a
  // filesystem that refuses O_DIRECT is FailedPrecondition naming the file; with kAuto the file
  // is then written buffered.
  static absl::StatusOr<AtomicFile> Create(const Directory& dir, const std::string& name,
                                           IoMode io = IoMode::kBuffered);

  AtomicFile() = default;
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends `data`. Direct: whole blocks of `data` are written when it starts on an aligned
  // address, the rest staged. Buffered: written, and its writeback started (sync_file_range)
  // without waiting for it; the previous Append's pages are waited for and dropped.
  absl::Status Append(absl::string_view data);
  // Makes the file visible under its final name, and durable with CommitMode::kDurable.
  absl::Status Commit(CommitMode mode = CommitMode::kDurable);

  uint64_t bytes_written() const { return bytes_written_; }
  // True while the file is written with direct I/O (false once a refusal made it fall back).
  bool direct() const { return direct_; }
  const std::string& final_path() const { return final_path_; }

 private:
  void Abandon();
  // Writes `length` bytes of `data` at `offset` with pwrite; on a direct write the filesystem
  // refuses (EINVAL) under IoMode::kAuto, switches the file to buffered writes and retries.
  absl::Status WriteAt(const char* data, size_t length, uint64_t offset);
  // Writes the staged bytes (padded to a block when `final`) and empties the stage.
  absl::Status FlushStage(bool final);
  absl::Status AppendBuffered(absl::string_view data);

  int fd_ = -1;
  int dir_fd_ = -1;  // a duplicate of the folder's descriptor, owned
  std::string temp_name_;
  std::string final_name_;
  std::string temp_path_;
  std::string final_path_;
  uint64_t bytes_written_ = 0;
  IoMode io_ = IoMode::kBuffered;
  bool direct_ = false;
  PageBuffer stage_;       // direct: bytes not yet written as a whole block
  size_t stage_used_ = 0;  // the file holds bytes_written_ - stage_used_ bytes (a block multiple)
  uint64_t writeback_from_ = 0;  // buffered: start of the range whose writeback was last started
};

// Writes `contents` to `<dir>/<name>` through an AtomicFile.
absl::Status WriteFileAtomically(const Directory& dir, const std::string& name,
                                 absl::string_view contents,
                                 CommitMode mode = CommitMode::kDurable);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_ATOMIC_FILE_H_
