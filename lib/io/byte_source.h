// Random access to a few scattered ranges of one input file, for parsers of metadata that is
// spread over it (a zip archive's end records, central directory and local headers).
//
// A parser asks a `ByteSource` for the bytes of a range and gets a view of them, valid as long
// as the source. Over a mapped local file or a buffer (`ViewByteSource`) that is a slice of the
// whole file: no copy, no request. Over a remote file (`RangeReadSource`) every range not yet
// loaded is one range read; a parser that knows which ranges it will need next says so with
// `Prefetch`, and the source reads them in few requests (neighbours closer than a gap merged
// into one read, several reads in flight), keeping only the bytes asked for. Either way the
// parser is the same code, and checks its offsets against `size()` before reading.

#ifndef RESHARD_LIB_IO_BYTE_SOURCE_H_
#define RESHARD_LIB_IO_BYTE_SOURCE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/io/byte_range.h"
#include "lib/io/kvstore/driver.h"
#include "lib/io/mapped_file.h"

namespace reshard {

class ByteSource {
 public:
  virtual ~ByteSource() = default;

  // The file's name in messages ("s3://bucket/key", a local path).
  virtual const std::string& path() const = 0;
  virtual uint64_t size() const = 0;

  // The bytes [offset, offset + length), valid until the source is destroyed. `what` names
  // them in errors. DataLoss naming the file, `what` and the offset when the range passes the
  // end; the read's error (annotated the same way) when it fails; ResourceExhausted when a
  // remote source would hold more than its limit. Thread compatible.
  virtual absl::StatusOr<absl::string_view> Read(uint64_t offset, uint64_t length,
                                                 absl::string_view what) = 0;

  // Says that `ranges` will be read. A remote source loads them now in few requests; ranges
  // passing the end of the file are clipped (their Read reports it). Default: nothing.
  virtual absl::Status Prefetch(std::vector<ByteRange> ranges) { return absl::OkStatus(); }

 protected:
  // DataLoss for [offset, offset + length) passing the end of a file of `size` bytes.
  static absl::Status PastEnd(absl::string_view path, uint64_t size, uint64_t offset,
                              uint64_t length, absl::string_view what);
};

// The whole file in memory (a mapping or a buffer, not owned).
class ViewByteSource final : public ByteSource {
 public:
  ViewByteSource(absl::string_view bytes, std::string path)
      : bytes_(bytes), path_(std::move(path)) {}

  const std::string& path() const override { return path_; }
  uint64_t size() const override { return bytes_.size(); }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, uint64_t length,
                                         absl::string_view what) override;

 private:
  absl::string_view bytes_;
  std::string path_;
};

// Bytes [base, base + length) of another source (a torch.save archive embedded in a DCP
// file), as a file of their own: offsets are relative to `base`, and `path` names the slice
// in errors ("f.distcp at byte offset 4096"). Reads and prefetches go to `source` (not owned),
// so a slice of a RangeReadSource finds what was prefetched for the whole file.
class SliceByteSource final : public ByteSource {
 public:
  // Precondition: [base, base + length) lies inside `source`.
  SliceByteSource(ByteSource& source, uint64_t base, uint64_t length, std::string path)
      : source_(source), base_(base), length_(length), path_(std::move(path)) {}

  const std::string& path() const override { return path_; }
  uint64_t size() const override { return length_; }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, uint64_t length,
                                         absl::string_view what) override;
  absl::Status Prefetch(std::vector<ByteRange> ranges) override;

 private:
  ByteSource& source_;
  const uint64_t base_;
  const uint64_t length_;
  const std::string path_;
};

// How a RangeReadSource reads.
struct RangeReadOptions {
  // Prefetched ranges closer than this are read with one request (the bytes between are read
  // and dropped): a request's latency (20-40 ms on S3) costs more than 512 KiB of transfer.
  // Default: 512 KiB.
  uint64_t merge_gap = 512 << 10;
  // A merged read is not grown past this (a single range longer than it is read alone), so
  // that a read is one request of MappedFile's remote mode and the buffers in flight stay
  // small. Default: 1 MiB.
  uint64_t max_read = 1 << 20;
  // Prefetch reads in flight at once: at most reads_in_flight x max_read bytes of buffers
  // (8 MiB) besides the bytes kept. Default: 8.
  int reads_in_flight = 8;
  // The bytes all loaded ranges may hold together. Default: 1 GiB.
  uint64_t max_loaded_bytes = 1ull << 30;
};

// A file read by range reads, each loaded range kept in memory until the source is destroyed.
class RangeReadSource final : public ByteSource {
 public:
  // Reads exactly out.size() bytes at `offset` (inside the file). Thread safe.
  using ReadFunction = std::function<absl::Status(uint64_t offset, absl::Span<char> out)>;

  using Options = RangeReadOptions;

  RangeReadSource(std::string path, uint64_t size, ReadFunction read);
  RangeReadSource(std::string path, uint64_t size, ReadFunction read, Options options);

  // Over `file`'s ReadAt (a remote MappedFile, not owned; it must outlive the source).
  static std::unique_ptr<RangeReadSource> Over(const MappedFile& file, Options options = {});

  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, uint64_t length,
                                         absl::string_view what) override;
  absl::Status Prefetch(std::vector<ByteRange> ranges) override;

  // Range reads made so far, and the bytes they read (for tests and figures).
  int reads() const { return reads_.load(); }
  uint64_t bytes_read() const { return bytes_read_.load(); }

 private:
  // One read of `read`, keeping the parts `keep` (inside it) in memory.
  absl::Status LoadWindow(const ByteRange& read, absl::Span<const ByteRange> keep);
  // The loaded bytes [offset, offset + length), or nullopt.
  std::optional<absl::string_view> Find(uint64_t offset, uint64_t length) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserves `length` bytes against max_loaded_bytes; ResourceExhausted naming `what` otherwise.
  absl::Status Reserve(uint64_t offset, uint64_t length, absl::string_view what);

  const std::string path_;
  const uint64_t size_;
  const ReadFunction read_;
  const Options options_;
  std::atomic<int> reads_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> loaded_bytes_{0};
  mutable absl::Mutex mu_;
  // Loaded ranges by offset (they may overlap); never removed, so views stay valid.
  std::multimap<uint64_t, std::string> loaded_ ABSL_GUARDED_BY(mu_);
  uint64_t longest_ ABSL_GUARDED_BY(mu_) = 0;  // the longest loaded range
};

// One file of a kvstore driver (lib/io/kvstore/driver.h), read range by range into one
// buffer: a view is valid until the next Read (not until the source is destroyed, as with the
// sources above), so a reader going front to back (Xxh3OfSource) holds one range at a time
// whatever the file's size, on every driver. Reads are the driver's ReadRange against the
// file's Stat at Open: FailedPrecondition naming the path when it is another version now.
class DriverFileSource final : public ByteSource {
 public:
  // Stats `path` of `driver` (never destroyed). NotFound naming the path when nothing is
  // there; FailedPrecondition when it is a folder.
  static absl::StatusOr<std::unique_ptr<DriverFileSource>> Open(const kvstore::Driver& driver,
                                                                std::string path);

  const std::string& path() const override { return path_; }
  uint64_t size() const override { return stat_.size; }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, uint64_t length,
                                         absl::string_view what) override;

 private:
  DriverFileSource(const kvstore::Driver& driver, std::string path, kvstore::PathStat stat)
      : driver_(driver), path_(std::move(path)), stat_(std::move(stat)) {}

  const kvstore::Driver& driver_;
  const std::string path_;
  const kvstore::PathStat stat_;
  std::string buffer_;  // the last Read's bytes
};

// A source for `file`: a view of its mapping when it is local, range reads when it is remote.
// `file` must outlive the source.
std::unique_ptr<ByteSource> ByteSourceFor(const MappedFile& file, RangeReadOptions options = {});

}  // namespace reshard

#endif  // RESHARD_LIB_IO_BYTE_SOURCE_H_
