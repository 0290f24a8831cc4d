// The small part of XML that S3 responses need, and S3 error responses mapped to absl::Status.
//
// S3 answers with flat documents (<ListBucketResult>, <Error>, <InitiateMultipartUploadResult>,
// ...): elements without attributes holding text or other elements. reshard only needs to find
// child elements by name and read their text, so this is a scanner, not a parser: it finds
// "<Name>...</Name>" pairs and decodes the five predefined entities and numeric character
// references. Responses are size-capped before they get here (S3Client).

#ifndef RESHARD_LIB_IO_S3_S3_XML_H_
#define RESHARD_LIB_IO_S3_S3_XML_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace reshard {

// The raw (still escaped) contents of every <name>...</name> element in `xml`, in order, not
// nested inside one another. Elements with attributes are not matched (S3 does not use them on
// the elements reshard reads).
std::vector<absl::string_view> XmlElements(absl::string_view xml, absl::string_view name);

// The decoded text of the first <name> element, or nullopt.
std::optional<std::string> XmlText(absl::string_view xml, absl::string_view name);

// Decodes &amp; &lt; &gt; &quot; &apos; and &#N; / &#xN; (ASCII and UTF-8 output).
std::string XmlUnescape(absl::string_view text);

// Escapes text for an XML element body.
std::string XmlEscape(absl::string_view text);

// What an S3 error response said.
struct S3Error {
  int http_status = 0;
  // The <Code> of the body ("NoSuchKey"), or empty when the body had none (HEAD responses have
  // no body).
  std::string code;
  std::string message;
  std::string request_id;
};

// Parses an <Error> body (may be empty or not XML).
S3Error ParseS3Error(int http_status, absl::string_view body);

// Maps an S3 error to a status whose message reads
// "<what>: S3 <Code> (HTTP <status>): <message>". `what` names the request, bucket and key.
//   NoSuchKey, NoSuchBucket, NoSuchUpload, 404          -> NotFound
//   AccessDenied, AllAccessDisabled, 403 (other)        -> PermissionDenied
//   SignatureDoesNotMatch, InvalidAccessKeyId,
//   ExpiredToken, InvalidToken, TokenRefreshRequired     -> Unauthenticated
//   EntityTooSmall, EntityTooLarge, InvalidPart,
//   InvalidPartOrder, InvalidArgument, InvalidRequest,
//   MalformedXML, InvalidBucketName, KeyTooLongError     -> InvalidArgument
//   InvalidRange, 416                                    -> OutOfRange
//   BucketAlreadyExists, BucketAlreadyOwnedByYou,
//   BucketNotEmpty, OperationAborted, 409                -> AlreadyExists / FailedPrecondition
//   PreconditionFailed, 412                              -> FailedPrecondition
//   QuotaExceeded, InsufficientStorage, 507,
//   TooManyBuckets                                       -> ResourceExhausted
//   BadDigest, XAmzContentSHA256Mismatch                 -> DataLoss
//   SlowDown, 429, 503                                   -> Unavailable
//   RequestTimeout, 500 InternalError, other 5xx         -> Unavailable / Internal
//   other 4xx                                            -> InvalidArgument
//   anything else                                        -> Unknown
absl::Status S3ErrorToStatus(const S3Error& error, absl::string_view what);

}  // namespace reshard

#endif  // RESHARD_LIB_IO_S3_S3_XML_H_
