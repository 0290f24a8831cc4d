// A thread-safe S3 client over libcurl, signed with libcurl's SigV4 (CURLOPT_AWS_SIGV4).
//
// Debian packages no S3 SDK for C++, so this is the small subset reshard needs: object HEAD,
// range GET into a caller buffer, small PUT, LIST (v2, paginated), DELETE, bucket creation, and
// multipart uploads. Every call is synchronous; call from several threads to have several
// requests in flight. Easy handles are pooled so connections and DNS results are reused.
//
// Retries: every request is retried (S3RetryLoop, RetryPolicy) on 5xx (but 507), 429/SlowDown,
// timeouts and dropped or truncated connections. All calls here are idempotent or harmless to
// repeat: GET/HEAD/LIST, PUT of the same bytes, DELETE, UploadPart (per part number),
// CreateMultipartUpload (a repeat leaves an extra empty upload, which stale-upload cleanup
// removes), and CompleteMultipartUpload (a repeat after a lost success answers NoSuchUpload,
// reported as FailedPrecondition "may have completed").
//
// Signing pitfalls (see docs/s3.md): the payload is sent unsigned (x-amz-content-sha256:
// UNSIGNED-PAYLOAD, set here, not by libcurl), and query parameters are written sorted and with
// a value ("?uploads="), because libcurl 7.88 signs the query string as written.
//
// Errors name the operation, the s3:// URL and the S3 error code (S3ErrorToStatus).
//
// Where its parts live: a request and its URL in lib/io/s3/s3_request.h, the libcurl callbacks
// of one attempt in s3_transfer.h, the retry loop in s3_retry.h and its policy in
// retry_policy.h, XML answers in s3_xml.h; this class's multipart uploads are defined in
// s3_multipart.cc, the rest in s3_client.cc.
// The requests are virtual so that tests can put an in-memory store in the client's place
// (lib/io/s3/testing/memory_s3_client.h); a request costs far more than the indirection.
// Sizes from the server are bounded: XML responses are capped (Options), a range GET never
// writes past the caller's buffer, and a Content-Length beyond S3's 5 TiB limit is DataLoss.
//
// Range GET answers are checked, not taken at their word (safetensors data has no checksum that
// would catch misplaced bytes): a 206 must name the range asked for in Content-Range, with the
// object's size as its total; the body must be as long as Content-Length and the range; a 200
// (the server ignored Range) is taken only when the whole object was asked for. Otherwise
// DataLoss naming the object and range, not retried. With the ETag the object had when it was
// opened, the GET sends If-Match and compares the answer's ETag: a replaced object is
// FailedPrecondition "s3://b/k changed while being read: ETag "x" at open, "y" at offset N".
//
// Stuck servers: every request ends by a deadline, its retries included (Options::read_deadline
// for range GETs, Options::request_deadline for the others), and a request whose attempts stall
// (nothing moves for Options::stall_timeout) Options::max_stalled_attempts times ends there.
// Those errors are DeadlineExceeded and read "<what>: not done within the request deadline of
// 2m after 3 attempts (last: <how the last attempt ended>)" or "after 2 attempts: <what>: no
// progress for 1m (N of M bytes sent, K bytes received)". A store out of space or over a quota
// (QuotaExceeded, 507 InsufficientStorage) is ResourceExhausted and not retried.
//
// Slow servers: a range GET whose body arrives slower than Options::min_throughput on average
// (checked once Options::throughput_grace has passed since the request was sent) is aborted
// and retried, and every attempt and wait of one range read ends by Options::read_deadline;
// the final error is DeadlineExceeded, naming the object, the range, the bytes received, the
// time and the rate.

#ifndef RESHARD_LIB_IO_S3_S3_CLIENT_H_
#define RESHARD_LIB_IO_S3_S3_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/io/s3/retry_policy.h"
#include "lib/io/s3/s3_config.h"
#include "lib/io/s3/s3_request.h"
#include "lib/io/s3/s3_retry.h"

namespace reshard {

struct CurlLibrary;    // lib/io/s3/curl_library.h
struct TransferState;  // lib/io/s3/s3_transfer.h

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  // As the server sent it, quotes included ("\"9b2c...-3\"" for a multipart object).
  std::string etag;
};

// The object a range read expects: its version when the caller opened it (HEAD or LIST), so
// that one job never mixes the bytes of two versions of an object.
struct S3ObjectVersion {
  // As the server sent it, quotes included; empty: not checked (and no If-Match sent).
  std::string etag;
  // The total every Content-Range must name; nullopt: not checked.
  std::optional<uint64_t> size;
};

struct S3UploadInfo {
  std::string key;
  std::string upload_id;
  // ISO 8601, as the server sent it.
  std::string initiated;
};

struct S3CompletedPart {
  int part_number = 0;
  std::string etag;
};

// Counters for tests and metrics. Thread safe.
struct S3ClientStats {
  uint64_t requests = 0;  // Attempts sent, retries included.
  uint64_t retries = 0;   // Attempts after the first.
};

class S3Client {
 public:
  // The retries, deadlines, stall and throughput floor of every request: S3RetrySettings
  // (lib/io/s3/s3_retry.h).
  struct Options : S3RetrySettings {
    S3Config config;
    // Cap of XML response bodies (LIST pages, errors, multipart answers). Default: 16 MiB.
    size_t max_xml_bytes = 16 << 20;
  };

  // S3 limits for multipart uploads.
  static constexpr uint64_t kMinPartBytes = 5ull << 20;  // All parts but the last (S3).
  static constexpr int kMaxParts = 10000;
  static constexpr uint64_t kMaxObjectBytes = kS3MaxObjectBytes;

  static absl::StatusOr<std::unique_ptr<S3Client>> Create(Options options);
  virtual ~S3Client();

  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // PUT bucket. AlreadyExists when it exists.
  virtual absl::Status CreateBucket(absl::string_view bucket);

  // Size and ETag of an object. NotFound naming the key when it does not exist.
  virtual absl::StatusOr<S3ObjectInfo> Head(absl::string_view bucket, absl::string_view key);

  // Reads exactly out.size() bytes at `offset` into `out`, of the object version `expected`
  // (see the file comment; `{}` checks neither ETag nor size). OutOfRange when the range is not
  // inside the object; DataLoss naming bucket, key and range when the answer names another
  // range or total, or the server sent fewer or more bytes than asked for; FailedPrecondition
  // when the object is not `expected` any more; DeadlineExceeded when too slow. An empty `out`
  // sends nothing.
  virtual absl::Status GetRange(absl::string_view bucket, absl::string_view key, uint64_t offset,
                                absl::Span<char> out, const S3ObjectVersion& expected);

  // Uploads a whole (small, at most 5 GiB) object. Returns its ETag.
  virtual absl::StatusOr<std::string> Put(absl::string_view bucket, absl::string_view key,
                                          absl::string_view data);
  // As Put, only when no object has the key (If-None-Match: *, a conditional write).
  // AlreadyExists naming the URL when one has (412 Precondition Failed).
  virtual absl::StatusOr<std::string> PutIfAbsent(absl::string_view bucket, absl::string_view key,
                                                  absl::string_view data);

  // Every object whose key starts with `prefix`, in key order, following continuation tokens.
  // `page_size` (max-keys, 1..1000) is the number of keys per LIST request.
  virtual absl::StatusOr<std::vector<S3ObjectInfo>> List(absl::string_view bucket,
                                                         absl::string_view prefix,
                                                         int page_size = 1000);

  // What lies directly inside "folder" `prefix` (empty, or ending in '/'): the objects whose
  // keys have no further '/' and the sub-prefixes ("a/b/") of the deeper ones, in key order
  // (ListObjectsV2 with delimiter '/', following continuation tokens). Stops once
  // `max_entries` (objects plus sub-prefixes) are listed; 0 lists all.
  struct Folder {
    std::vector<S3ObjectInfo> objects;
    std::vector<std::string> subfolders;
  };
  virtual absl::StatusOr<Folder> ListFolder(absl::string_view bucket, absl::string_view prefix,
                                            size_t max_entries = 0);

  // Deletes an object; deleting a missing key succeeds (as S3 does).
  virtual absl::Status Delete(absl::string_view bucket, absl::string_view key);

  // Starts a multipart upload; `metadata` becomes x-amz-meta-<name> headers of the finished
  // object (e.g. {"reshard-job": id} so a rerun can recognize outputs it made). Returns the
  // upload id.
  virtual absl::StatusOr<std::string> CreateMultipartUpload(
      absl::string_view bucket, absl::string_view key,
      const std::map<std::string, std::string>& metadata = {});

  // Uploads part `part_number` (1..10000). Returns the part's ETag. Retried like any call.
  virtual absl::StatusOr<std::string> UploadPart(absl::string_view bucket, absl::string_view key,
                                                 absl::string_view upload_id, int part_number,
                                                 absl::string_view data);

  // Completes an upload from its parts (ascending part numbers). Returns the object's ETag.
  virtual absl::StatusOr<std::string> CompleteMultipartUpload(
      absl::string_view bucket, absl::string_view key, absl::string_view upload_id,
      const std::vector<S3CompletedPart>& parts);

  virtual absl::Status AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                            absl::string_view upload_id);

  // Unfinished multipart uploads whose key starts with `prefix` (paginated internally).
  virtual absl::StatusOr<std::vector<S3UploadInfo>> ListMultipartUploads(absl::string_view bucket,
                                                                         absl::string_view prefix);

  S3ClientStats stats() const;

  using Request = S3Request;
  using Response = S3Response;

 protected:
  // `curl` is LoadCurlLibrary's table (Create). Test doubles
  // (lib/io/s3/testing/memory_s3_client.h), which override every request, pass nullptr.
  S3Client(Options options, const CurlLibrary* curl);

 private:
  // Sends `request` with retries (S3RetryLoop, lib/io/s3/s3_retry.h); a non-2xx final answer
  // becomes a status naming `what`.
  absl::StatusOr<Response> Send(const Request& request, absl::string_view what);
  // One attempt of `request` to `url`, cut after `time_limit`, its answer into `state`'s
  // response through the transfer callbacks (s3_transfer.h).
  absl::StatusOr<S3AttemptEnd> Perform(const Request& request, const std::string& url,
                                       absl::Duration time_limit, TransferState& state);
  // ListObjectsV2 pages of `page_size` keys (with delimiter '/' when `delimit`) until the
  // listing ends or `max_entries` (when not 0) objects and sub-prefixes are listed.
  absl::StatusOr<Folder> ListPages(absl::string_view bucket, absl::string_view prefix, bool delimit,
                                   size_t page_size, size_t max_entries);

  void* TakeHandle();
  void ReturnHandle(void* handle);

  const Options options_;
  const CurlLibrary* const curl_;  // loaded by Create; null in test doubles
  const std::string userpwd_;
  const std::string sigv4_;
  absl::Mutex mu_;
  std::vector<void*> idle_handles_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> retries_{0};
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_CLIENT_H_
