// One HTTP request to S3 and its answer, as S3Client sends them (lib/io/s3/s3_client.h), and
// how a request's URL is spelled: the bucket in the path or in the host name, the key and the
// query percent-encoded as SigV4 signs them.

#ifndef RESHARD_LIB_IO_S3_S3_REQUEST_H_
#define RESHARD_LIB_IO_S3_S3_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lib/io/s3/s3_config.h"

namespace reshard {

// S3's largest object: 5 TiB.
inline constexpr uint64_t kS3MaxObjectBytes = 5ull << 40;

// One HTTP request. `query` is already encoded and sorted by parameter name.
struct S3Request {
  const char* method = "GET";
  std::string bucket;
  std::string key;
  std::string query;
  std::vector<std::string> headers;
  absl::string_view body;
  bool has_body = false;
  // Range GETs write the 2xx body here; otherwise it goes to S3Response::body (capped).
  absl::Span<char> out;
  bool to_span = false;
  // Range GETs: held to S3Client::Options::min_throughput and, with their retries, to
  // Options::read_deadline; other requests to Options::request_deadline.
  bool throughput_floor = false;
};

struct S3Response {
  long http_status = 0;
  std::map<std::string, std::string> headers;  // Lowercase names.
  std::string body;
  size_t span_bytes = 0;
};

// The value of header `name` (lowercase) of `response`; empty when it has none.
std::string ResponseHeader(const S3Response& response, const std::string& name);

// An object size the server sent (Content-Length, a listing's <Size>): DataLoss naming `what`
// for text that is not a number or a size beyond S3's 5 TiB limit.
absl::StatusOr<uint64_t> ParseObjectSize(absl::string_view text, absl::string_view what);

// "s3://bucket/key", for messages.
std::string S3Url(absl::string_view bucket, absl::string_view key);

// Percent-encodes `text` for a URL path (keep_slash) or a query value, per SigV4 (unreserved
// characters A-Z a-z 0-9 - _ . ~ kept, everything else %XX uppercase).
std::string S3UriEncode(absl::string_view text, bool keep_slash);

// The URL of a request for `key` of `bucket` at the endpoint of `config`: the bucket in the
// path (path_style) or as the host's first label, the key percent-encoded with its '/' kept,
// and `query` (already encoded) after '?' when not empty.
std::string S3RequestUrl(const S3Config& config, absl::string_view bucket, absl::string_view key,
                         absl::string_view query);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_REQUEST_H_
