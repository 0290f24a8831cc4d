#include "lib/io/s3/s3_location.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "lib/core/status.h"

namespace reshard {
namespace {

constexpr absl::string_view kScheme = "s3://";
constexpr size_t kMaxKeyBytes = 1024;

bool LooksLikeIpv4(absl::string_view s) {
  std::vector<absl::string_view> parts = absl::StrSplit(s, '.');
  if (parts.size() != 4) return false;
  for (absl::string_view part : parts) {
    int value = 0;
    if (part.empty() || !absl::SimpleAtoi(part, &value)) return false;
  }
  return true;
}

}  // namespace

std::string S3Location::ToString() const {
  if (key.empty()) return absl::StrCat(kScheme, bucket);
  return absl::StrCat(kScheme, bucket, "/", key);
}

S3Location S3Location::Child(absl::string_view name) const {
  S3Location child = *this;
  if (!child.key.empty() && !absl::EndsWith(child.key, "/")) child.key += '/';
  child.key.append(name.data(), name.size());
  return child;
}


absl::Status ValidateBucketName(absl::string_view bucket) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid S3 bucket name \"", bucket, "\": ", why));
  };
  if (bucket.size() < 3 || bucket.size() > 63) return invalid("must have 3 to 63 characters");
  for (char c : bucket) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '.' && c != '-') {
      return invalid("only lowercase letters, digits, '.' and '-' are allowed");
    }
  }
  if (!absl::ascii_isalnum(bucket.front()) || !absl::ascii_isalnum(bucket.back())) {
    return invalid("must start and end with a letter or digit");
  }
  if (absl::StrContains(bucket, "..")) return invalid("must not contain \"..\"");
  if (LooksLikeIpv4(bucket)) return invalid("must not look like an IP address");
  return absl::OkStatus();
}

absl::Status ValidateObjectKey(absl::string_view key) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid S3 key \"", absl::CHexEscape(key), "\": ", why));
  };
  if (key.size() > kMaxKeyBytes) return invalid("longer than 1024 bytes");
  for (char c : key) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return invalid("contains a control character");
  }
  if (key.empty()) return absl::OkStatus();
  if (key.front() == '/') return invalid("starts with '/'");
  absl::string_view body = key;
  if (absl::EndsWith(body, "/")) body.remove_suffix(1);
  for (absl::string_view segment : absl::StrSplit(body, '/')) {
    if (segment.empty()) return invalid("contains an empty segment (\"//\")");
    if (segment == "." || segment == "..") return invalid("contains a \".\" or \"..\" segment");
  }
  return absl::OkStatus();
}

absl::StatusOr<S3Location> ParseS3Url(absl::string_view url) {
  const std::string context = absl::StrCat("S3 URL \"", absl::CHexEscape(url), "\"");
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat(context, ": does not start with s3://"));
  }
  absl::string_view rest = url.substr(kScheme.size());
  S3Location location;
  const size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) {
    location.bucket = std::string(rest);
  } else {
    location.bucket = std::string(rest.substr(0, slash));
    location.key = std::string(rest.substr(slash + 1));
  }
  RETURN_IF_ERROR(ValidateBucketName(location.bucket), context);
  RETURN_IF_ERROR(ValidateObjectKey(location.key), context);
  return location;
}

}  // namespace reshard
