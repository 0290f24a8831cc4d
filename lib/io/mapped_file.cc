#include "lib/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/directory.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/path_confinement.h"

namespace reshard {
namespace {

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Maps `size` bytes of `fd` (file `path`) read-only at an address one page past a kFaultAroundBytes
// boundary, so that no block of kFaultAroundBytes of the file lies in one aligned block of the
// address space. A fault maps the page cache's large folio holding the page whole only when the
// folio lies in one such block (one page table): a 2 MiB folio never does here, and a fault
// maps the pages fault-around maps (64 KiB) rather than 2 MiB of the source, which the process
// would hold in its resident set until the read is released.
absl::StatusOr<std::byte*> MapOffFolios(int fd, uint64_t size, const std::string& path) {
  const uint64_t page = PageSize();
  const uint64_t block = MappedFile::kFaultAroundBytes;
  const uint64_t mapped = (size + page - 1) / page * page;
  // Address space for the mapping wherever it starts in the first aligned block.
  const uint64_t reserved = mapped + 2 * block;
  void* area = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
  if (area == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("mapping ", path));
  const uintptr_t start = reinterpret_cast<uintptr_t>(area);
  const uintptr_t at = (start + block - 1) / block * block + page;
  void* address = ::mmap(reinterpret_cast<void*>(at), mapped, PROT_READ, MAP_SHARED | MAP_FIXED,
                         fd, 0);
  if (address == MAP_FAILED) {
    const int error = errno;
    ::munmap(area, reserved);
    return ErrnoToStatus(error, absl::StrCat("mapping ", path));
  }
  // The reservation around the mapping goes back.
  ::munmap(area, at - start);
  ::munmap(reinterpret_cast<void*>(at + mapped), start + reserved - (at + mapped));
  return static_cast<std::byte*>(address);
}

}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path, int64_t expected_size,
                                            const std::string& expected_version) {
  ASSIGN_OR_RETURN(kvstore::Location location, kvstore::ParseLocation(path));
  if (!location.driver->maps_files()) {
    return OpenUnmapped(location.driver, path, expected_size, expected_version);
  }
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path));
  return Adopt(fd, path, expected_size);
}

absl::StatusOr<MappedFile> MappedFile::Adopt(int fd, const std::string& path,
                                             int64_t expected_size) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int error = errno;
    ::close(fd);
    return ErrnoToStatus(error, absl::StrCat("stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", DescribeFileType(st.st_mode), ", not a regular file"));
  }
  if (expected_size >= 0 && st.st_size != expected_size) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": file is ", st.st_size, " bytes but was ",
                                            expected_size,
                                            " bytes when it was read; it changed underneath"));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<uint64_t>(st.st_size);
  if (file.size_ > 0) {
    absl::StatusOr<std::byte*> address = MapOffFolios(fd, file.size_, path);
    if (!address.ok()) {
      ::close(fd);
      return address.status();
    }
    file.data_ = *address;
    // No MADV_SEQUENTIAL: on this kernel it makes cold-cache faults slower than the default
    // read-around. Consumed pages are dropped with Release instead.
  }
  file.fd_ = fd;
  return file;
}

absl::StatusOr<MappedFile> MappedFile::OpenUnmapped(const kvstore::Driver* driver,
                                                  const std::string& path, int64_t expected_size,
                                                  const std::string& expected_version) {
  ASSIGN_OR_RETURN(kvstore::PathStat stat, driver->Stat(path));
  if (stat.is_folder) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a folder, not a file"));
  }
  if (expected_size >= 0 && stat.size != static_cast<uint64_t>(expected_size)) {
    return absl::DataLossError(absl::StrCat(path, ": object is ", stat.size, " bytes but was ",
                                            expected_size,
                                            " bytes when it was read; it changed underneath"));
  }
  if (!expected_version.empty() && stat.version != expected_version) {
    // Replaced by another object (of the same size) since a reader parsed its metadata: the
    // pieces located then would be read from other bytes.
    return absl::FailedPreconditionError(
        absl::StrCat(path, " changed since its metadata was read: ETag ", expected_version,
                     " then, ", stat.version.empty() ? "none" : stat.version, " now"));
  }
  MappedFile file;
  file.path_ = path;
  file.driver_ = driver;
  file.size_ = stat.size;
  file.opened_ = std::move(stat);
  return file;
}

absl::Status MappedFile::CheckUnmappedRange(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::DataLossError(absl::StrCat(path_, ": read of ", length, " bytes at byte offset ",
                                            offset, " passes the end of the object (", size_,
                                            " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status MappedFile::ReadAtInOneRequest(uint64_t offset, size_t length, std::byte* out) const {
  if (driver_ == nullptr) return ReadAt(offset, length, out);
  RETURN_IF_ERROR(CheckUnmappedRange(offset, length));
  RETURN_IF_ERROR(driver_->ReadRange(
      path_, offset, absl::Span<char>(reinterpret_cast<char*>(out), length), opened_));
  if (stage_ != nullptr) stage_->Read(offset, length, out);
  return absl::OkStatus();
}

absl::Status MappedFile::ReadUnmapped(uint64_t offset, uint64_t length, std::byte* out) const {
  RETURN_IF_ERROR(CheckUnmappedRange(offset, length));
  const uint64_t pieces =
      std::clamp<uint64_t>(length / kRemotePieceBytes, 1, kRemotePiecesInFlight);
  const uint64_t piece = (length + pieces - 1) / pieces;
  auto read_piece = [&](uint64_t i) {
    const uint64_t begin = i * piece;
    const uint64_t end = std::min(length, begin + piece);
    return driver_->ReadRange(
        path_, offset + begin,
        absl::Span<char>(reinterpret_cast<char*>(out + begin), static_cast<size_t>(end - begin)),
        opened_);
  };
  // Piece 0 on this thread, the others on their own; the first error in piece order.
  std::vector<absl::Status> status(pieces);
  std::vector<std::thread> threads;
  for (uint64_t i = 1; i < pieces; ++i) {
    threads.emplace_back([&, i] { status[i] = read_piece(i); });
  }
  status[0] = read_piece(0);
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& piece_status : status) RETURN_IF_ERROR(piece_status);
  return absl::OkStatus();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      driver_(std::exchange(other.driver_, nullptr)),
      opened_(std::move(other.opened_)),
      fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      drop_behind_(other.drop_behind_),
      direct_dense_only_(other.direct_dense_only_),
      repeated_(std::move(other.repeated_)),
      stage_(std::exchange(other.stage_, nullptr)),
      direct_fd_(std::exchange(other.direct_fd_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
    path_ = std::move(other.path_);
    driver_ = std::exchange(other.driver_, nullptr);
    opened_ = std::move(other.opened_);
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    drop_behind_ = other.drop_behind_;
    direct_dense_only_ = other.direct_dense_only_;
    repeated_ = std::move(other.repeated_);
    stage_ = std::exchange(other.stage_, nullptr);
    direct_fd_ = std::exchange(other.direct_fd_, -1);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

bool MappedFile::EnableDirectReads() {
  if (direct_fd_ >= 0 || !mapped()) return true;
  if (fd_ < 0) return false;
  // Reopened through the descriptor, not the path: the very file that was opened (and
  // confined beneath the allowed roots), whatever happened to its name since.
  const std::string self = absl::StrCat("/proc/self/fd/", fd_);
  direct_fd_ = ::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  return direct_fd_ >= 0;
}

uint64_t MappedFile::DirectReadSpan(uint64_t offset, uint64_t length) {
  const uint64_t begin = offset / kDirectAlignment * kDirectAlignment;
  const uint64_t end =
      (offset + length + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  return end - begin;
}

absl::StatusOr<const std::byte*> MappedFile::ReadDirect(uint64_t offset, size_t length,
                                                        std::byte* buffer) const {
  if (!mapped()) {
    RETURN_IF_ERROR(ReadUnmapped(offset, length, buffer));
    if (stage_ != nullptr) stage_->Read(offset, length, buffer);
    return buffer;
  }
  if (direct_fd_ < 0)
    return absl::FailedPreconditionError(absl::StrCat(path_, ": no direct reads"));
  const uint64_t begin = offset / kDirectAlignment * kDirectAlignment;
  RETURN_IF_ERROR(ReadFully(direct_fd_, begin, DirectReadSpan(offset, length),
                            offset + length - begin, buffer));
  const std::byte* const data = buffer + (offset - begin);
  if (stage_ != nullptr) stage_->Read(offset, length, data);
  return data;
}

absl::Status MappedFile::ReadAt(uint64_t offset, size_t length, std::byte* out) const {
  RETURN_IF_ERROR(mapped() ? ReadFully(fd_, offset, length, length, out)
                           : ReadUnmapped(offset, length, out));
  if (stage_ != nullptr) stage_->Read(offset, length, out);
  return absl::OkStatus();
}

const std::byte* MappedFile::Run(uint64_t offset, uint64_t length) const {
  const std::byte* const data = data_ + offset;
  if (stage_ != nullptr) stage_->Read(offset, length, data);
  return data;
}

const std::byte* MappedFile::StridedView(uint64_t offset, uint64_t length) const {
  if (stage_ != nullptr) stage_->Read(offset, length, nullptr);
  return data_ + offset;
}

absl::Status MappedFile::ReadFully(int fd, uint64_t offset, uint64_t want, uint64_t need,
                                   std::byte* out) const {
  const bool direct = fd == direct_fd_;
  uint64_t done = 0;
  while (done < need) {
    ssize_t n = ::pread(fd, out + done, want - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("reading ", path_, " at byte offset ", offset + done,
                                               direct ? " (direct I/O)" : ""));
    }
    done += static_cast<uint64_t>(n);
    // The end of the file: no bytes, or (direct) a short read that is not block aligned.
    if (done < need && (n == 0 || (direct && done % kDirectAlignment != 0))) {
      return absl::DataLossError(absl::StrCat(path_, ": file ended at byte offset ", offset + done,
                                              " while reading; it was truncated underneath"));
    }
  }
  return absl::OkStatus();
}

void MappedFile::Release(uint64_t offset, uint64_t length) const {
  if (data_ == nullptr || length == 0 || offset >= size_) return;
  // Fault-around and large folios align in the address space, not in the file. The ends are
  // page boundaries (the mapping starts at one); madvise rounds the length up to whole pages,
  // which covers the file's last page.
  const uintptr_t base = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t from = std::max(base, (base + offset) / kFaultAroundBytes * kFaultAroundBytes);
  const uintptr_t to =
      std::min(base + size_, (base + std::min(offset + length, size_) + kFaultAroundBytes - 1) /
                                 kFaultAroundBytes * kFaultAroundBytes);
  // The mapping is shared and read-only: pages dropped here that another reader of the file
  // still reads fault back in with the same bytes.
  if (to > from) ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED);
}

void MappedFile::DropCached(uint64_t offset, uint64_t length) const {
  if (!drop_behind_ || fd_ < 0 || length == 0) return;
  // Whole pages only: a page shared with bytes not read yet stays (the kernel would round
  // inward too; a strip of a row shorter than a page costs no system call).
  const uint64_t page = PageSize();
  const uint64_t begin = (offset + page - 1) / page * page;
  // The file's last page is whole as far as the file goes.
  const uint64_t end =
      offset + length >= size_ ? (size_ + page - 1) / page * page : (offset + length) / page * page;
  auto drop = [this](uint64_t from, uint64_t to) {
    if (to > from) {
      ::posix_fadvise(fd_, static_cast<off_t>(from), static_cast<off_t>(to - from),
                      POSIX_FADV_DONTNEED);
    }
  };
  // The pages of repeated ranges stay, and those they share with the bytes around them.
  uint64_t from = begin;
  auto range = FirstRepeatedAfter(begin);
  for (; range != repeated_.end() && range->first < end; ++range) {
    drop(from, range->first / page * page);
    from = std::max(from, (range->second + page - 1) / page * page);
  }
  drop(from, end);
}

MappedFile::Ranges::const_iterator MappedFile::FirstRepeatedAfter(uint64_t offset) const {
  return std::upper_bound(
      repeated_.begin(), repeated_.end(), offset,
      [](uint64_t at, const std::pair<uint64_t, uint64_t>& r) { return at < r.second; });
}

bool MappedFile::Repeated(uint64_t begin, uint64_t end) const {
  auto range = FirstRepeatedAfter(begin);
  return range != repeated_.end() && range->first < end;
}

void MappedFile::AdviseRandomAccess() const {
  if (data_ != nullptr) ::madvise(data_, size_, MADV_RANDOM);
}

void MappedFile::WillNeed(uint64_t offset, uint64_t length) const {
  if (data_ == nullptr || length == 0 || offset >= size_) return;
  const uint64_t page = PageSize();
  uint64_t begin = offset / page * page;
  uint64_t end = std::min(offset + length, size_);
  ::madvise(data_ + begin, end - begin, MADV_WILLNEED);
}

}  // namespace reshard
