#include "lib/io/s3/s3_range_reader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "lib/core/status.h"

namespace reshard {

absl::StatusOr<std::unique_ptr<S3RangeReader>> S3RangeReader::Create(S3Client* client,
                                                                     std::string bucket,
                                                                     std::string key,
                                                                     std::vector<Range> ranges,
                                                                     Options options) {
  const std::string url = absl::StrCat("s3://", bucket, "/", key);
  if (options.in_flight < 1 || options.in_flight > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": ", options.in_flight, " reads in flight is outside 1..64"));
  }
  if (options.max_range_bytes < (64 << 10) || options.max_range_bytes > (1ull << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": range size ", options.max_range_bytes, " is outside 64 KiB..1 GiB"));
  }
  std::vector<Range> pieces;
  for (const Range& range : ranges) {
    if (range.offset + range.length < range.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(url, ": range at ", range.offset, " of ", range.length, " bytes overflows"));
    }
    for (uint64_t done = 0; done < range.length; done += options.max_range_bytes) {
      pieces.push_back(
          {range.offset + done, std::min(options.max_range_bytes, range.length - done)});
    }
  }
  return std::unique_ptr<S3RangeReader>(
      new S3RangeReader(client, std::move(bucket), std::move(key), std::move(pieces), options));
}

S3RangeReader::S3RangeReader(S3Client* client, std::string bucket, std::string key,
                             std::vector<Range> pieces, Options options)
    : client_(client),
      bucket_(std::move(bucket)),
      key_(std::move(key)),
      url_(absl::StrCat("s3://", bucket_, "/", key_)),
      pieces_(std::move(pieces)),
      in_flight_(static_cast<size_t>(options.in_flight)) {
  const size_t threads = std::min(in_flight_, pieces_.size());
  for (size_t i = 0; i < threads; ++i) fetchers_.emplace_back([this] { FetchLoop(); });
}

S3RangeReader::~S3RangeReader() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : fetchers_) thread.join();
}

void S3RangeReader::FetchLoop() {
  while (true) {
    size_t index;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &S3RangeReader::CanFetch));
      if (stopping_ || next_fetch_ >= FetchEnd()) return;
      index = next_fetch_++;
    }
    const Range& piece = pieces_[index];
    std::string data(piece.length, '\0');
    absl::Status status = client_->GetRange(bucket_, key_, piece.offset, absl::MakeSpan(data));
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      if (index < error_index_) {
        error_index_ = index;
        error_ = Annotate(status, absl::StrCat("reading bytes ", piece.offset, "..",
                                               piece.offset + piece.length, " of ", url_));
      }
      continue;  // pieces before it may still be wanted
    }
    ready_.emplace(index, std::move(data));
  }
}

absl::StatusOr<S3RangeReader::Piece> S3RangeReader::Next() {
  absl::MutexLock lock(&mu_);
  if (consumed_ >= pieces_.size()) {
    current_.clear();
    return Piece{};
  }
  mu_.Await(absl::Condition(this, &S3RangeReader::NextReady));
  auto ready = ready_.find(consumed_);
  if (ready == ready_.end()) return error_;  // this piece, or one before it, failed
  current_ = std::move(ready->second);
  ready_.erase(ready);
  const uint64_t offset = pieces_[consumed_].offset;
  ++consumed_;  // lets a fetcher start the next one
  return Piece{offset, current_};
}

}  // namespace reshard
