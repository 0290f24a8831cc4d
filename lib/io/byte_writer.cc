#include "lib/io/byte_writer.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/crc32.h"

namespace reshard {

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

absl::Status DeferredBytesWriter::Write(absl::string_view data) {
  while (!data.empty()) {
    const uint64_t at = dest_->pos();
    while (next_ < ranges_.size() && ranges_[next_].length == 0) ++next_;
    if (next_ == ranges_.size() || at + data.size() <= ranges_[next_].offset) {
      return dest_->Write(data);
    }
    const ByteRange& range = ranges_[next_];
    if (at < range.offset) {
      // The bytes before the range first: the stages behind see them before it is produced.
      const size_t before = static_cast<size_t>(range.offset - at);
      RETURN_IF_ERROR(dest_->Write(data.substr(0, before)));
      data.remove_prefix(before);
      continue;
    }
    if (at == range.offset) {
      ASSIGN_OR_RETURN(produced_, produce_(next_));
      if (produced_.size() != range.length) {
        return absl::InternalError(absl::StrCat(
            name_, ": the deferred bytes at byte offset ", range.offset, " are ",
            produced_.size(), " bytes, the framing promised ", range.length));
      }
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(data.size(), range.end() - at));
    RETURN_IF_ERROR(dest_->Write(absl::string_view(produced_).substr(at - range.offset, n)));
    data.remove_prefix(n);
    if (at + n == range.end()) ++next_;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Crc32Writer>> Crc32Writer::Create(ByteWriter* dest,
                                                                 std::vector<ByteRange> ranges,
                                                                 bool xxh3_64) {
  std::vector<size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ranges[a].offset < ranges[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const ByteRange& before = ranges[order[i - 1]];
    const ByteRange& after = ranges[order[i]];
    if (before.length > 0 && after.length > 0 && before.end() > after.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("CRC-32 ranges overlap: bytes [", before.offset, ", ", before.end(),
                       ") and [", after.offset, ", ", after.end(), ")"));
    }
  }
  return std::unique_ptr<Crc32Writer>(
      new Crc32Writer(dest, std::move(ranges), std::move(order), xxh3_64));
}

Crc32Writer::Crc32Writer(ByteWriter* dest, std::vector<ByteRange> ranges,
                         std::vector<size_t> order, bool xxh3_64)
    : dest_(dest),
      ranges_(std::move(ranges)),
      order_(std::move(order)),
      crc32s_(ranges_.size(), 0),
      xxh3_(xxh3_64 ? XXH3_createState() : nullptr) {
  if (xxh3_ != nullptr) XXH3_64bits_reset(xxh3_);
}

Crc32Writer::~Crc32Writer() {
  if (xxh3_ != nullptr) XXH3_freeState(xxh3_);
}

uint64_t Crc32Writer::xxh3_64() const {
  return xxh3_ != nullptr ? XXH3_64bits_digest(xxh3_) : 0;
}

absl::Status Crc32Writer::Write(absl::string_view data) {
  for (size_t at = 0; at < data.size(); at += kPieceBytes) {
    const absl::string_view piece = data.substr(at, kPieceBytes);
    Checksum(piece);
    if (xxh3_ != nullptr) XXH3_64bits_update(xxh3_, piece.data(), piece.size());
  }
  return dest_->Write(data);
}

void Crc32Writer::Checksum(absl::string_view data) {
  const uint64_t end = at_ + data.size();
  while (next_ < order_.size()) {
    const size_t index = order_[next_];
    const ByteRange& range = ranges_[index];
    if (range.offset >= end && range.length > 0) break;
    const uint64_t from = std::max(at_, range.offset);
    const uint64_t to = std::min(end, range.end());
    if (to > from) {
      crc32s_[index] = Crc32(crc32s_[index], data.data() + (from - at_), to - from);
    }
    if (range.end() > end) break;  // continues in the next piece
    ++next_;
  }
  at_ = end;
}

Xxh3Writer::Xxh3Writer(ByteWriter* dest) : dest_(dest), state_(XXH3_createState()) {
  XXH3_64bits_reset(state_);
}

Xxh3Writer::~Xxh3Writer() { XXH3_freeState(state_); }

absl::Status Xxh3Writer::Write(absl::string_view data) {
  XXH3_64bits_update(state_, data.data(), data.size());
  return dest_->Write(data);
}

uint64_t Xxh3Writer::xxh3_64() const { return XXH3_64bits_digest(state_); }

}  // namespace reshard
