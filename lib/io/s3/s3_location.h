// `s3://bucket/key` locations.
//
// An S3Location is a bucket plus a key (or key prefix) inside it, parsed from the URL form that
// users type. Parsing validates both halves up front, so a bad URL fails with a message naming
// it instead of an HTTP 400 from the server later:
//   - bucket names follow the S3 rules for new buckets: 3-63 characters of lowercase letters,
//     digits, '.' and '-', starting and ending with a letter or digit, no "..", not an IPv4
//     address;
//   - keys are at most 1024 bytes, contain no control characters, and have no "." or ".."
//     segments and no empty segments ("a//b"): an HTTP client normalizes dot segments away, and
//     an empty segment is almost always a typo in a prefix. A trailing '/' is kept (a "folder").

#ifndef RESHARD_LIB_IO_S3_S3_LOCATION_H_
#define RESHARD_LIB_IO_S3_S3_LOCATION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

struct S3Location {
  std::string bucket;
  // The key or key prefix without a leading '/'; empty for the whole bucket.
  std::string key;

  // "s3://bucket/key".
  std::string ToString() const;

  // The location of `name` under this one as a folder: "s3://b/p" + "x" -> "s3://b/p/x".
  S3Location Child(absl::string_view name) const;

  friend bool operator==(const S3Location& a, const S3Location& b) {
    return a.bucket == b.bucket && a.key == b.key;
  }
};

// Parses "s3://bucket" or "s3://bucket/key". InvalidArgument naming `url` when it is not an s3
// URL, the bucket name is invalid or the key is invalid.
absl::StatusOr<S3Location> ParseS3Url(absl::string_view url);

// InvalidArgument (naming the bucket) unless `bucket` is a valid S3 bucket name.
absl::Status ValidateBucketName(absl::string_view bucket);

// InvalidArgument (naming the key) unless `key` is a valid key or key prefix (may be empty).
absl::Status ValidateObjectKey(absl::string_view key);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_LOCATION_H_
