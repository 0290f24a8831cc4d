// Builds the byte-sink chain of one output file from what its framing needs, front to back:
//
//   ExactSize -> DeferredBytes -> Crc32 -> Xxh3 -> file (an AtomicFile, direct or buffered;
//                                                       or a writer a sink opened)
//
// Each stage is there only when asked for (lib/io/byte_writer.h); with CRC-32 ranges, the
// Crc32 stage computes the XXH3 too, in the same pass over the bytes, and there is no Xxh3
// stage. The deferred bytes are produced from the CRC-32s of the ranges before them, which the
// Crc32 stage behind has seen by then: a zip record's data descriptor, a central directory.
//
//   WriterChainSpec spec{.name = "model.bin", .size = planned_bytes, .xxh3_64 = true};
//   spec.crc32_ranges = {{record_offset, record_bytes}};
//   ASSIGN_OR_RETURN(auto chain, WriterChain::ToFile(dir, IoMode::kAuto, std::move(spec)));
//   RETURN_IF_ERROR(chain->front().Write(...));
//   RETURN_IF_ERROR(chain->Close());
//   manifest_hash = chain->xxh3_64();

#ifndef RESHARD_LIB_IO_WRITER_CHAIN_H_
#define RESHARD_LIB_IO_WRITER_CHAIN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lib/io/byte_writer.h"
#include "lib/io/directory.h"
#include "lib/io/io_mode.h"

namespace reshard {

struct WriterChainSpec {
  std::string name;  // of the file, in errors
  // The stream's exact size (ExactSizeWriter).
  uint64_t size = 0;
  // Ranges whose CRC-32 the framing needs (Crc32Writer), in any order; WriterChain::crc32s is
  // indexed like them.
  std::vector<ByteRange> crc32_ranges;
  // Ranges whose bytes are produced when the stream reaches them (DeferredBytesWriter), in
  // stream order, by `produce(i, crc32s)`: range i's bytes, from the CRC-32s of crc32_ranges
  // as far as written.
  std::vector<ByteRange> deferred;
  std::function<absl::StatusOr<std::string>(size_t range, const std::vector<uint32_t>& crc32s)>
      produce;
  // Whether the XXH3-64 of the whole stream is computed (Xxh3Writer, or Crc32Writer's).
  bool xxh3_64 = true;
};

class WriterChain {
 public:
  // The chain in front of an AtomicFile `spec.name` created in `dir` with `io`.
  static absl::StatusOr<std::unique_ptr<WriterChain>> ToFile(const Directory& dir, IoMode io,
                                                             WriterChainSpec spec);
  // The chain in front of `file`.
  static absl::StatusOr<std::unique_ptr<WriterChain>> To(std::unique_ptr<ByteWriter> file,
                                                         WriterChainSpec spec);

  WriterChain(const WriterChain&) = delete;
  WriterChain& operator=(const WriterChain&) = delete;

  // Where the stream is written.
  ByteWriter& front() { return *front_; }
  // Closes the chain front to back: size checked, then the file committed.
  absl::Status Close() { return front_->Close(); }

  // The XXH3-64 of what was written (0 unless asked for).
  uint64_t xxh3_64() const {
    if (crc32_ != nullptr) return crc32_->xxh3_64();
    return xxh3_ != nullptr ? xxh3_->xxh3_64() : 0;
  }
  // The CRC-32s of spec.crc32_ranges as far as written.
  const std::vector<uint32_t>& crc32s() const;
  // Whether the file is a local AtomicFile written with direct I/O (so far).
  bool direct() const { return local_ != nullptr && local_->file().direct(); }

 private:
  WriterChain() = default;
  absl::Status Build(std::unique_ptr<ByteWriter> file, WriterChainSpec spec);

  // The file first: every stage writes into the one declared before it, and is destroyed
  // before it.
  std::unique_ptr<ByteWriter> file_;
  AtomicFileWriter* local_ = nullptr;  // file_, when an AtomicFile
  std::unique_ptr<Xxh3Writer> xxh3_;
  std::unique_ptr<Crc32Writer> crc32_;
  std::unique_ptr<DeferredBytesWriter> deferred_;
  std::unique_ptr<ExactSizeWriter> exact_;
  ByteWriter* front_ = nullptr;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_WRITER_CHAIN_H_
