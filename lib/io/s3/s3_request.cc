#include "lib/io/s3/s3_request.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/io/s3/s3_location.h"

namespace reshard {

std::string ResponseHeader(const S3Response& response, const std::string& name) {
  auto it = response.headers.find(name);
  return it == response.headers.end() ? std::string() : it->second;
}

absl::StatusOr<uint64_t> ParseObjectSize(absl::string_view text, absl::string_view what) {
  uint64_t size = 0;
  if (!absl::SimpleAtoi(text, &size) || size > kS3MaxObjectBytes) {
    return absl::DataLossError(absl::StrCat(what, ": server sent an invalid object size \"",
                                            absl::CHexEscape(text.substr(0, 40)), "\""));
  }
  return size;
}

std::string S3Url(absl::string_view bucket, absl::string_view key) {
  return S3Location{std::string(bucket), std::string(key)}.ToString();
}

std::string S3UriEncode(absl::string_view text, bool keep_slash) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += c;
    } else {
      absl::StrAppendFormat(&out, "%%%02X", static_cast<unsigned char>(c));
    }
  }
  return out;
}

std::string S3RequestUrl(const S3Config& config, absl::string_view bucket, absl::string_view key,
                         absl::string_view query) {
  std::string url;
  const std::string& endpoint = config.endpoint;
  if (config.path_style) {
    url = absl::StrCat(endpoint, "/", bucket);
    if (!key.empty()) absl::StrAppend(&url, "/", S3UriEncode(key, /*keep_slash=*/true));
  } else {
    const size_t scheme_end = endpoint.find("://") + 3;
    url = absl::StrCat(endpoint.substr(0, scheme_end), bucket, ".", endpoint.substr(scheme_end),
                       "/", S3UriEncode(key, /*keep_slash=*/true));
  }
  if (!query.empty()) absl::StrAppend(&url, "?", query);
  return url;
}

}  // namespace reshard
