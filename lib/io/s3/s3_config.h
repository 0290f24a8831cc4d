// Credentials, region and endpoint of an S3 client, resolved from the standard AWS environment.
//
// Resolution follows the AWS CLI and SDKs for the parts reshard supports:
//   - credentials: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) when set;
//     otherwise the profile AWS_PROFILE (default "default") of the shared credentials file
//     AWS_SHARED_CREDENTIALS_FILE (default ~/.aws/credentials, ~ from HOME);
//   - region: AWS_REGION, then AWS_DEFAULT_REGION, then `region` of the profile in the config
//     file AWS_CONFIG_FILE (default ~/.aws/config; section [default] or [profile NAME]), then
//     "us-east-1";
//   - endpoint: AWS_ENDPOINT_URL, then the profile's `endpoint_url` in the config file (e.g.
//     http://127.0.0.1:7480 for Ceph radosgw or MinIO), sent path-style
//     (http://host/bucket/key); without either, https://s3.REGION.amazonaws.com with
//     virtual-hosted buckets (https://bucket.s3.REGION.amazonaws.com/key).
// Not supported (yet): role assumption, SSO and credential processes of the config file,
// instance metadata and web identity credentials.
//
// The environment is read through an injectable lookup so tests need not touch the process
// environment.

#ifndef RESHARD_LIB_IO_S3_S3_CONFIG_H_
#define RESHARD_LIB_IO_S3_S3_CONFIG_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace reshard {

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  // Empty unless temporary credentials are used (sent as x-amz-security-token).
  std::string session_token;
  // Where the credentials came from, for messages: "environment" or "<file> [profile]". Never
  // contains the secret.
  std::string source;
};

struct S3Config {
  S3Credentials credentials;
  std::string region = "us-east-1";
  // Scheme, host and optional port, no trailing '/': "http://127.0.0.1:7480".
  std::string endpoint;
  // True: http://endpoint/bucket/key. False: http(s)://bucket.host/key.
  bool path_style = true;
};

// Returns the value of an environment variable, or nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvLookup ProcessEnv();

// Resolves an S3Config as described above. FailedPrecondition when no credentials are found
// (the message lists where it looked); InvalidArgument for half-set environment credentials, a
// malformed endpoint or credentials file; NotFound when AWS_PROFILE names a profile the file
// lacks.
absl::StatusOr<S3Config> S3ConfigFromEnv(const EnvLookup& env);

// Reads profile `profile` of the INI-style shared credentials file at `path`.
absl::StatusOr<S3Credentials> ReadSharedCredentials(const std::string& path,
                                                    absl::string_view profile);

// Parses the text of a shared credentials file; `path` is only used in messages.
absl::StatusOr<S3Credentials> ParseSharedCredentials(absl::string_view text,
                                                     absl::string_view profile,
                                                     absl::string_view path);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_CONFIG_H_
