#include "lib/io/byte_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "lib/io/crc32.h"

namespace reshard {

DigestingWriter::DigestingWriter(ByteWriter* dest, Digests digests)
    : dest_(dest), digests_(digests) {
  if (digests_.xxh3_64) {
    xxh3_ = XXH3_createState();
    XXH3_64bits_reset(xxh3_);
  }
}

DigestingWriter::~DigestingWriter() {
  if (xxh3_ != nullptr) XXH3_freeState(xxh3_);
}

absl::Status DigestingWriter::Write(absl::string_view data) {
  if (xxh3_ != nullptr) XXH3_64bits_update(xxh3_, data.data(), data.size());
  if (digests_.crc32) crc32_ = Crc32(crc32_, data.data(), data.size());
  return dest_->Write(data);
}

absl::Status DigestingWriter::Close() { return dest_->Close(); }

uint64_t DigestingWriter::xxh3_64() const {
  return xxh3_ != nullptr ? XXH3_64bits_digest(xxh3_) : 0;
}

absl::Status ExactSizeWriter::Write(absl::string_view data) {
  if (data.size() > size_ - std::min(size_, dest_->pos())) {
    return absl::InternalError(absl::StrCat(name_, ": ", dest_->pos() + data.size(),
                                            " bytes written but the plan expects ", size_));
  }
  return dest_->Write(data);
}

absl::Status ExactSizeWriter::Close() {
  if (dest_->pos() != size_) {
    return absl::InternalError(
        absl::StrCat(name_, ": wrote ", dest_->pos(), " bytes but the plan expects ", size_));
  }
  return dest_->Close();
}

}  // namespace reshard
