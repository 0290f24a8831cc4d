// libFuzzer target: whatever a server answers, the XML scanner and the error mapping neither
// crash nor read out of bounds; escaping and unescaping round-trip any text.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "lib/io/s3/s3_xml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int http_status = 200 + (data[0] % 4) * 100 + data[1] % 5;  // 200..504
  absl::string_view body(reinterpret_cast<const char*>(data) + 2, size - 2);
  const reshard::S3Error error = reshard::ParseS3Error(http_status, body);
  (void)reshard::S3ErrorToStatus(error, "GET s3://bucket/key");
  for (absl::string_view element : reshard::XmlElements(body, "Contents")) {
    (void)reshard::XmlText(element, "Key");
    (void)reshard::XmlText(element, "Size");
  }
  if (auto text = reshard::XmlText(body, "UploadId")) (void)reshard::XmlUnescape(*text);
  const std::string text(body);
  if (reshard::XmlUnescape(reshard::XmlEscape(text)) != text) std::abort();
  return 0;
}
