#include "lib/io/s3/s3_xml.h"

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace reshard {
namespace {

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x110000) {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

std::vector<absl::string_view> XmlElements(absl::string_view xml, absl::string_view name) {
  std::vector<absl::string_view> out;
  const std::string open = absl::StrCat("<", name, ">");
  const std::string close = absl::StrCat("</", name, ">");
  size_t pos = 0;
  while (true) {
    const size_t start = xml.find(open, pos);
    if (start == absl::string_view::npos) break;
    const size_t body = start + open.size();
    const size_t end = xml.find(close, body);
    if (end == absl::string_view::npos) break;
    out.push_back(xml.substr(body, end - body));
    pos = end + close.size();
  }
  return out;
}

std::optional<std::string> XmlText(absl::string_view xml, absl::string_view name) {
  std::vector<absl::string_view> elements = XmlElements(xml, name);
  if (elements.empty()) return std::nullopt;
  return XmlUnescape(elements.front());
}

std::string XmlUnescape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '&') {
      out += text[i];
      continue;
    }
    const size_t semi = text.find(';', i);
    if (semi == absl::string_view::npos || semi - i > 10) {
      out += text[i];
      continue;
    }
    const absl::string_view entity = text.substr(i + 1, semi - i - 1);
    uint32_t cp = 0;
    if (entity == "amp") {
      out += '&';
    } else if (entity == "lt") {
      out += '<';
    } else if (entity == "gt") {
      out += '>';
    } else if (entity == "quot") {
      out += '"';
    } else if (entity == "apos") {
      out += '\'';
    } else if (entity.size() > 2 && entity[0] == '#' && (entity[1] == 'x' || entity[1] == 'X') &&
               absl::SimpleHexAtoi(entity.substr(2), &cp)) {
      AppendUtf8(cp, out);
    } else if (entity.size() > 1 && entity[0] == '#' && absl::SimpleAtoi(entity.substr(1), &cp)) {
      AppendUtf8(cp, out);
    } else {
      out += text[i];
      continue;
    }
    i = semi;
  }
  return out;
}

std::string XmlEscape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

S3Error ParseS3Error(int http_status, absl::string_view body) {
  S3Error error;
  error.http_status = http_status;
  // Error bodies are small; a huge one is not worth scanning or quoting.
  if (body.size() > (64 << 10)) body = body.substr(0, 64 << 10);
  error.code = XmlText(body, "Code").value_or("");
  error.message = XmlText(body, "Message").value_or("");
  error.request_id = XmlText(body, "RequestId").value_or("");
  return error;
}

absl::Status S3ErrorToStatus(const S3Error& error, absl::string_view what) {
  static const auto* const kCodes = new absl::flat_hash_map<std::string, absl::StatusCode>({
      {"NoSuchKey", absl::StatusCode::kNotFound},
      {"NoSuchBucket", absl::StatusCode::kNotFound},
      {"NoSuchUpload", absl::StatusCode::kNotFound},
      {"AccessDenied", absl::StatusCode::kPermissionDenied},
      {"AllAccessDisabled", absl::StatusCode::kPermissionDenied},
      {"SignatureDoesNotMatch", absl::StatusCode::kUnauthenticated},
      {"InvalidAccessKeyId", absl::StatusCode::kUnauthenticated},
      {"ExpiredToken", absl::StatusCode::kUnauthenticated},
      {"InvalidToken", absl::StatusCode::kUnauthenticated},
      {"TokenRefreshRequired", absl::StatusCode::kUnauthenticated},
      {"RequestTimeTooSkewed", absl::StatusCode::kUnauthenticated},
      {"EntityTooSmall", absl::StatusCode::kInvalidArgument},
      {"EntityTooLarge", absl::StatusCode::kInvalidArgument},
      {"InvalidPart", absl::StatusCode::kInvalidArgument},
      {"InvalidPartOrder", absl::StatusCode::kInvalidArgument},
      {"InvalidArgument", absl::StatusCode::kInvalidArgument},
      {"InvalidRequest", absl::StatusCode::kInvalidArgument},
      {"MalformedXML", absl::StatusCode::kInvalidArgument},
      {"InvalidBucketName", absl::StatusCode::kInvalidArgument},
      {"KeyTooLongError", absl::StatusCode::kInvalidArgument},
      {"InvalidRange", absl::StatusCode::kOutOfRange},
      {"BucketAlreadyExists", absl::StatusCode::kAlreadyExists},
      {"BucketAlreadyOwnedByYou", absl::StatusCode::kAlreadyExists},
      {"BucketNotEmpty", absl::StatusCode::kFailedPrecondition},
      {"OperationAborted", absl::StatusCode::kFailedPrecondition},
      {"PreconditionFailed", absl::StatusCode::kFailedPrecondition},
      {"SlowDown", absl::StatusCode::kUnavailable},
      {"ServiceUnavailable", absl::StatusCode::kUnavailable},
      {"RequestTimeout", absl::StatusCode::kUnavailable},
      {"InternalError", absl::StatusCode::kUnavailable},
      {"QuotaExceeded", absl::StatusCode::kResourceExhausted},
      {"InsufficientStorage", absl::StatusCode::kResourceExhausted},
      {"TooManyBuckets", absl::StatusCode::kResourceExhausted},
      {"BadDigest", absl::StatusCode::kDataLoss},
      {"XAmzContentSHA256Mismatch", absl::StatusCode::kDataLoss},
  });
  absl::StatusCode code = absl::StatusCode::kUnknown;
  auto it = kCodes->find(error.code);
  if (it != kCodes->end()) {
    code = it->second;
  } else {
    switch (error.http_status) {
      case 401:
        code = absl::StatusCode::kUnauthenticated;
        break;
      case 403:
        code = absl::StatusCode::kPermissionDenied;
        break;
      case 404:
        code = absl::StatusCode::kNotFound;
        break;
      case 409:
        code = absl::StatusCode::kFailedPrecondition;
        break;
      case 412:
        code = absl::StatusCode::kFailedPrecondition;
        break;
      case 416:
        code = absl::StatusCode::kOutOfRange;
        break;
      case 429:
        code = absl::StatusCode::kUnavailable;
        break;
      case 500:
        code = absl::StatusCode::kInternal;
        break;
      case 507:
        code = absl::StatusCode::kResourceExhausted;
        break;
      case 502:
      case 503:
      case 504:
        code = absl::StatusCode::kUnavailable;
        break;
      default:
        if (error.http_status >= 400 && error.http_status < 500) {
          code = absl::StatusCode::kInvalidArgument;
        } else if (error.http_status >= 500) {
          code = absl::StatusCode::kInternal;
        }
    }
  }
  std::string message = absl::StrCat(what, ": S3 ", error.code.empty() ? "error" : error.code,
                                     " (HTTP ", error.http_status, ")");
  if (!error.message.empty()) absl::StrAppend(&message, ": ", error.message);
  if (!error.request_id.empty()) absl::StrAppend(&message, " [request ", error.request_id, "]");
  return absl::Status(code, message);
}

}  // namespace reshard
