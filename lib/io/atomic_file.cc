#include "lib/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"

namespace reshard {

namespace {

// Staged bytes of a direct file: an unaligned stretch (the framing before the first tensor,
// the tail) is gathered here and written as whole blocks.
constexpr size_t kStageBytes = 1 << 20;

bool Aligned(const void* address) {
  return reinterpret_cast<uintptr_t>(address) % AtomicFile::kDirectAlignment == 0;
}

}  // namespace

absl::StatusOr<AtomicFile> AtomicFile::Create(const Directory& dir, const std::string& name,
                                              IoMode io) {
  if (!CheckRelativeName(name).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid output file name \"", name, "\""));
  }
  // A name with folders ("zero/<param>/fp32.pt") is created in its subfolder, made on the way.
  ASSIGN_OR_RETURN(Directory::Place place, dir.OpenParentOf(name, /*create=*/true));
  AtomicFile file;
  file.dir_fd_ = ::fcntl(place.folder.fd(), F_DUPFD_CLOEXEC, 0);
  if (file.dir_fd_ < 0) {
    return ErrnoToStatus(errno, absl::StrCat("opening folder ", place.folder.path()));
  }
  file.final_name_ = place.name;
  file.temp_name_ = absl::StrCat(place.name, ".partial");
  file.final_path_ = dir.PathOf(name);
  file.temp_path_ = absl::StrCat(file.final_path_, ".partial");
  file.fd_ = ::openat(file.dir_fd_, file.temp_name_.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (file.fd_ < 0) return ErrnoToStatus(errno, absl::StrCat("creating ", file.temp_path_));
  file.io_ = io;
  if (io != IoMode::kBuffered) {
    // The filesystem says whether it takes direct I/O: setting O_DIRECT fails (EINVAL) where
    // it does not (tmpfs before Linux 6.6, FUSE without direct_io, ...).
    const int flags = ::fcntl(file.fd_, F_GETFL);
    if (flags >= 0 && ::fcntl(file.fd_, F_SETFL, flags | O_DIRECT) == 0) {
      file.direct_ = true;
    } else if (io == IoMode::kDirect) {
      return absl::FailedPreconditionError(absl::StrCat("--io direct: the filesystem of ",
                                                        file.temp_path_, " refuses direct I/O (",
                                                        std::strerror(errno), "); use --io auto"));
    }
  }
  return file;
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      dir_fd_(std::exchange(other.dir_fd_, -1)),
      temp_name_(std::move(other.temp_name_)),
      final_name_(std::move(other.final_name_)),
      temp_path_(std::move(other.temp_path_)),
      final_path_(std::move(other.final_path_)),
      bytes_written_(other.bytes_written_),
      io_(other.io_),
      direct_(other.direct_),
      stage_(std::move(other.stage_)),
      stage_used_(std::exchange(other.stage_used_, 0)),
      writeback_from_(other.writeback_from_) {}

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
  if (this != &other) {
    Abandon();
    fd_ = std::exchange(other.fd_, -1);
    dir_fd_ = std::exchange(other.dir_fd_, -1);
    temp_name_ = std::move(other.temp_name_);
    final_name_ = std::move(other.final_name_);
    temp_path_ = std::move(other.temp_path_);
    final_path_ = std::move(other.final_path_);
    bytes_written_ = other.bytes_written_;
    io_ = other.io_;
    direct_ = other.direct_;
    stage_ = std::move(other.stage_);
    stage_used_ = std::exchange(other.stage_used_, 0);
    writeback_from_ = other.writeback_from_;
  }
  return *this;
}

AtomicFile::~AtomicFile() { Abandon(); }

void AtomicFile::Abandon() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
    fd_ = -1;
  }
  if (dir_fd_ >= 0) {
    ::close(dir_fd_);
    dir_fd_ = -1;
  }
}

absl::Status AtomicFile::WriteAt(const char* data, size_t length, uint64_t offset) {
  size_t done = 0;
  while (done < length) {
    ssize_t written = ::pwrite(fd_, data + done, length - done, static_cast<off_t>(offset + done));
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && direct_ && io_ == IoMode::kAuto) {
        // O_DIRECT was accepted at open but this write is not (an alignment the device needs
        // beyond kDirectAlignment, a filesystem that checks late): go on buffered.
        const int flags = ::fcntl(fd_, F_GETFL);
        if (flags >= 0 && ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) == 0) {
          direct_ = false;
          continue;
        }
      }
      return ErrnoToStatus(errno, absl::StrCat("writing ", temp_path_, " at byte offset ",
                                               offset + done, direct_ ? " (direct I/O)" : ""));
    }
    if (written == 0) {
      return absl::InternalError(
          absl::StrCat("writing ", temp_path_, ": no progress at byte offset ", offset + done));
    }
    done += static_cast<size_t>(written);
  }
  return absl::OkStatus();
}

absl::Status AtomicFile::FlushStage(bool final) {
  if (stage_used_ == 0) return absl::OkStatus();
  size_t length = stage_used_;
  if (final && direct_) {
    // The last block is padded; Commit truncates the file back to its size.
    const size_t padded = (length + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
    std::memset(stage_.data() + length, 0, padded - length);
    length = padded;
  }
  RETURN_IF_ERROR(WriteAt(stage_.data(), length, bytes_written_ - stage_used_));
  stage_used_ = 0;
  return absl::OkStatus();
}

absl::Status AtomicFile::AppendBuffered(absl::string_view data) {
  const uint64_t start = bytes_written_;
  RETURN_IF_ERROR(WriteAt(data.data(), data.size(), start));
  bytes_written_ += data.size();
  if (data.empty()) return absl::OkStatus();
  // Start the writeback of what was just written, so the disk works while the next window is
  // prepared and Commit's fsync has little left (1 GiB: 1.85 s against 2.1 s without).
  ::sync_file_range(fd_, static_cast<off_t>(start), static_cast<off_t>(data.size()),
                    SYNC_FILE_RANGE_WRITE);
  if (io_ != IoMode::kBuffered && start > writeback_from_) {
    // The previous Append's writeback had a whole window's time: wait for what is left of it
    // and drop its pages, so the output does not stay in the page cache.
    const off_t from = static_cast<off_t>(writeback_from_);
    const off_t length = static_cast<off_t>(start - writeback_from_);
    ::sync_file_range(
        fd_, from, length,
        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    ::posix_fadvise(fd_, from, length, POSIX_FADV_DONTNEED);
  }
  writeback_from_ = start;
  return absl::OkStatus();
}

absl::Status AtomicFile::Append(absl::string_view data) {
  if (fd_ < 0) return absl::FailedPreconditionError("write to a closed output file");
  while (direct_ && !data.empty()) {
    if (stage_used_ == 0 && Aligned(data.data()) && data.size() >= kDirectAlignment) {
      // The common case: a window buffer, page aligned, straight to the device.
      const size_t blocks = data.size() / kDirectAlignment * kDirectAlignment;
      RETURN_IF_ERROR(WriteAt(data.data(), blocks, bytes_written_));
      bytes_written_ += blocks;
      data.remove_prefix(blocks);
      continue;
    }
    if (stage_.size() == 0) stage_ = PageBuffer(kStageBytes);
    // A window cut by bytes written on their own (a zip data descriptor a chain stage
    // produced): the caller's buffer lines up with the file's blocks again at the next block
    // boundary, so only the bytes up to it are staged and the rest goes straight.
    const size_t to_block =
        (kDirectAlignment - bytes_written_ % kDirectAlignment) % kDirectAlignment;
    if (stage_used_ > 0 && data.size() >= to_block + kDirectAlignment &&
        Aligned(data.data() + to_block)) {
      std::memcpy(stage_.data() + stage_used_, data.data(), to_block);
      stage_used_ += to_block;
      bytes_written_ += to_block;
      data.remove_prefix(to_block);
      RETURN_IF_ERROR(FlushStage(/*final=*/false));
      continue;
    }
    const size_t n = std::min(data.size(), stage_.size() - stage_used_);
    std::memcpy(stage_.data() + stage_used_, data.data(), n);
    stage_used_ += n;
    bytes_written_ += n;
    data.remove_prefix(n);
    if (stage_used_ == stage_.size()) RETURN_IF_ERROR(FlushStage(/*final=*/false));
  }
  // Buffered from the start, or since WriteAt fell back (the stage is empty then).
  return AppendBuffered(data);
}

absl::Status AtomicFile::Commit(CommitMode mode) {
  const bool durable = mode == CommitMode::kDurable;
  if (fd_ < 0) return absl::FailedPreconditionError("commit of a closed output file");
  const bool padded = direct_ && bytes_written_ % kDirectAlignment != 0;
  RETURN_IF_ERROR(FlushStage(/*final=*/true));
  if (padded && ::ftruncate(fd_, static_cast<off_t>(bytes_written_)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("truncating ", temp_path_, " to ", bytes_written_,
                                             " bytes after its padded last block"));
  }
  if (durable && ::fsync(fd_) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync ", temp_path_));
  }
  if (durable && !direct_ && io_ != IoMode::kBuffered) {
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);  // all written back now
  }
  int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    int error = errno;
    ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
    return ErrnoToStatus(error, absl::StrCat("closing ", temp_path_));
  }
  if (::renameat(dir_fd_, temp_name_.c_str(), dir_fd_, final_name_.c_str()) != 0) {
    int error = errno;
    ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
    return ErrnoToStatus(error, absl::StrCat("renaming ", temp_path_, " to ", final_path_));
  }
  if (durable && ::fsync(dir_fd_) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("fsync of the folder of ", final_path_));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const Directory& dir, const std::string& name,
                                 absl::string_view contents, CommitMode mode) {
  ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::Create(dir, name));
  RETURN_IF_ERROR(file.Append(contents));
  return file.Commit(mode);
}

}  // namespace reshard
