// Byte sinks that chain, in riegeli's manner: each writer passes what it is given on to the
// next and adds one concern (digesting, holding a size), the last one writes the file. `Close`
// returns the status of the whole stream and closes the chain front to back, so an output is
// complete, checked and durable exactly when its Close returned OK.
//
//   AtomicFileWriter file(*AtomicFile::Create(dir, name));
//   DigestingWriter digest(&file, {.xxh3_64 = true});
//   ExactSizeWriter exact(&digest, planned_bytes, name);
//   RETURN_IF_ERROR(exact.Write(...));        // ...
//   RETURN_IF_ERROR(exact.Close());           // size checked, file committed
//   manifest_hash = digest.xxh3_64();
//
// Writers are not thread safe; one thread writes a chain at a time.

#ifndef RESHARD_LIB_IO_BYTE_WRITER_H_
#define RESHARD_LIB_IO_BYTE_WRITER_H_

#include <xxhash.h>
#if defined(__x86_64__)
// XXH3 of libxxhash with runtime dispatch to AVX2 / AVX-512: its plain entry points use SSE2,
// with which the digest of every byte written takes a quarter of a torch-output split's user CPU.
#include <xxh_x86dispatch.h>
#endif

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "lib/io/atomic_file.h"

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

// The end of a chain: an AtomicFile, made durable under its final name by Close (Commit).
// Destroyed unclosed, the partial file is removed.
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

// Passes bytes on to `dest` and digests them on the way: the XXH3-64 of the whole stream
// (manifests, resume checks) and/or the CRC-32 (zip records) of the bytes since the last
// `RestartCrc32`. Asked only for what the caller needs: an unrequested digest costs nothing.
class DigestingWriter final : public ByteWriter {
 public:
  struct Digests {
    bool xxh3_64 = true;
    bool crc32 = false;
  };
  DigestingWriter(ByteWriter* dest, Digests digests);
  ~DigestingWriter() override;
  DigestingWriter(const DigestingWriter&) = delete;
  DigestingWriter& operator=(const DigestingWriter&) = delete;

  absl::Status Write(absl::string_view data) override;
  absl::Status Close() override;
  uint64_t pos() const override { return dest_->pos(); }

  // XXH3-64 (seed 0) of everything written so far.
  uint64_t xxh3_64() const;
  // CRC-32 (zip's, zlib's) of the bytes written since construction or the last RestartCrc32.
  uint32_t crc32() const { return crc32_; }
  void RestartCrc32() { crc32_ = 0; }

 private:
  ByteWriter* const dest_;
  const Digests digests_;
  XXH3_state_t* xxh3_ = nullptr;
  uint32_t crc32_ = 0;
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

}  // namespace reshard

#endif  // RESHARD_LIB_IO_BYTE_WRITER_H_
