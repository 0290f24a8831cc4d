// A source stage that digests what is read through it, the read side's match of Xxh3Writer
// (lib/io/byte_writer.h): reads go on to the source behind it, and the bytes of every Read that
// continues where the digest stopped extend the XXH3-64 of the file's first digested() bytes.
// Reads elsewhere (a header read again, a jump ahead) pass through and leave the digest as is.
//
//   ViewByteSource view(mapping, path);
//   Xxh3Source digest(&view);
//   ... reads front to back ...
//   if (digest.digested() == digest.size()) hash = digest.xxh3_64();
//
// Thread compatible, as ByteSource.

#ifndef RESHARD_LIB_IO_DIGESTING_SOURCE_H_
#define RESHARD_LIB_IO_DIGESTING_SOURCE_H_

#include <xxhash.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/io/byte_range.h"
#include "lib/io/byte_source.h"

namespace reshard {

class Xxh3Source final : public ByteSource {
 public:
  explicit Xxh3Source(ByteSource* source);
  ~Xxh3Source() override;
  Xxh3Source(const Xxh3Source&) = delete;
  Xxh3Source& operator=(const Xxh3Source&) = delete;

  const std::string& path() const override { return source_->path(); }
  uint64_t size() const override { return source_->size(); }
  absl::StatusOr<absl::string_view> Read(uint64_t offset, uint64_t length,
                                         absl::string_view what) override;
  absl::Status Prefetch(std::vector<ByteRange> ranges) override {
    return source_->Prefetch(std::move(ranges));
  }

  // The file's first bytes digested so far.
  uint64_t digested() const { return digested_; }
  // XXH3-64 (seed 0) of bytes [0, digested()).
  uint64_t xxh3_64() const;

 private:
  ByteSource* const source_;
  XXH3_state_t* const state_;
  uint64_t digested_ = 0;
};

// XXH3-64 of the whole of `source`, read front to back through an Xxh3Source in reads of at
// most `chunk` bytes; `read(offset, length)`, when set, is called after each (a mapping
// releases those pages).
absl::StatusOr<uint64_t> Xxh3OfSource(ByteSource& source, uint64_t chunk,
                                      const std::function<void(uint64_t, uint64_t)>& read = {});

}  // namespace reshard

#endif  // RESHARD_LIB_IO_DIGESTING_SOURCE_H_
