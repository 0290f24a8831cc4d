#include "lib/io/s3/s3_transfer.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace reshard {

size_t OnTransferBody(char* data, size_t size, size_t count, void* user) {
  auto* state = static_cast<TransferState*>(user);
  const size_t n = size * count;
  long status = 0;
  state->library->easy_getinfo(state->curl, CURLINFO_RESPONSE_CODE, &status);
  S3Response& response = *state->response;
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

size_t OnTransferHeader(char* data, size_t size, size_t count, void* user) {
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

int OnTransferProgress(void* user, curl_off_t /*dltotal*/, curl_off_t dlnow, curl_off_t /*ultotal*/,
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

std::string KiBPerSecond(double bytes_per_second) {
  return absl::StrFormat("%.1f KiB/s", bytes_per_second / 1024);
}

}  // namespace reshard
