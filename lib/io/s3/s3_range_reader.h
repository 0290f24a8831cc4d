// Reads a list of byte ranges of one S3 object with several range GETs in flight, handing them to
// the caller in order.
//
// This is the data side of s3:// inputs: the copy plan says which bytes of a source a worker
// copies, in which order, and this keeps `in_flight` of them travelling while the caller copies
// the one before (one GET at a time leaves the connection idle for a round trip per range).
// Ranges longer than `max_range_bytes` are read in pieces of that size; memory is bounded by
// (in_flight + 1) * max_range_bytes however many ranges there are.
//
//   ASSIGN_OR_RETURN(auto reader, S3RangeReader::Create(client, bucket, key, ranges, {}));
//   while (true) {
//     ASSIGN_OR_RETURN(S3RangeReader::Piece piece, reader->Next());
//     if (piece.data.empty()) break;   // every range was handed out
//     ... piece.offset, piece.data ...
//   }
//
// Errors name s3://bucket/key and the range. Not thread safe: one caller calls Next.

#ifndef RESHARD_LIB_IO_S3_S3_RANGE_READER_H_
#define RESHARD_LIB_IO_S3_S3_RANGE_READER_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {

class S3RangeReader {
 public:
  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  struct Options {
    // GETs in flight (and threads): 1..64.
    int in_flight = 4;
    // Longer ranges are read in pieces of this many bytes: 64 KiB..1 GiB.
    uint64_t max_range_bytes = 8 << 20;
  };
  // A piece of a range: `data` holds the object's bytes [offset, offset + data.size()).
  struct Piece {
    uint64_t offset = 0;
    absl::string_view data;
  };

  // Starts reading `ranges` (empty ranges are skipped) of `key` in `bucket`. `client` must
  // outlive the reader. InvalidArgument for options out of range.
  static absl::StatusOr<std::unique_ptr<S3RangeReader>> Create(S3Client* client, std::string bucket,
                                                               std::string key,
                                                               std::vector<Range> ranges,
                                                               Options options);
  ~S3RangeReader();
  S3RangeReader(const S3RangeReader&) = delete;
  S3RangeReader& operator=(const S3RangeReader&) = delete;

  // The next piece, in the order of the ranges, valid until the following call; a piece with
  // empty data after the last. A failed GET's error (OutOfRange past the object's end, DataLoss
  // for a short answer, ...) naming the URL and range comes in its piece's turn, after the
  // pieces before it, and again at every later call.
  absl::StatusOr<Piece> Next();

  const std::string& url() const { return url_; }

 private:
  S3RangeReader(S3Client* client, std::string bucket, std::string key, std::vector<Range> pieces,
                Options options);
  void FetchLoop();
  // Pieces past a failed one are not fetched; those before it are, and are handed out first.
  size_t FetchEnd() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::min(pieces_.size(), error_index_);
  }
  bool CanFetch() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || next_fetch_ >= FetchEnd() || next_fetch_ < consumed_ + in_flight_;
  }
  bool NextReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return ready_.count(consumed_) > 0 || consumed_ >= error_index_;
  }

  S3Client* const client_;
  const std::string bucket_;
  const std::string key_;
  const std::string url_;
  const std::vector<Range> pieces_;  // ranges cut to at most max_range_bytes
  const size_t in_flight_;

  std::string current_;  // the piece handed out last

  absl::Mutex mu_;
  size_t next_fetch_ ABSL_GUARDED_BY(mu_) = 0;  // the next piece a fetcher takes
  size_t consumed_ ABSL_GUARDED_BY(mu_) = 0;    // the next piece Next hands out
  std::map<size_t, std::string> ready_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // of the failed piece with the lowest index
  size_t error_index_ ABSL_GUARDED_BY(mu_) = SIZE_MAX;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> fetchers_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_RANGE_READER_H_
