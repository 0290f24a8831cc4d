#include "lib/io/s3/s3_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "lib/io/s3/curl_library.h"
#include "lib/io/s3/s3_location.h"
#include "lib/io/s3/s3_request.h"
#include "lib/io/s3/s3_retry.h"
#include "lib/io/s3/s3_transfer.h"
#include "lib/io/s3/s3_xml.h"

namespace reshard {

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(Options options) {
  ASSIGN_OR_RETURN(const CurlLibrary* curl, LoadCurlLibrary());
  if (options.config.credentials.access_key_id.empty() ||
      options.config.credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError("S3 client: no credentials");
  }
  if (options.retry.max_attempts < 1) {
    return absl::InvalidArgumentError("S3 client: retry.max_attempts must be at least 1");
  }
  if (options.max_stalled_attempts < 1) {
    return absl::InvalidArgumentError("S3 client: max_stalled_attempts must be at least 1");
  }
  return std::unique_ptr<S3Client>(new S3Client(std::move(options), curl));
}

S3Client::S3Client(Options options, const CurlLibrary* curl)
    : options_(std::move(options)),
      curl_(curl),
      userpwd_(absl::StrCat(options_.config.credentials.access_key_id, ":",
                            options_.config.credentials.secret_access_key)),
      sigv4_(absl::StrCat("aws:amz:", options_.config.region, ":s3")) {}

S3Client::~S3Client() {
  absl::MutexLock lock(&mu_);
  for (void* handle : idle_handles_) curl_->easy_cleanup(static_cast<CURL*>(handle));
}

S3ClientStats S3Client::stats() const { return S3ClientStats{requests_.load(), retries_.load()}; }

void* S3Client::TakeHandle() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_handles_.empty()) {
      void* handle = idle_handles_.back();
      idle_handles_.pop_back();
      return handle;
    }
  }
  return curl_->easy_init();
}

void S3Client::ReturnHandle(void* handle) {
  constexpr size_t kMaxIdleHandles = 32;
  absl::MutexLock lock(&mu_);
  if (idle_handles_.size() < kMaxIdleHandles) {
    idle_handles_.push_back(handle);
  } else {
    curl_->easy_cleanup(static_cast<CURL*>(handle));
  }
}

absl::StatusOr<S3Client::Response> S3Client::Send(const Request& request, absl::string_view what) {
  const std::string url = S3RequestUrl(options_.config, request.bucket, request.key, request.query);
  S3RetryRequest facts;
  facts.throughput_floor = request.throughput_floor;
  facts.span_bytes = request.out.size();
  facts.body_bytes = request.has_body ? request.body.size() : 0;
  S3RetryLoop loop(options_, facts, what);
  for (;;) {
    RETURN_IF_ERROR(loop.NextAttempt());
    if (loop.attempt() > 1) retries_.fetch_add(1);
    requests_.fetch_add(1);
    Response response;
    TransferState state;
    state.response = &response;
    state.out = request.out;
    state.to_span = request.to_span;
    state.max_xml_bytes = options_.max_xml_bytes;
    state.start = loop.attempt_start();
    state.grace = loop.grace();
    state.min_rate = loop.min_rate();
    ASSIGN_OR_RETURN(S3AttemptEnd end, Perform(request, url, loop.time_limit(), state));
    if (state.overflow) {
      if (request.to_span && response.http_status == 200) {
        return absl::DataLossError(
            absl::StrCat(what, ": server ignored the range (HTTP 200, Content-Length ",
                         ResponseHeader(response, "content-length"), ") and sent more than the ",
                         request.out.size(), " bytes asked for"));
      }
      if (request.to_span && response.http_status >= 200 && response.http_status < 300) {
        return absl::DataLossError(absl::StrCat(what, ": server sent more than the ",
                                                request.out.size(), " bytes asked for"));
      }
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": response body larger than ", options_.max_xml_bytes, " bytes"));
    }
    if (end.curl_code == CURLE_OK) {
      if (response.http_status >= 200 && response.http_status < 300) return response;
      const S3Error error = ParseS3Error(static_cast<int>(response.http_status), response.body);
      end.http_status = error.http_status;
      end.s3_code = error.code;
      end.answer_error = S3ErrorToStatus(error, what);
    }
    RETURN_IF_ERROR(loop.AttemptFailed(end));
  }
}

absl::StatusOr<S3AttemptEnd> S3Client::Perform(const Request& request, const std::string& url,
                                               absl::Duration time_limit, TransferState& state) {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  curl_->easy_reset(curl);
  state.library = curl_;
  state.curl = curl;
  curl_slist* headers = nullptr;
  headers = curl_->slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  headers = curl_->slist_append(headers, "Content-Type: application/octet-stream");
  if (!options_.config.credentials.session_token.empty()) {
    headers = curl_->slist_append(
        headers,
        absl::StrCat("x-amz-security-token: ", options_.config.credentials.session_token).c_str());
  }
  for (const std::string& header : request.headers) {
    headers = curl_->slist_append(headers, header.c_str());
  }
  curl_->easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_->easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_->easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_->easy_setopt(curl, CURLOPT_USERPWD, userpwd_.c_str());
  curl_->easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  // No "Expect:" header to suppress 100-continue: libcurl would sign the empty header.
  curl_->easy_setopt(curl, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
  curl_->easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_->easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_->easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_->easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(absl::ToInt64Seconds(options_.stall_timeout)));
  curl_->easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnTransferBody);
  curl_->easy_setopt(curl, CURLOPT_WRITEDATA, &state);
  curl_->easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnTransferHeader);
  curl_->easy_setopt(curl, CURLOPT_HEADERDATA, &state);
  if (state.min_rate > 0) {
    curl_->easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnTransferProgress);
    curl_->easy_setopt(curl, CURLOPT_XFERINFODATA, &state);
    curl_->easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  }
  curl_->easy_setopt(
      curl, CURLOPT_TIMEOUT_MS,
      static_cast<long>(std::max<int64_t>(1, absl::ToInt64Milliseconds(time_limit))));
  if (absl::string_view(request.method) == "HEAD") {
    curl_->easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (absl::string_view(request.method) != "GET") {
    curl_->easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method);
  }
  if (request.has_body) {
    curl_->easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    curl_->easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
  }
  const CURLcode rc = curl_->easy_perform(curl);
  S3AttemptEnd end;
  end.ended = absl::Now();
  end.curl_code = static_cast<int>(rc);
  if (rc != CURLE_OK) end.curl_error = curl_->easy_strerror(rc);
  curl_->easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &state.response->http_status);
  curl_off_t sent = 0;
  curl_->easy_getinfo(curl, CURLINFO_SIZE_UPLOAD_T, &sent);
  curl_off_t connect_us = 0;  // 0: never connected
  curl_->easy_getinfo(curl, CURLINFO_CONNECT_TIME_T, &connect_us);
  curl_->slist_free_all(headers);
  ReturnHandle(curl);
  end.sent = static_cast<uint64_t>(sent);
  end.connected = connect_us != 0;
  end.span_bytes = state.response->span_bytes;
  end.received = state.response->span_bytes + state.response->body.size();
  end.too_slow = state.too_slow;
  end.slow_bytes = state.slow_bytes;
  end.slow_elapsed = state.slow_elapsed;
  return end;
}

absl::Status S3Client::CreateBucket(absl::string_view bucket) {
  RETURN_IF_ERROR(ValidateBucketName(bucket));
  Request request;
  request.method = "PUT";
  request.bucket = std::string(bucket);
  request.has_body = true;
  return Send(request, absl::StrCat("CreateBucket ", S3Url(bucket, ""))).status();
}

absl::StatusOr<S3ObjectInfo> S3Client::Head(absl::string_view bucket, absl::string_view key) {
  const std::string what = absl::StrCat("HEAD ", S3Url(bucket, key));
  Request request;
  request.method = "HEAD";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  ASSIGN_OR_RETURN(Response response, Send(request, what));
  S3ObjectInfo info;
  info.key = std::string(key);
  ASSIGN_OR_RETURN(info.size, ParseObjectSize(ResponseHeader(response, "content-length"), what));
  info.etag = ResponseHeader(response, "etag");
  return info;
}

absl::Status S3Client::GetRange(absl::string_view bucket, absl::string_view key, uint64_t offset,
                                absl::Span<char> out, const S3ObjectVersion& expected) {
  if (out.empty()) return absl::OkStatus();
  const uint64_t last = offset + out.size() - 1;
  const std::string range = absl::StrCat("bytes=", offset, "-", last);
  const std::string url = S3Url(bucket, key);
  const std::string what = absl::StrCat("GET ", url, " ", range);
  Request request;
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  request.headers.push_back(absl::StrCat("Range: ", range));
  if (!expected.etag.empty()) request.headers.push_back(absl::StrCat("If-Match: ", expected.etag));
  request.out = out;
  request.to_span = true;
  request.throughput_floor = true;
  const auto changed = [&](absl::string_view now) {
    return absl::FailedPreconditionError(absl::StrCat(url, " changed while being read: ETag ",
                                                      expected.etag, " at open, ", now,
                                                      " at offset ", offset, " (", what, ")"));
  };
  absl::StatusOr<Response> sent = Send(request, what);
  if (!sent.ok()) {
    if (!expected.etag.empty() && absl::IsFailedPrecondition(sent.status())) {
      // If-Match failed (412): the object was replaced. Its ETag now, for the message.
      absl::StatusOr<S3ObjectInfo> now = Head(bucket, key);
      if (now.ok()) return changed(now->etag);
      if (absl::IsNotFound(now.status())) return changed("none (deleted)");
      return changed(absl::StrCat("unknown (", sent.status().message(), ")"));
    }
    return sent.status();
  }
  const Response& response = *sent;
  const std::string etag = ResponseHeader(response, "etag");
  if (!expected.etag.empty() && !etag.empty() && etag != expected.etag) return changed(etag);
  const std::string content_length = ResponseHeader(response, "content-length");
  if (!content_length.empty() && content_length != absl::StrCat(response.span_bytes)) {
    return absl::DataLossError(absl::StrCat(what, ": body of ", response.span_bytes,
                                            " bytes but Content-Length ", content_length));
  }
  if (response.http_status == 200) {
    // The server ignored Range and sent the whole object: right only when that was asked for.
    if (offset != 0 || (expected.size.has_value() && *expected.size != out.size()) ||
        response.span_bytes != out.size()) {
      return absl::DataLossError(absl::StrCat(what, ": server ignored the range (HTTP 200 with ",
                                              response.span_bytes, " bytes)"));
    }
    return absl::OkStatus();
  }
  // 206: "bytes A-B/TOTAL" must be the range asked for, TOTAL the object's size.
  const std::string content_range = ResponseHeader(response, "content-range");
  uint64_t first = 0, end = 0, total = 0;
  bool total_known = false;
  {
    absl::string_view spec = content_range;
    const bool bytes = absl::ConsumePrefix(&spec, "bytes ");
    const size_t dash = spec.find('-');
    const size_t slash = spec.find('/');
    if (!bytes || dash == absl::string_view::npos || slash == absl::string_view::npos ||
        dash > slash || !absl::SimpleAtoi(spec.substr(0, dash), &first) ||
        !absl::SimpleAtoi(spec.substr(dash + 1, slash - dash - 1), &end)) {
      return absl::DataLossError(
          absl::StrCat(what, ": HTTP ", response.http_status, " without a valid Content-Range (\"",
                       absl::CHexEscape(content_range.substr(0, 80)), "\")"));
    }
    const absl::string_view total_text = spec.substr(slash + 1);
    total_known = total_text != "*";
    if (total_known && !absl::SimpleAtoi(total_text, &total)) {
      return absl::DataLossError(absl::StrCat(what, ": invalid Content-Range total \"",
                                              absl::CHexEscape(content_range.substr(0, 80)), "\""));
    }
  }
  if (first != offset || end != last) {
    // A range that ends past the object is answered with the part inside: the caller's error.
    if (first == offset && total_known && end + 1 == total && total <= last &&
        (!expected.size.has_value() || *expected.size == total)) {
      return absl::OutOfRangeError(
          absl::StrCat(what, ": range ends past the end of the object (", total, " bytes)"));
    }
    return absl::DataLossError(absl::StrCat(what, ": server answered with another range (",
                                            content_range, ") at offset ", offset));
  }
  if (total_known && expected.size.has_value() && total != *expected.size) {
    return absl::DataLossError(absl::StrCat(what, ": Content-Range ", content_range,
                                            " gives the object ", total, " bytes, not the ",
                                            *expected.size, " it had at open"));
  }
  if (response.span_bytes != out.size()) {
    return absl::DataLossError(absl::StrCat(what, ": body of ", response.span_bytes,
                                            " bytes (Content-Length ", content_length,
                                            ") but Content-Range ", content_range));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Client::Put(absl::string_view bucket, absl::string_view key,
                                          absl::string_view data) {
  Request request;
  request.method = "PUT";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  request.body = data;
  request.has_body = true;
  ASSIGN_OR_RETURN(Response response, Send(request, absl::StrCat("PUT ", S3Url(bucket, key))));
  return ResponseHeader(response, "etag");
}

absl::StatusOr<std::string> S3Client::PutIfAbsent(absl::string_view bucket, absl::string_view key,
                                                  absl::string_view data) {
  const std::string url = S3Url(bucket, key);
  Request request;
  request.method = "PUT";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  request.headers.push_back("If-None-Match: *");
  request.body = data;
  request.has_body = true;
  absl::StatusOr<Response> response = Send(request, absl::StrCat("PUT ", url, " If-None-Match: *"));
  if (absl::IsFailedPrecondition(response.status())) {
    return absl::AlreadyExistsError(
        absl::StrCat(url, " already exists (", response.status().message(), ")"));
  }
  if (!response.ok()) return response.status();
  return ResponseHeader(*response, "etag");
}

absl::StatusOr<std::vector<S3ObjectInfo>> S3Client::List(absl::string_view bucket,
                                                         absl::string_view prefix, int page_size) {
  if (page_size < 1 || page_size > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("List: page size ", page_size, " not in 1..1000"));
  }
  ASSIGN_OR_RETURN(Folder listed, ListPages(bucket, prefix, /*delimit=*/false,
                                            static_cast<size_t>(page_size), /*max_entries=*/0));
  return std::move(listed.objects);
}

absl::StatusOr<S3Client::Folder> S3Client::ListFolder(absl::string_view bucket,
                                                      absl::string_view prefix,
                                                      size_t max_entries) {
  return ListPages(bucket, prefix, /*delimit=*/true, 1000, max_entries);
}

absl::StatusOr<S3Client::Folder> S3Client::ListPages(absl::string_view bucket,
                                                     absl::string_view prefix, bool delimit,
                                                     size_t page_size, size_t max_entries) {
  const std::string what = absl::StrCat("LIST ", S3Url(bucket, prefix));
  Folder folder;
  const auto listed = [&] { return folder.objects.size() + folder.subfolders.size(); };
  std::string token;
  while (max_entries == 0 || listed() < max_entries) {
    Request request;
    request.bucket = std::string(bucket);
    if (!token.empty()) {
      absl::StrAppend(&request.query, "continuation-token=", S3UriEncode(token, false), "&");
    }
    // Parameters in sorted order, as they are signed (see the header).
    const size_t page = max_entries == 0 ? page_size : std::min(page_size, max_entries - listed());
    absl::StrAppend(&request.query, delimit ? "delimiter=%2F&" : "", "list-type=2&max-keys=", page,
                    "&prefix=", S3UriEncode(prefix, false));
    ASSIGN_OR_RETURN(Response response, Send(request, what));
    for (absl::string_view contents : XmlElements(response.body, "Contents")) {
      S3ObjectInfo info;
      info.key = XmlText(contents, "Key").value_or("");
      ASSIGN_OR_RETURN(info.size, ParseObjectSize(XmlText(contents, "Size").value_or(""), what));
      info.etag = XmlText(contents, "ETag").value_or("");
      folder.objects.push_back(std::move(info));
    }
    for (absl::string_view common : XmlElements(response.body, "CommonPrefixes")) {
      folder.subfolders.push_back(XmlText(common, "Prefix").value_or(""));
    }
    if (XmlText(response.body, "IsTruncated").value_or("false") != "true") break;
    std::string next = XmlText(response.body, "NextContinuationToken").value_or("");
    if (next.empty() || next == token) {
      return absl::DataLossError(absl::StrCat(what, ": truncated page without a new token"));
    }
    token = std::move(next);
  }
  return folder;
}

absl::Status S3Client::Delete(absl::string_view bucket, absl::string_view key) {
  Request request;
  request.method = "DELETE";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  return Send(request, absl::StrCat("DELETE ", S3Url(bucket, key))).status();
}

}  // namespace reshard
