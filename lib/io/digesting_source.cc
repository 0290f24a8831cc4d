#include "lib/io/digesting_source.h"

#if defined(__x86_64__)
// XXH3 of libxxhash with runtime dispatch to AVX2 / AVX-512: its plain entry points use SSE2.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>

#include "lib/core/status.h"

namespace reshard {

Xxh3Source::Xxh3Source(ByteSource* source) : source_(source), state_(XXH3_createState()) {
  XXH3_64bits_reset(state_);
}

Xxh3Source::~Xxh3Source() { XXH3_freeState(state_); }

absl::StatusOr<absl::string_view> Xxh3Source::Read(uint64_t offset, uint64_t length,
                                                   absl::string_view what) {
  ASSIGN_OR_RETURN(absl::string_view bytes, source_->Read(offset, length, what));
  // A read overlapping the digested bytes extends the digest by its part past them.
  if (offset <= digested_ && offset + bytes.size() > digested_) {
    const absl::string_view fresh = bytes.substr(digested_ - offset);
    XXH3_64bits_update(state_, fresh.data(), fresh.size());
    digested_ += fresh.size();
  }
  return bytes;
}

uint64_t Xxh3Source::xxh3_64() const { return XXH3_64bits_digest(state_); }

absl::StatusOr<uint64_t> Xxh3OfSource(ByteSource& source, uint64_t chunk,
                                      const std::function<void(uint64_t, uint64_t)>& read) {
  Xxh3Source digest(&source);
  for (uint64_t offset = 0; offset < digest.size(); offset += chunk) {
    const uint64_t length = std::min(chunk, digest.size() - offset);
    RETURN_IF_ERROR(digest.Read(offset, length, "data to checksum").status());
    if (read) read(offset, length);
  }
  return digest.xxh3_64();
}

}  // namespace reshard
