// S3Client's multipart uploads: create, upload a part, complete, abort, list the unfinished.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/s3/s3_client.h"
#include "lib/io/s3/s3_request.h"
#include "lib/io/s3/s3_xml.h"

namespace reshard {

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
  std::string etag = ResponseHeader(response, "etag");
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
