// The "s3" RemoteStore (lib/io/remote_store.h): s3:// inputs read through S3Client.
//
// Linking this library (alwayslink) registers it for "s3://" over DefaultS3Client(), which is
// configured from the AWS environment at the first s3:// access, so a run that reads no
// s3:// path needs no credentials. A folder "s3://b/p" is the key prefix "p/": it exists when
// some key starts with it, and its files are the keys with no further '/' (listed with
// delimiter '/', so a large bucket is not walked). A zero-byte "p/" folder marker is not a file.

#ifndef RESHARD_LIB_IO_S3_S3_STORE_H_
#define RESHARD_LIB_IO_S3_S3_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "lib/io/remote_store.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {

class S3Store : public RemoteStore {
 public:
  // Over DefaultS3Client(), asked for at every call (its configuration error, if any, is
  // returned by every call).
  S3Store() = default;
  // Over `client` (not owned; tests).
  explicit S3Store(S3Client* client) : client_(client) {}

  // HEAD of the key, then (not found, or failed without an S3 error code: HEAD answers have
  // no body) a one-entry LIST of "key/". NotFound naming the URL, the key and the prefix when
  // neither exists; the LIST's error (NoSuchBucket, SignatureDoesNotMatch, ...) otherwise.
  absl::StatusOr<RemoteStat> Stat(const std::string& url) override;
  absl::StatusOr<std::vector<RemoteEntry>> List(const std::string& url) override;
  // The objects and sub-prefixes of a delimiter LIST of "key/".
  absl::StatusOr<RemoteListing> ListEntries(const std::string& url) override;
  // One range GET (S3Client::GetRange retries it) of the object `opened` names: its ETag sent
  // as If-Match and compared, its size checked against Content-Range.
  absl::Status ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                         const RemoteStat& opened) override;

 private:
  absl::StatusOr<S3Client*> Client() const;

  S3Client* const client_ = nullptr;
};

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_STORE_H_
