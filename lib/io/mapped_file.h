// A read-only input file: a memory mapping of all of it, plus its descriptor for pread.
//
// The Executor reads strided and converted data out of the mapping, and rows stored as they
// are written with `ReadAt` (pread into its buffer: the kernel's sequential readahead and no
// page faults, about three times faster than faulting the mapping in on a cold cache). Mapped
// pages it has consumed are handed back with `Release` (MADV_DONTNEED, with the pages the
// kernel mapped around them), so the process's resident memory stays bounded by the copy
// window however large the file is. With
// `set_drop_behind`, `DropCached` drops the pages read from the page cache too (a conversion does
// not leave its input cached); otherwise the data stays in the page cache.
//
// A path whose kvstore driver does not map files (s3://, mem://; lib/io/kvstore/driver.h)
// opens an unmapped file instead: no mapping (`data()` is null, `mapped()` false), its size
// from the driver, and every read a driver ReadRange into the caller's buffer. It counts as
// read directly (`direct_reads()`), so the executor reads it span by span through a
// SpanReader, the next span fetched ahead on its helper thread; the page-cache hints do
// nothing. Callers that need `data()` must check `mapped()` up front.

#ifndef RESHARD_LIB_IO_MAPPED_FILE_H_
#define RESHARD_LIB_IO_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/io/kvstore/driver.h"
#include "lib/io/read_stage.h"

namespace reshard {

class MappedFile {
 public:
  // Maps `path` read-only. `expected_size`, when given, must equal the file's size (it changed
  // since it was cataloged otherwise: DataLoss). A path whose driver does not map files opens
  // an unmapped file (above); InvalidArgument when it names a folder. An unmapped file with a
  // non-empty `expected_version` (SourceFile::version) must still be that version
  // (FailedPrecondition naming the file and both versions otherwise), and every read is of
  // that version; posix files have none.
  // The file is opened with OpenRegularFile (lib/io/file_access.h): FIFOs and devices are
  // refused, and under a PathConfinement it is opened beneath the allowed roots.
  static absl::StatusOr<MappedFile> Open(const std::string& path, int64_t expected_size = -1,
                                         const std::string& expected_version = "");
  // Maps the open file `fd` (taken over, closed on error), known by `path` in messages.
  static absl::StatusOr<MappedFile> Adopt(int fd, const std::string& path,
                                          int64_t expected_size = -1);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // The mapping; null for an unmapped file (and an empty one).
  const std::byte* data() const { return data_; }
  // Whether the file's bytes are read without a request: a mapping (`data()`) and a descriptor
  // for pread. False: every read is a ReadRange of its driver (s3://, mem://).
  bool mapped() const { return driver_ == nullptr; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The version an unmapped file's reads are pinned to (kvstore::PathStat::version, S3's
  // ETag); empty for a mapped file and a driver without versions.
  const std::string& version() const { return opened_.version; }

  // Reads `length` bytes at `offset` into `out`. DataLoss naming the file and offset when the
  // file ended early (it shrank underneath), the errno's status on an I/O error. Thread safe.
  absl::Status ReadAt(uint64_t offset, size_t length, std::byte* out) const;
  // As ReadAt, but an unmapped file's range is one request, not split into pieces read at
  // once: for callers that keep several requests in flight themselves (ReadRemoteRuns).
  absl::Status ReadAtInOneRequest(uint64_t offset, size_t length, std::byte* out) const;

  // Attaches `stage` (not owned; null detaches): every read of the file from now on, through
  // ReadAt, ReadAtInOneRequest, ReadDirect, Run and StridedView, tells it the bytes read
  // (lib/io/read_stage.h). Not thread safe; set before reading.
  void set_read_stage(ReadStage* stage) { stage_ = stage; }
  ReadStage* read_stage() const { return stage_; }

  // Bytes [offset, offset + length) of the mapping, read as one run: the same bytes as
  // data() + offset, told to the read stage. Requires mapped() and the range inside the file.
  const std::byte* Run(uint64_t offset, uint64_t length) const;
  // A strided view of the mapping within [offset, offset + length) (the elements are read
  // from data() + offset on, not all of them): the read stage is told where it was read, not
  // what. Requires mapped() and the range inside the file.
  const std::byte* StridedView(uint64_t offset, uint64_t length) const;

  // Drops from this process's resident set every page a read of [offset, offset + length)
  // through the mapping may have mapped: the pages holding its bytes, those shared with bytes
  // around it, and the cached pages a fault maps with the faulting one (fault-around; the page
  // cache's large folio holding the page, which a fault maps whole on Linux 6.18, up to 2 MiB),
  // that is every page of the aligned blocks of kFaultAroundBytes of the address space that
  // hold its bytes. Pages of bytes around the range go too: later reads fault them back in from
  // the page cache. Releasing only the pages inside each consumed range would leave those
  // around it mapped, and a conversion's reads would add them up range after range. Thread
  // safe.
  void Release(uint64_t offset, uint64_t length) const;
  // The largest block a fault maps: a PMD (2 MiB on x86-64 and arm64 with 4 KiB pages).
  static constexpr uint64_t kFaultAroundBytes = 2 << 20;

  // With drop_behind, drops the pages fully inside [offset, offset + length) from the page
  // cache (POSIX_FADV_DONTNEED); call it for bytes that were read and will not be read again.
  // Without, nothing. Thread safe.
  void DropCached(uint64_t offset, uint64_t length) const;

  // Direct reads (O_DIRECT): the device writes into the caller's buffer, nothing goes through
  // the page cache (no copy, no pages to drop). Opens a second descriptor of the same file;
  // false when the filesystem refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE and network
  // filesystems), and the file is then read buffered. Not thread safe; call before reading.
  // An unmapped file is always read directly.
  bool EnableDirectReads();
  bool direct_reads() const { return direct_fd_ >= 0 || !mapped(); }

  // With direct reads: whether only dense runs (a box whose bytes are all read, e.g. the rows of
  // a tensor split by rows) are read directly, and strips of rows (a split by columns, whose
  // neighbouring bytes other output parts read) go through the page cache as buffered reads.
  // Read one strip at a time, direct reads cost 1.30x the wall time of buffered ones.
  void set_direct_reads_dense_only(bool dense_only) { direct_dense_only_ = dense_only; }
  // Byte ranges [begin, end) that several boxes read the same way (a tensor replicated into
  // every output part; SourceReads::repeated in lib/exec/executor.h), sorted and disjoint.
  // With dense-only direct reads they go through the page cache, and DropCached leaves their
  // pages there, so that the reads after the first come from memory, while the rest of the
  // file is read directly and dropped behind. Not thread safe; set before reading.
  void set_repeated_ranges(std::vector<std::pair<uint64_t, uint64_t>> ranges) {
    repeated_ = std::move(ranges);
  }
  // Whether a run [begin, end) of a box that reads `dense` (all its bytes) or not is read
  // directly.
  bool ReadsDirectly(bool dense, uint64_t begin, uint64_t end) const {
    return !mapped() ||
           (direct_reads() && (!direct_dense_only_ || (dense && !Repeated(begin, end))));
  }

  // Alignment of direct reads: offsets, lengths and buffer addresses.
  static constexpr uint64_t kDirectAlignment = 4096;

  // How an unmapped file's long reads are split (ReadUnmapped).
  static constexpr uint64_t kRemotePieceBytes = 1 << 20;
  static constexpr int kRemotePiecesInFlight = 8;

  // Reads the aligned blocks that cover [offset, offset + length) with direct I/O into
  // `buffer` (kDirectAlignment-aligned, at least DirectReadSpan(offset, length) bytes) and
  // returns where the byte at `offset` landed in it. DataLoss naming the file and offset when
  // the file ended early. Requires direct_reads(). Thread safe. An unmapped file reads exactly
  // [offset, offset + length) to the start of `buffer` (no alignment needed).
  absl::StatusOr<const std::byte*> ReadDirect(uint64_t offset, size_t length,
                                              std::byte* buffer) const;
  // The bytes ReadDirect(offset, length, ...) writes into its buffer.
  static uint64_t DirectReadSpan(uint64_t offset, uint64_t length);

  // Whether DropCached drops pages. Set it only when every byte is read once (another read of
  // a dropped page goes to the disk again).
  void set_drop_behind(bool drop) { drop_behind_ = drop; }
  bool drop_behind() const { return drop_behind_; }

  // Asks the kernel to read [offset, offset + length) ahead. Thread safe.
  void WillNeed(uint64_t offset, uint64_t length) const;

  // For parsers that touch a few metadata pages spread over the file (zip local headers before
  // every tensor record): a page fault reads only its page, not the read-around window
  // (read_ahead_kb, 8 MiB on this machine's disk, so parsing a torch.save file read most of it
  // through the page cache before the conversion read it again).
  void AdviseRandomAccess() const;

 private:
  // Reads up to `want` bytes at `offset` of `fd` (fd_ or direct_fd_) into `out`, at least
  // `need`; DataLoss naming the file and offset when it ends before.
  absl::Status ReadFully(int fd, uint64_t offset, uint64_t want, uint64_t need,
                         std::byte* out) const;

  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  // The first repeated range that ends after `offset`.
  Ranges::const_iterator FirstRepeatedAfter(uint64_t offset) const;
  // Whether [begin, end) overlaps a repeated range.
  bool Repeated(uint64_t begin, uint64_t end) const;

  // Opens file `path` of `driver`, which does not map files.
  static absl::StatusOr<MappedFile> OpenUnmapped(const kvstore::Driver* driver,
                                               const std::string& path, int64_t expected_size,
                                               const std::string& expected_version);
  // Reads [offset, offset + length) of an unmapped file into `out`: DataLoss naming the file when
  // the range passes its end; a long range in pieces of at least kRemotePieceBytes, up to
  // kRemotePiecesInFlight of them read at once (one request is bounded by one connection's
  // throughput).
  absl::Status ReadUnmapped(uint64_t offset, uint64_t length, std::byte* out) const;
  // DataLoss naming the file when [offset, offset + length) passes the end of an unmapped file.
  absl::Status CheckUnmappedRange(uint64_t offset, uint64_t length) const;

  std::string path_;
  const kvstore::Driver* driver_ = nullptr;  // the driver of an unmapped file, else null
  // An unmapped file's Stat when it was opened: every range read must be of that version.
  kvstore::PathStat opened_;
  int fd_ = -1;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  bool drop_behind_ = false;
  bool direct_dense_only_ = false;
  std::vector<std::pair<uint64_t, uint64_t>> repeated_;  // set_repeated_ranges
  ReadStage* stage_ = nullptr;                           // set_read_stage
  int direct_fd_ = -1;  // the same file opened with O_DIRECT, when EnableDirectReads succeeded
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_MAPPED_FILE_H_
