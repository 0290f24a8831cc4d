// The libcurl callbacks of one attempt of an S3 request (S3Client::Send): the answer's body
// into the caller's span or a capped string, its headers into a map, and the throughput floor
// that aborts an attempt whose body arrives too slowly.

#ifndef RESHARD_LIB_IO_S3_S3_TRANSFER_H_
#define RESHARD_LIB_IO_S3_S3_TRANSFER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "lib/io/s3/curl_library.h"
#include "lib/io/s3/s3_request.h"

namespace reshard {

// The largest error body and the most header bytes an answer may have.
inline constexpr size_t kMaxErrorBodyBytes = 64 << 10;
inline constexpr size_t kMaxHeaderBytes = 64 << 10;

// What the callbacks of one attempt share.
struct TransferState {
  const CurlLibrary* library = nullptr;
  CURL* curl = nullptr;
  S3Response* response = nullptr;
  absl::Span<char> out;
  bool to_span = false;
  size_t max_xml_bytes = 0;
  size_t header_bytes = 0;
  // Set when the server sent more than the caller's buffer or the XML cap allows.
  bool overflow = false;
  // Throughput floor (OnTransferProgress): when the attempt started, and the least average
  // rate in bytes per second once `grace` has passed (0: none).
  absl::Time start;
  absl::Duration grace;
  double min_rate = 0;
  // Set by OnTransferProgress when it aborted the transfer: the body bytes received by then.
  bool too_slow = false;
  uint64_t slow_bytes = 0;
  absl::Duration slow_elapsed;
};

// CURLOPT_WRITEFUNCTION: a 2xx body of a span request into `out` (more than fits is an
// overflow), any other body into the response's string, capped at max_xml_bytes for a 2xx
// answer and kMaxErrorBodyBytes otherwise. `user` is the TransferState.
size_t OnTransferBody(char* data, size_t size, size_t count, void* user);

// CURLOPT_HEADERFUNCTION: each "Name: value" line into the response's headers (lowercase
// names, values trimmed); a status line starts a new answer's headers (after 100 Continue or a
// redirect). More than kMaxHeaderBytes ends the transfer.
size_t OnTransferHeader(char* data, size_t size, size_t count, void* user);

// CURLOPT_XFERINFOFUNCTION (about once a second, and on every chunk): aborts the transfer
// when, past the grace period, the body has arrived slower than the floor on average.
int OnTransferProgress(void* user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow);

// "2.0 KiB/s" for a rate in bytes per second.
std::string KiBPerSecond(double bytes_per_second);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_TRANSFER_H_
