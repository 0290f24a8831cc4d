// The process's S3 client, configured from the standard AWS environment (lib/io/s3/s3_config.h)
// the first time it is asked for, and shared by every reader and writer of s3:// paths after
// that: one connection pool, one set of credentials per process.

#ifndef RESHARD_LIB_IO_S3_DEFAULT_CLIENT_H_
#define RESHARD_LIB_IO_S3_DEFAULT_CLIENT_H_

#include <optional>

#include "absl/status/statusor.h"
#include "lib/io/s3/s3_client.h"

namespace reshard {

// The shared client. The first call reads the environment (AWS_ACCESS_KEY_ID, ...,
// AWS_ENDPOINT_URL, the shared credentials file); its error (no credentials, a malformed
// endpoint) is returned by every later call too, naming what was missing. Thread safe.
absl::StatusOr<S3Client*> DefaultS3Client();

// The shared client's request counters; nullopt until a first DefaultS3Client call has made
// one (metrics read it without creating a client). Thread safe.
std::optional<S3ClientStats> DefaultS3ClientStats();

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_DEFAULT_CLIENT_H_
