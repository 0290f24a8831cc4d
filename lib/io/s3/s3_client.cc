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
#include "lib/io/s3/s3_xml.h"

namespace reshard {

// One HTTP request. `query` is already encoded and sorted by parameter name.
struct S3Client::Request {
  const char* method = "GET";
  std::string bucket;
  std::string key;
  std::string query;
  std::vector<std::string> headers;
  absl::string_view body;
  bool has_body = false;
  // Range GETs write the 2xx body here; otherwise it goes to Response::body (capped).
  absl::Span<char> out;
  bool to_span = false;
  // Range GETs: held to Options::min_throughput and, with their retries, to
  // Options::read_deadline; other requests to Options::request_deadline.
  bool throughput_floor = false;
};

struct S3Client::Response {
  long http_status = 0;
  std::map<std::string, std::string> headers;  // Lowercase names.
  std::string body;
  size_t span_bytes = 0;
};

namespace {

constexpr size_t kMaxErrorBodyBytes = 64 << 10;
constexpr size_t kMaxHeaderBytes = 64 << 10;

struct TransferState {
  const CurlLibrary* library = nullptr;
  CURL* curl = nullptr;
  S3Client::Response* response = nullptr;
  absl::Span<char> out;
  bool to_span = false;
  size_t max_xml_bytes = 0;
  size_t header_bytes = 0;
  // Set when the server sent more than the caller's buffer or the XML cap allows.
  bool overflow = false;
  // Throughput floor (OnProgress): when the attempt started, and the least average rate in
  // bytes per second once `grace` has passed (0: none).
  absl::Time start;
  absl::Duration grace;
  double min_rate = 0;
  // Set by OnProgress when it aborted the transfer: the body bytes received by then.
  bool too_slow = false;
  uint64_t slow_bytes = 0;
  absl::Duration slow_elapsed;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<TransferState*>(user);
  const size_t n = size * count;
  long status = 0;
  state->library->easy_getinfo(state->curl, CURLINFO_RESPONSE_CODE, &status);
  S3Client::Response& response = *state->response;
  if (status >= 200 && status < 300 && state->to_span) {
    if (n > state->out.size() - response.span_bytes) {
      state->overflow = true;
      return 0;
    }
    std::memcpy(state->out.data() + response.span_bytes, data, n);
    response.span_bytes += n;
    return n;
  }
  const size_t cap = (status >= 200 && status < 300) ? state->max_xml_bytes : kMaxErrorBodyBytes;
  if (n > cap - std::min(cap, response.body.size())) {
    state->overflow = true;
    return 0;
  }
  response.body.append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<TransferState*>(user);
  const size_t n = size * count;
  state->header_bytes += n;
  if (state->header_bytes > kMaxHeaderBytes) return 0;
  absl::string_view line(data, n);
  if (absl::StartsWith(line, "HTTP/")) {
    state->response->headers.clear();  // A new response (after 100 Continue or a redirect).
    return n;
  }
  const size_t colon = line.find(':');
  if (colon == absl::string_view::npos) return n;
  state->response
      ->headers[absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
      std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  return n;
}

// libcurl's progress callback (about once a second, and on every chunk): aborts the transfer
// when, past the grace period, the body has arrived slower than the floor on average.
int OnProgress(void* user, curl_off_t /*dltotal*/, curl_off_t dlnow, curl_off_t /*ultotal*/,
               curl_off_t /*ulnow*/) {
  auto* state = static_cast<TransferState*>(user);
  if (state->min_rate <= 0) return 0;
  const absl::Duration elapsed = absl::Now() - state->start;
  if (elapsed < state->grace) return 0;
  if (static_cast<double>(dlnow) >= state->min_rate * absl::ToDoubleSeconds(elapsed)) return 0;
  state->too_slow = true;
  state->slow_bytes = static_cast<uint64_t>(dlnow);
  state->slow_elapsed = elapsed;
  return 1;
}

// "2.0 KiB/s" for a rate in bytes per second.
std::string KiBPerSecond(double bytes_per_second) {
  return absl::StrFormat("%.1f KiB/s", bytes_per_second / 1024);
}

std::string HeaderOr(const S3Client::Response& response, const std::string& name) {
  auto it = response.headers.find(name);
  return it == response.headers.end() ? std::string() : it->second;
}

absl::StatusOr<uint64_t> ParseSize(absl::string_view text, absl::string_view what) {
  uint64_t size = 0;
  if (!absl::SimpleAtoi(text, &size) || size > S3Client::kMaxObjectBytes) {
    return absl::DataLossError(absl::StrCat(what, ": server sent an invalid object size \"",
                                            absl::CHexEscape(text.substr(0, 40)), "\""));
  }
  return size;
}

std::string S3Url(absl::string_view bucket, absl::string_view key) {
  return S3Location{std::string(bucket), std::string(key)}.ToString();
}

}  // namespace

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

std::string S3Client::Url(absl::string_view bucket, absl::string_view key,
                          absl::string_view query) const {
  std::string url;
  const std::string& endpoint = options_.config.endpoint;
  if (options_.config.path_style) {
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

absl::StatusOr<S3Client::Response> S3Client::Send(const Request& request, absl::string_view what) {
  const std::string url = Url(request.bucket, request.key, request.query);
  // All attempts and the waits between them end by the deadline: a range read's, or the
  // request's with time for its body at the throughput floor.
  absl::Duration allowed = options_.read_deadline;
  absl::string_view deadline_name = "read";
  if (!request.throughput_floor) {
    deadline_name = "request";
    allowed = options_.request_deadline;
    if (request.has_body && options_.min_throughput > 0) {
      // Whole seconds, so that messages read "2m5s".
      allowed += absl::Ceil(absl::Seconds(static_cast<double>(request.body.size()) /
                                          static_cast<double>(options_.min_throughput)),
                            absl::Seconds(1));
    }
  }
  const absl::Time deadline = absl::Now() + allowed;
  absl::BitGen gen;
  absl::Status last_error;
  std::string last_detail;  // what the last attempt ended with, without `what`
  int attempts = 0;
  int stalls = 0;
  const auto past_deadline = [&] {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": not done within the ", deadline_name, " deadline of ",
                     absl::FormatDuration(allowed), " after ", attempts,
                     attempts == 1 ? " attempt" : " attempts", " (last: ", last_detail, ")"));
  };
  const auto fail = [&](absl::StatusCode code, std::string detail) {
    last_error = absl::Status(code, absl::StrCat(what, ": ", detail));
    last_detail = std::move(detail);
  };
  for (int attempt = 1; attempt <= options_.retry.max_attempts; ++attempt) {
    if (attempt > 1) {
      const absl::Duration backoff = options_.retry.Backoff(attempt - 1, gen);
      if (absl::Now() + backoff >= deadline) return past_deadline();
      retries_.fetch_add(1);
      absl::SleepFor(backoff);
    }
    attempts = attempt;
    requests_.fetch_add(1);
    CURL* curl = static_cast<CURL*>(TakeHandle());
    if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
    curl_->easy_reset(curl);
    Response response;
    TransferState state;
    state.library = curl_;
    state.curl = curl;
    state.response = &response;
    state.out = request.out;
    state.to_span = request.to_span;
    state.max_xml_bytes = options_.max_xml_bytes;
    state.start = absl::Now();
    // The attempt's time limit: the deadline, and the throughput floor's for its bytes.
    absl::Duration time_limit = std::max(absl::Milliseconds(1), deadline - state.start);
    bool floor_limit = false;
    if (request.throughput_floor && options_.min_throughput > 0) {
      state.grace = options_.throughput_grace;
      state.min_rate = static_cast<double>(options_.min_throughput);
      const absl::Duration floor_time =
          options_.throughput_grace +
          absl::Seconds(static_cast<double>(request.out.size()) / state.min_rate);
      if (floor_time < time_limit) {
        time_limit = floor_time;
        floor_limit = true;
      }
    }

    curl_slist* headers = nullptr;
    headers = curl_->slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    headers = curl_->slist_append(headers, "Content-Type: application/octet-stream");
    if (!options_.config.credentials.session_token.empty()) {
      headers = curl_->slist_append(
          headers, absl::StrCat("x-amz-security-token: ", options_.config.credentials.session_token)
                       .c_str());
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
    curl_->easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_->easy_setopt(curl, CURLOPT_WRITEDATA, &state);
    curl_->easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_->easy_setopt(curl, CURLOPT_HEADERDATA, &state);
    if (state.min_rate > 0) {
      curl_->easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
      curl_->easy_setopt(curl, CURLOPT_XFERINFODATA, &state);
      curl_->easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    }
    curl_->easy_setopt(curl, CURLOPT_TIMEOUT_MS,
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
    const absl::Time ended = absl::Now();
    curl_->easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.http_status);
    curl_off_t sent = 0;
    curl_->easy_getinfo(curl, CURLINFO_SIZE_UPLOAD_T, &sent);
    curl_off_t connect_us = 0;  // 0: never connected
    curl_->easy_getinfo(curl, CURLINFO_CONNECT_TIME_T, &connect_us);
    curl_->slist_free_all(headers);
    ReturnHandle(curl);

    if (state.overflow) {
      if (request.to_span && response.http_status == 200) {
        return absl::DataLossError(
            absl::StrCat(what, ": server ignored the range (HTTP 200, Content-Length ",
                         HeaderOr(response, "content-length"), ") and sent more than the ",
                         request.out.size(), " bytes asked for"));
      }
      if (request.to_span && response.http_status >= 200 && response.http_status < 300) {
        return absl::DataLossError(absl::StrCat(what, ": server sent more than the ",
                                                request.out.size(), " bytes asked for"));
      }
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": response body larger than ", options_.max_xml_bytes, " bytes"));
    }
    AttemptOutcome outcome;
    const absl::Duration elapsed = ended - state.start;
    // Aborted by OnProgress, or cut by the floor's time limit while below the floor: too slow.
    if (!state.too_slow && rc == CURLE_OPERATION_TIMEDOUT && floor_limit &&
        elapsed >= state.grace &&
        static_cast<double>(response.span_bytes) <
            state.min_rate * absl::ToDoubleSeconds(elapsed)) {
      state.too_slow = true;
      state.slow_bytes = response.span_bytes;
      state.slow_elapsed = elapsed;
    }
    const uint64_t received = response.span_bytes + response.body.size();
    if (state.too_slow) {
      outcome.transport_error = true;
      const double seconds = absl::ToDoubleSeconds(state.slow_elapsed);
      fail(absl::StatusCode::kDeadlineExceeded,
           absl::StrFormat("received %d bytes in %.1f s (%s, below the %s minimum)",
                           state.slow_bytes, seconds,
                           KiBPerSecond(static_cast<double>(state.slow_bytes) / seconds),
                           KiBPerSecond(state.min_rate)));
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
      outcome.transport_error = true;
      const std::string transferred =
          absl::StrCat(request.has_body ? absl::StrCat(sent, " of ", request.body.size(),
                                                       " bytes sent, ")
                                        : std::string(),
                       received, " bytes received");
      if (ended >= deadline - absl::Milliseconds(10)) {  // CURLOPT_TIMEOUT_MS is in ms
        last_detail = absl::StrCat(curl_->easy_strerror(rc), " (curl ", static_cast<int>(rc),
                                   "); ", transferred);
        return past_deadline();
      }
      if (connect_us == 0) {
        fail(absl::StatusCode::kUnavailable,
             absl::StrCat("could not connect within ",
                          absl::FormatDuration(options_.connect_timeout), " (",
                          curl_->easy_strerror(rc), ", curl ", static_cast<int>(rc), ")"));
      } else if (floor_limit) {
        fail(absl::StatusCode::kDeadlineExceeded,
             absl::StrCat("not done within ", absl::FormatDuration(time_limit), " (",
                          transferred, ")"));
      } else {
        // libcurl's low-speed rule: under 1 KiB/s for stall_timeout.
        ++stalls;
        fail(absl::StatusCode::kDeadlineExceeded,
             absl::StrCat("no progress for ", absl::FormatDuration(options_.stall_timeout), " (",
                          transferred, ")"));
        if (stalls >= options_.max_stalled_attempts) {
          return Annotate(last_error, absl::StrCat("after ", attempt,
                                                   attempt == 1 ? " attempt" : " attempts"));
        }
      }
    } else if (rc != CURLE_OK) {
      outcome.transport_error = true;
      fail(absl::StatusCode::kUnavailable,
           absl::StrCat(curl_->easy_strerror(rc), " (curl ", static_cast<int>(rc), ")"));
    } else if (response.http_status >= 200 && response.http_status < 300) {
      return response;
    } else {
      S3Error error = ParseS3Error(static_cast<int>(response.http_status), response.body);
      outcome.http_status = error.http_status;
      outcome.s3_code = error.code;
      const absl::Status status = S3ErrorToStatus(error, what);
      fail(status.code(), std::string(status.message().substr(what.size() + 2)));
    }
    if (!IsRetryable(outcome)) return last_error;
  }
  return Annotate(last_error, absl::StrCat("after ", options_.retry.max_attempts, " attempts"));
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
  ASSIGN_OR_RETURN(info.size, ParseSize(HeaderOr(response, "content-length"), what));
  info.etag = HeaderOr(response, "etag");
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
  const std::string etag = HeaderOr(response, "etag");
  if (!expected.etag.empty() && !etag.empty() && etag != expected.etag) return changed(etag);
  const std::string content_length = HeaderOr(response, "content-length");
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
  const std::string content_range = HeaderOr(response, "content-range");
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
  return HeaderOr(response, "etag");
}

absl::StatusOr<std::string> S3Client::PutIfAbsent(absl::string_view bucket,
                                                  absl::string_view key, absl::string_view data) {
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
  return HeaderOr(*response, "etag");
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
      ASSIGN_OR_RETURN(info.size, ParseSize(XmlText(contents, "Size").value_or(""), what));
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

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(
    absl::string_view bucket, absl::string_view key,
    const std::map<std::string, std::string>& metadata) {
  const std::string what = absl::StrCat("CreateMultipartUpload ", S3Url(bucket, key));
  Request request;
  request.method = "POST";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  request.query = "uploads=";  // Not "uploads": see the file comment.
  request.has_body = true;
  for (const auto& [name, value] : metadata) {
    for (char c : name) {
      if (!absl::ascii_isalnum(c) && c != '-') {
        return absl::InvalidArgumentError(absl::StrCat(what, ": bad metadata name \"", name, "\""));
      }
    }
    for (char c : value) {
      if (c < 0x20 || c == 0x7f) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": bad metadata value for ", name));
      }
    }
    request.headers.push_back(absl::StrCat("x-amz-meta-", name, ": ", value));
  }
  ASSIGN_OR_RETURN(Response response, Send(request, what));
  std::string upload_id = XmlText(response.body, "UploadId").value_or("");
  if (upload_id.empty()) return absl::DataLossError(absl::StrCat(what, ": no UploadId in answer"));
  return upload_id;
}

absl::StatusOr<std::string> S3Client::UploadPart(absl::string_view bucket, absl::string_view key,
                                                 absl::string_view upload_id, int part_number,
                                                 absl::string_view data) {
  const std::string what = absl::StrCat("UploadPart ", S3Url(bucket, key), " part ", part_number);
  if (part_number < 1 || part_number > kMaxParts) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": part number not in 1..10000"));
  }
  Request request;
  request.method = "PUT";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  request.query =
      absl::StrCat("partNumber=", part_number, "&uploadId=", S3UriEncode(upload_id, false));
  request.body = data;
  request.has_body = true;
  ASSIGN_OR_RETURN(Response response, Send(request, what));
  std::string etag = HeaderOr(response, "etag");
  if (etag.empty()) return absl::DataLossError(absl::StrCat(what, ": no ETag in answer"));
  return etag;
}

absl::StatusOr<std::string> S3Client::CompleteMultipartUpload(
    absl::string_view bucket, absl::string_view key, absl::string_view upload_id,
    const std::vector<S3CompletedPart>& parts) {
  const std::string what = absl::StrCat("CompleteMultipartUpload ", S3Url(bucket, key));
  std::string body = "<CompleteMultipartUpload>";
  int previous = 0;
  for (const S3CompletedPart& part : parts) {
    if (part.part_number <= previous) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": part numbers must ascend"));
    }
    previous = part.part_number;
    absl::StrAppend(&body, "<Part><PartNumber>", part.part_number, "</PartNumber><ETag>",
                    XmlEscape(part.etag), "</ETag></Part>");
  }
  body += "</CompleteMultipartUpload>";
  Request request;
  request.method = "POST";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  request.query = absl::StrCat("uploadId=", S3UriEncode(upload_id, false));
  request.body = body;
  request.has_body = true;
  const uint64_t retries_before = retries_.load();
  absl::StatusOr<Response> response = Send(request, what);
  if (!response.ok()) {
    if (absl::IsNotFound(response.status()) && retries_.load() != retries_before) {
      return absl::FailedPreconditionError(
          absl::StrCat(response.status().message(),
                       " (after a retry: may have completed on an earlier attempt)"));
    }
    return response.status();
  }
  // S3 may answer 200 and report the error in the body.
  if (XmlText(response->body, "Code").has_value()) {
    return S3ErrorToStatus(ParseS3Error(200, response->body), what);
  }
  std::string etag = XmlText(response->body, "ETag").value_or("");
  if (etag.empty()) {
    // Ceph radosgw 16 answers <ETag></ETag>; the object's HEAD has it.
    ASSIGN_OR_RETURN(S3ObjectInfo info, Head(bucket, key), what);
    etag = info.etag;
  }
  return etag;
}

absl::Status S3Client::AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                            absl::string_view upload_id) {
  Request request;
  request.method = "DELETE";
  request.bucket = std::string(bucket);
  request.key = std::string(key);
  request.query = absl::StrCat("uploadId=", S3UriEncode(upload_id, false));
  return Send(request, absl::StrCat("AbortMultipartUpload ", S3Url(bucket, key))).status();
}

absl::StatusOr<std::vector<S3UploadInfo>> S3Client::ListMultipartUploads(absl::string_view bucket,
                                                                         absl::string_view prefix) {
  const std::string what = absl::StrCat("ListMultipartUploads ", S3Url(bucket, prefix));
  std::vector<S3UploadInfo> uploads;
  std::string key_marker, upload_id_marker;
  while (true) {
    Request request;
    request.bucket = std::string(bucket);
    if (!key_marker.empty()) {
      absl::StrAppend(&request.query, "key-marker=", S3UriEncode(key_marker, false), "&");
    }
    absl::StrAppend(&request.query, "prefix=", S3UriEncode(prefix, false), "&");
    if (!upload_id_marker.empty()) {
      absl::StrAppend(&request.query, "upload-id-marker=", S3UriEncode(upload_id_marker, false),
                      "&");
    }
    request.query += "uploads=";
    ASSIGN_OR_RETURN(Response response, Send(request, what));
    for (absl::string_view upload : XmlElements(response.body, "Upload")) {
      uploads.push_back(S3UploadInfo{XmlText(upload, "Key").value_or(""),
                                     XmlText(upload, "UploadId").value_or(""),
                                     XmlText(upload, "Initiated").value_or("")});
    }
    if (XmlText(response.body, "IsTruncated").value_or("false") != "true") break;
    std::string next_key = XmlText(response.body, "NextKeyMarker").value_or("");
    std::string next_id = XmlText(response.body, "NextUploadIdMarker").value_or("");
    if (next_key == key_marker && next_id == upload_id_marker) {
      return absl::DataLossError(absl::StrCat(what, ": truncated page without new markers"));
    }
    key_marker = std::move(next_key);
    upload_id_marker = std::move(next_id);
  }
  return uploads;
}

}  // namespace reshard
