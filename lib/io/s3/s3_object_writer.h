// A ByteWriter (lib/io/byte_writer.h) that streams one S3 object as a multipart upload.
//
// Writes are cut into parts of `part_bytes` and uploaded by a small pool of threads, at most
// `parts_in_flight` parts buffered or uploading at a time: memory is bounded by
// (parts_in_flight + 1) * part_bytes however large the object, and Write blocks while the
// pool is full. The object appears under its key only when Close has uploaded every part and
// completed the upload (S3 makes a multipart object visible at completion, whole). An object
// written by a run that is killed, or a writer destroyed unclosed or after an error, leaves
// no object: the upload is aborted (or, for a killed process or after a request that ended
// DeadlineExceeded because the store stopped answering, left for AbortStaleUploads to find by
// its key prefix on the rerun).
//
//   ASSIGN_OR_RETURN(auto object, S3ObjectWriter::Create(client, bucket, key, {}));
//   Xxh3Writer digest(object.get());
//   RETURN_IF_ERROR(digest.Write(...));
//   RETURN_IF_ERROR(digest.Close());  // the object exists from here on
//
// Errors name the s3:// URL and the part. Not thread safe (one thread writes a chain), as every
// ByteWriter; the uploads run on the writer's own threads.

#ifndef RESHARD_LIB_IO_S3_S3_OBJECT_WRITER_H_
#define RESHARD_LIB_IO_S3_S3_OBJECT_WRITER_H_

#include <cstdint>
#include <deque>
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
#include "lib/io/byte_writer.h"
#include "lib/io/page_buffer.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {

// The ETag S3 gives the object completed from `parts` (their ETags, the MD5s of their bytes):
// the hex MD5 of the concatenated binary MD5s, "-", the number of parts. FailedPrecondition
// when a part's ETag is not an MD5 (encrypted uploads, some stores).
absl::StatusOr<std::string> MultipartETag(const std::vector<S3CompletedPart>& parts);

class S3ObjectWriter final : public ByteWriter {
 public:
  struct Options {
    // Bytes of every part but the last: at least S3Client::kMinPartBytes (S3's 5 MiB), and
    // large enough that the object fits in S3Client::kMaxParts parts.
    uint64_t part_bytes = 8 << 20;
    // Parts buffered or uploading at once (and upload threads): 1..64.
    int parts_in_flight = 4;
    // x-amz-meta-<name> of the finished object (e.g. {"reshard-job": id}).
    std::map<std::string, std::string> metadata;
  };

  // Options for an object of `object_bytes`: parts of 8 MiB up to 78 GiB, beyond that of
  // whole MiB that fit in S3Client::kMaxParts parts. With a `memory_budget` (> 0) below
  // MemoryBound of those options, parts of S3's least size (5 MiB; larger only where the
  // object needs it to fit in kMaxParts parts); then as many parts in flight (up to the
  // default 4, at least 1) as keep MemoryBound within the budget.
  static Options OptionsFor(uint64_t object_bytes, uint64_t memory_budget = 0);
  // The most memory a writer with `options` holds: the parts in flight and the one filling.
  static uint64_t MemoryBound(const Options& options) {
    return (static_cast<uint64_t>(options.parts_in_flight) + 1) * options.part_bytes;
  }

  // Starts the multipart upload of `key` in `bucket`. `client` must outlive the writer.
  // InvalidArgument for options out of range, an empty bucket, or a key that is empty or ends
  // in '/' (not an object S3 tools can download to a file); the client's error when the upload
  // cannot start (a missing bucket is NotFound naming it).
  static absl::StatusOr<std::unique_ptr<S3ObjectWriter>> Create(S3Client* client,
                                                                std::string bucket, std::string key,
                                                                Options options);
  // Aborts the upload unless Close completed it or the store stopped answering.
  ~S3ObjectWriter() override;
  S3ObjectWriter(const S3ObjectWriter&) = delete;
  S3ObjectWriter& operator=(const S3ObjectWriter&) = delete;

  // Appends `data`; uploads every part it fills (blocking while parts_in_flight parts are
  // pending). The first upload error, from any part, is returned here or by Close.
  absl::Status Write(absl::string_view data) override;
  // Uploads the last part, waits for all, and completes the upload: the object exists when
  // this returns OK. An empty object is written with a plain PUT.
  absl::Status Close() override;
  uint64_t pos() const override { return pos_; }

  const std::string& url() const { return url_; }
  // The ETag of the finished object as the server sent it (quotes included), once Close
  // returned OK; empty before. With the size, what tells this object from a later one under
  // the same key (object_store_output's reuse of finished objects).
  const std::string& etag() const { return etag_; }
  // Parts uploaded so far (for tests and progress).
  int parts_uploaded() const;

 private:
  struct Part {
    int number = 0;
    PageBuffer data;
    size_t size = 0;  // of data, the part's bytes
  };

  S3ObjectWriter(S3Client* client, std::string bucket, std::string key, Options options,
                 std::string upload_id);
  // Hands the buffered part to the uploaders, waiting for room.
  absl::Status SubmitPart();
  void UploaderLoop();
  // Stops the uploaders (after the queue drained when `drain`).
  void StopUploaders();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !error_.ok() || pending_ < options_.parts_in_flight;
  }
  bool AllDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; }

  S3Client* const client_;
  const std::string bucket_;
  const std::string key_;
  const std::string url_;
  const Options options_;
  const std::string upload_id_;

  // The part being filled, its first filled_ bytes written. Parts are mapped (PageBuffer):
  // glibc would keep freed 8 MiB buffers in its heaps once its mmap threshold rises.
  PageBuffer buffer_;
  size_t filled_ = 0;
  int next_part_ = 1;
  uint64_t pos_ = 0;
  bool closed_ = false;
  bool completed_ = false;
  // Set when a request ended DeadlineExceeded (the store stopped answering): the destructor
  // then leaves the upload to AbortStaleUploads instead of waiting on the store again.
  bool store_stuck_ = false;
  std::string etag_;

  mutable absl::Mutex mu_;
  std::deque<Part> queue_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // parts queued or uploading
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<S3CompletedPart> completed_parts_ ABSL_GUARDED_BY(mu_);
  // Buffers of uploaded parts, filled again by Write.
  std::vector<PageBuffer> spare_buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> uploaders_;
};

// Aborts every unfinished multipart upload whose key starts with `prefix` in `bucket` (the
// uploads a killed run left behind) and returns how many it aborted. Errors name the upload.
absl::StatusOr<int> AbortStaleUploads(S3Client& client, absl::string_view bucket,
                                      absl::string_view prefix);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_OBJECT_WRITER_H_
