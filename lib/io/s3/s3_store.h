// The "s3" kvstore driver (lib/io/kvstore/driver.h): s3:// paths through S3Client.
//
// Linking this library (alwayslink) registers it for "s3://" over DefaultS3Client(), which is
// configured from the AWS environment at the first s3:// access, so a run that reads no
// s3:// path needs no credentials. A folder "s3://b/p" is the key prefix "p/": it exists when
// some key starts with it, and its files are the keys with no further '/' (listed with
// delimiter '/', so a large bucket is not walked). A zero-byte "p/" folder marker is not a file.

#ifndef RESHARD_LIB_IO_S3_S3_STORE_H_
#define RESHARD_LIB_IO_S3_S3_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/io/kvstore/driver.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {

class S3Store final : public kvstore::Driver {
 public:
  // Over DefaultS3Client(), asked for at every call (its configuration error, if any, is
  // returned by every call).
  S3Store() = default;
  // Over `client` (not owned; tests).
  explicit S3Store(S3Client* client) : client_(client) {}

  absl::string_view scheme() const override { return "s3"; }

  // "s3://bucket" or "s3://bucket/key" validated by ParseS3Url (bucket name rules; no "." or
  // ".." or empty key segments), without a trailing '/'.
  absl::StatusOr<std::string> ConfinedPath(const std::string& url,
                                           bool must_exist) const override;

  // HEAD of the key, then (not found, or failed without an S3 error code: HEAD answers have
  // no body) a one-entry LIST of "key/". NotFound naming the URL, the key and the prefix when
  // neither exists; the LIST's error (NoSuchBucket, SignatureDoesNotMatch, ...) otherwise.
  absl::StatusOr<kvstore::PathStat> Stat(const std::string& url) const override;
  // The objects and sub-prefixes of a delimiter LIST of "key/".
  absl::StatusOr<kvstore::Listing> List(const std::string& url) const override;
  // One range GET (S3Client::GetRange retries it) of the object `opened` names: its ETag sent
  // as If-Match and compared, its size checked against Content-Range.
  absl::Status ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                         const kvstore::PathStat& opened) const override;
  // One PUT with If-None-Match: * (S3Client::PutIfAbsent; radosgw 16.2 honours it). A PUT
  // retried after its first attempt created the object but the answer was lost gets 412 and
  // reports AlreadyExists: a caller that must know compares the object's bytes.
  absl::Status CreateExclusive(const std::string& url, absl::string_view bytes) const override;
  // A multipart upload (S3ObjectWriter, S3ObjectWriter::OptionsFor the size hint, the
  // metadata as x-amz-meta-*); Commit returns the object's ETag.
  absl::StatusOr<std::unique_ptr<kvstore::Writer>> Write(
      const std::string& url, const kvstore::WriteOptions& options) const override;
  // One PUT; returns the object's ETag.
  absl::StatusOr<std::string> WriteFile(const std::string& url,
                                        absl::string_view bytes) const override;
  // The upload's parts in flight and the one filling (S3ObjectWriter::MemoryBound).
  uint64_t WriteMemoryBound(const kvstore::WriteOptions& options) const override;
  // Aborts the unfinished multipart uploads of keys starting with `prefix`'s key
  // (AbortStaleUploads).
  absl::Status AbortUnfinishedWrites(const std::string& prefix) const override;
  absl::Status Delete(const std::string& url) const override;

 private:
  absl::StatusOr<S3Client*> Client() const;

  S3Client* const client_ = nullptr;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_STORE_H_
