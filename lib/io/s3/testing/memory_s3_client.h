// An S3Client that keeps its buckets in memory, for tests of code that writes s3:// outputs
// (lib/engine/object_store_output) without a radosgw. It answers as S3 does where callers
// depend on it: objects appear whole at PUT or CompleteMultipartUpload; ETags are the quoted
// MD5 of a PUT object and the multipart ETag (MultipartETag, "-N") of a completed upload;
// missing keys, buckets and uploads are NotFound, and a completion of an unknown upload is
// FailedPrecondition, as S3Client reports NoSuchUpload there. Listings are in key order.
//
// Every request is counted by operation ("PUT", "CreateMultipartUpload", ...), and a test can
// fail chosen requests with `set_interceptor`. Thread safe.

#ifndef RESHARD_LIB_IO_S3_TESTING_MEMORY_S3_CLIENT_H_
#define RESHARD_LIB_IO_S3_TESTING_MEMORY_S3_CLIENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {

class MemoryS3Client final : public S3Client {
 public:
  // Called before every request with its operation and key (empty for bucket requests); a
  // non-OK status is returned instead of carrying the request out (it is still counted).
  using Interceptor = std::function<absl::Status(absl::string_view op, absl::string_view key)>;

  MemoryS3Client();

  void set_interceptor(Interceptor interceptor) ABSL_LOCKS_EXCLUDED(mu_);
  // Requests made so far of operation `op` (a key of the counts, e.g. "UploadPart").
  int count(absl::string_view op) const ABSL_LOCKS_EXCLUDED(mu_);
  // Every object of `bucket`: key -> bytes.
  std::map<std::string, std::string> objects(absl::string_view bucket) const
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status CreateBucket(absl::string_view bucket) override;
  absl::StatusOr<S3ObjectInfo> Head(absl::string_view bucket, absl::string_view key) override;
  absl::Status GetRange(absl::string_view bucket, absl::string_view key, uint64_t offset,
                        absl::Span<char> out, const S3ObjectVersion& expected) override;
  absl::StatusOr<std::string> Put(absl::string_view bucket, absl::string_view key,
                                  absl::string_view data) override;
  absl::StatusOr<std::vector<S3ObjectInfo>> List(absl::string_view bucket, absl::string_view prefix,
                                                 int page_size) override;
  absl::StatusOr<Folder> ListFolder(absl::string_view bucket, absl::string_view prefix,
                                    size_t max_entries) override;
  absl::StatusOr<std::string> PutIfAbsent(absl::string_view bucket, absl::string_view key,
                                          absl::string_view data) override;
  absl::Status Delete(absl::string_view bucket, absl::string_view key) override;
  absl::StatusOr<std::string> CreateMultipartUpload(
      absl::string_view bucket, absl::string_view key,
      const std::map<std::string, std::string>& metadata) override;
  absl::StatusOr<std::string> UploadPart(absl::string_view bucket, absl::string_view key,
                                         absl::string_view upload_id, int part_number,
                                         absl::string_view data) override;
  absl::StatusOr<std::string> CompleteMultipartUpload(
      absl::string_view bucket, absl::string_view key, absl::string_view upload_id,
      const std::vector<S3CompletedPart>& parts) override;
  absl::Status AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                    absl::string_view upload_id) override;
  absl::StatusOr<std::vector<S3UploadInfo>> ListMultipartUploads(absl::string_view bucket,
                                                                 absl::string_view prefix) override;

 private:
  struct Object {
    std::string data;
    std::string etag;  // quoted, as S3 sends it
  };
  struct Upload {
    std::string bucket;
    std::string key;
    std::map<int, std::string> parts;  // part number -> bytes
  };
  using Bucket = std::map<std::string, Object, std::less<>>;

  // Counts the request and asks the interceptor.
  absl::Status Begin(absl::string_view op, absl::string_view key) ABSL_LOCKS_EXCLUDED(mu_);
  // The bucket, or NotFound naming it (NoSuchBucket).
  absl::StatusOr<Bucket*> FindBucket(absl::string_view bucket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The upload `upload_id` of the key, or NotFound naming request `op` and the key
  // (NoSuchUpload).
  absl::StatusOr<Upload*> FindUpload(absl::string_view op, absl::string_view bucket,
                                     absl::string_view key, absl::string_view upload_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The object, or NotFound naming request `op` and the key (NoSuchKey).
  absl::StatusOr<const Object*> FindObject(absl::string_view op, absl::string_view bucket,
                                           absl::string_view key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Interceptor interceptor_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int, std::less<>> counts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Bucket, std::less<>> buckets_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Upload, std::less<>> uploads_ ABSL_GUARDED_BY(mu_);
  int next_upload_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_TESTING_MEMORY_S3_CLIENT_H_
