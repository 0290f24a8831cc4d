// Byte sinks that chain, in riegeli's manner: each stage passes what it is given on to the
// next and adds one concern (a size held, bytes produced late, a digest), the last one writes
// the file. `Close` returns the status of the whole stream and closes the chain front to
// back, so an output is complete, checked and durable exactly when its Close returned OK.
// lib/io/writer_chain.h builds a chain from what an output needs; by hand:
//
//   AtomicFileWriter file(*AtomicFile::Create(dir, name));
//   Xxh3Writer digest(&file);
//   ExactSizeWriter exact(&digest, planned_bytes, name);
//   RETURN_IF_ERROR(exact.Write(...));        // ...
//   RETURN_IF_ERROR(exact.Close());           // size checked, file committed
//   manifest_hash = digest.xxh3_64();
//
// Stages are not thread safe; one thread writes a chain at a time.

#ifndef RESHARD_LIB_IO_BYTE_WRITER_H_
#define RESHARD_LIB_IO_BYTE_WRITER_H_

#include <xxhash.h>
#if defined(__x86_64__)
// XXH3 of libxxhash with runtime dispatch to AVX2 / AVX-512: its plain entry points use SSE2,
// with which the digest of every byte written takes a quarter of a torch-output split's user CPU.
#include <xxh_x86dispatch.h>
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/atomic_file.h"
#include "lib/io/byte_range.h"

namespace reshard {

class ByteWriter {
 public:
  virtual ~ByteWriter() = default;
  // Appends `data`. FailedPrecondition after Close.
  virtual absl::Status Write(absl::string_view data) = 0;
  // Ends the stream and everything behind it. Closing twice is FailedPrecondition.
  virtual absl::Status Close() = 0;
  // Bytes written so far.
  virtual uint64_t pos() const = 0;
};

// The end of a chain: an AtomicFile (direct or buffered, as created), made durable under its
// final name by Close (Commit). Destroyed unclosed, the partial file is removed.
class AtomicFileWriter final : public ByteWriter {
 public:
  explicit AtomicFileWriter(AtomicFile file) : file_(std::move(file)) {}
  absl::Status Write(absl::string_view data) override { return file_.Append(data); }
  absl::Status Close() override { return file_.Commit(); }
  uint64_t pos() const override { return file_.bytes_written(); }
  const AtomicFile& file() const { return file_; }

 private:
  AtomicFile file_;
};

// Passes bytes on to `dest` and holds the stream to exactly `size` bytes: a Write past the end
// or a Close short of it is Internal naming `name` and both counts (the plan and the framing
// disagree: a bug, never a file of the wrong length under a final name).
class ExactSizeWriter final : public ByteWriter {
 public:
  ExactSizeWriter(ByteWriter* dest, uint64_t size, std::string name)
      : dest_(dest), size_(size), name_(std::move(name)) {}

  absl::Status Write(absl::string_view data) override;
  absl::Status Close() override;
  uint64_t pos() const override { return dest_->pos(); }

 private:
  ByteWriter* const dest_;
  const uint64_t size_;
  const std::string name_;
};

// Passes bytes on to `dest`, replacing the placeholder bytes of each of `ranges` (disjoint,
// in stream order) with the bytes `produce(i)` returns for range i when the stream reaches
// it: bytes that depend on what precedes them (a zip data descriptor carries the CRC-32 of the
// record before it), so the stages behind this one have seen those bytes when it asks. The
// placeholders' contents are ignored. Produced bytes of another length than the range's are
// Internal naming `name` and the range's offset.
class DeferredBytesWriter final : public ByteWriter {
 public:
  using Producer = std::function<absl::StatusOr<std::string>(size_t range)>;

  DeferredBytesWriter(ByteWriter* dest, std::vector<ByteRange> ranges, Producer produce,
                      std::string name)
      : dest_(dest), ranges_(std::move(ranges)), produce_(std::move(produce)),
        name_(std::move(name)) {}

  absl::Status Write(absl::string_view data) override;
  absl::Status Close() override { return dest_->Close(); }
  uint64_t pos() const override { return dest_->pos(); }

 private:
  ByteWriter* const dest_;
  const std::vector<ByteRange> ranges_;
  const Producer produce_;
  const std::string name_;
  size_t next_ = 0;       // the first range not passed on whole
  std::string produced_;  // ranges_[next_]'s bytes once produced
};

// Passes bytes on to `dest` and computes the CRC-32 (zip's, zlib's) of each of `ranges`
// (disjoint, in any order): crc32s()[i] is that of the bytes of ranges[i] written so far. With
// `xxh3_64`, it computes the XXH3-64 (seed 0) of the whole stream too, as Xxh3Writer does, in
// the same pass: each Write is digested kPieceBytes at a time, the piece's CRC-32s and then its
// XXH3, so that the hash reads the piece from the cache the CRC-32 left it in. Apart, each
// digest read the whole window from memory (a torch.save output's window is 16 MiB).
class Crc32Writer final : public ByteWriter {
 public:
  static constexpr size_t kPieceBytes = 256 << 10;

  // InvalidArgument when two ranges overlap.
  static absl::StatusOr<std::unique_ptr<Crc32Writer>> Create(ByteWriter* dest,
                                                             std::vector<ByteRange> ranges,
                                                             bool xxh3_64 = false);
  ~Crc32Writer() override;
  Crc32Writer(const Crc32Writer&) = delete;
  Crc32Writer& operator=(const Crc32Writer&) = delete;

  absl::Status Write(absl::string_view data) override;
  absl::Status Close() override { return dest_->Close(); }
  uint64_t pos() const override { return dest_->pos(); }

  const std::vector<uint32_t>& crc32s() const { return crc32s_; }
  // The XXH3-64 of everything written so far; 0 unless asked for.
  uint64_t xxh3_64() const;

 private:
  Crc32Writer(ByteWriter* dest, std::vector<ByteRange> ranges, std::vector<size_t> order,
              bool xxh3_64);
  // Extends the CRC-32s of the ranges `piece` (the stream's next bytes) falls in.
  void Checksum(absl::string_view piece);

  ByteWriter* const dest_;
  const std::vector<ByteRange> ranges_;
  const std::vector<size_t> order_;  // indices of ranges_ by offset
  std::vector<uint32_t> crc32s_;
  XXH3_state_t* const xxh3_;  // null unless asked for
  size_t next_ = 0;  // in order_: the first range not complete
  uint64_t at_ = 0;  // bytes passed through
};

// Passes bytes on to `dest` and computes the XXH3-64 (seed 0) of the whole stream: the
// manifest's and resume's check of a file.
class Xxh3Writer final : public ByteWriter {
 public:
  explicit Xxh3Writer(ByteWriter* dest);
  ~Xxh3Writer() override;
  Xxh3Writer(const Xxh3Writer&) = delete;
  Xxh3Writer& operator=(const Xxh3Writer&) = delete;

  absl::Status Write(absl::string_view data) override;
  absl::Status Close() override { return dest_->Close(); }
  uint64_t pos() const override { return dest_->pos(); }

  // Of everything written so far.
  uint64_t xxh3_64() const;

 private:
  ByteWriter* const dest_;
  XXH3_state_t* const state_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_BYTE_WRITER_H_
