// A stage of a source file's reads, the read side's match of the stages of an output file's
// byte-sink chain (lib/io/writer_chain.h): a MappedFile with a stage attached
// (MappedFile::set_read_stage) tells it every run of bytes read from it, whichever way they
// were read (pread, direct I/O, a driver's range reads, the mapping), so that what is computed
// over the bytes a pass reads (the CRC-32s of records, lib/io/crc32_source.h) is computed in
// one place, below the code that reads.

#ifndef RESHARD_LIB_IO_READ_STAGE_H_
#define RESHARD_LIB_IO_READ_STAGE_H_

#include <cstddef>
#include <cstdint>

namespace reshard {

class ReadStage {
 public:
  virtual ~ReadStage() = default;

  // Bytes [offset, offset + length) of the file were read; a copy of them is at `data`, valid
  // during the call. `data` is null when the bytes were not read as one run (a strided view
  // gathered from the mapping): the stage then knows where, not what. Called from any thread
  // that reads the file, several at once: implementations are thread safe.
  virtual void Read(uint64_t offset, uint64_t length, const std::byte* data) = 0;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_READ_STAGE_H_
