#include "lib/io/s3/s3_object_writer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "lib/core/status.h"
#include "openssl/evp.h"

namespace reshard {
namespace {

// An ETag without its quotes, in lower case.
std::string BareETag(absl::string_view etag) {
  etag = absl::StripAsciiWhitespace(etag);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  return absl::AsciiStrToLower(etag);
}

}  // namespace

absl::StatusOr<std::string> MultipartETag(const std::vector<S3CompletedPart>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("a multipart upload has parts");
  std::string digests;
  for (const S3CompletedPart& part : parts) {
    const std::string hex = BareETag(part.etag);
    if (hex.size() != 32 || !std::all_of(hex.begin(), hex.end(), absl::ascii_isxdigit)) {
      // Not an MD5 (SSE-KMS and some stores' ETags are not): nothing to compare with.
      return absl::FailedPreconditionError(
          absl::StrCat("part ", part.part_number, " has ETag \"", part.etag, "\", not an MD5"));
    }
    digests += absl::HexStringToBytes(hex);
  }
  unsigned char md5[EVP_MAX_MD_SIZE];
  unsigned int md5_size = 0;
  if (EVP_Digest(digests.data(), digests.size(), md5, &md5_size, EVP_md5(), nullptr) != 1) {
    return absl::InternalError("OpenSSL's MD5 failed");
  }
  return absl::StrCat(
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(md5), md5_size)), "-",
      parts.size());
}

S3ObjectWriter::Options S3ObjectWriter::OptionsFor(uint64_t object_bytes,
                                                   uint64_t memory_budget) {
  Options options;
  constexpr uint64_t kMiB = 1 << 20;
  const uint64_t fitting = (object_bytes + S3Client::kMaxParts - 1) / S3Client::kMaxParts;
  options.part_bytes = std::max(options.part_bytes, (fitting + kMiB - 1) / kMiB * kMiB);
  if (memory_budget > 0) {
    // A budget that does not hold the default parts in flight of 8 MiB gets parts of S3's
    // least size: more requests per object, but a writer's least (one part in flight, one
    // filling) is 10 MiB instead of 16.
    if (memory_budget < MemoryBound(options)) {
      const uint64_t smallest = (S3Client::kMinPartBytes + kMiB - 1) / kMiB * kMiB;
      options.part_bytes = std::max(smallest, (fitting + kMiB - 1) / kMiB * kMiB);
    }
    // The part filling and the parts in flight share the budget.
    const uint64_t parts = memory_budget / options.part_bytes;
    options.parts_in_flight = static_cast<int>(
        std::clamp<uint64_t>(parts > 0 ? parts - 1 : 0, 1, options.parts_in_flight));
  }
  return options;
}

absl::StatusOr<std::unique_ptr<S3ObjectWriter>> S3ObjectWriter::Create(S3Client* client,
                                                                       std::string bucket,
                                                                       std::string key,
                                                                       Options options) {
  const std::string url = absl::StrCat("s3://", bucket, "/", key);
  if (bucket.empty() || key.empty() || key.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": an object needs a bucket and a key that does not end in '/'"));
  }
  if (options.part_bytes < S3Client::kMinPartBytes || options.part_bytes > (5ull << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": part size ", options.part_bytes, " is outside S3's 5 MiB..5 GiB"));
  }
  if (options.parts_in_flight < 1 || options.parts_in_flight > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat(url, ": ", options.parts_in_flight, " parts in flight is outside 1..64"));
  }
  ASSIGN_OR_RETURN(std::string upload_id,
                   client->CreateMultipartUpload(bucket, key, options.metadata),
                   absl::StrCat("starting the upload of ", url));
  return std::unique_ptr<S3ObjectWriter>(new S3ObjectWriter(
      client, std::move(bucket), std::move(key), std::move(options), std::move(upload_id)));
}

S3ObjectWriter::S3ObjectWriter(S3Client* client, std::string bucket, std::string key,
                               Options options, std::string upload_id)
    : client_(client),
      bucket_(std::move(bucket)),
      key_(std::move(key)),
      url_(absl::StrCat("s3://", bucket_, "/", key_)),
      options_(std::move(options)),
      upload_id_(std::move(upload_id)) {
  for (int i = 0; i < options_.parts_in_flight; ++i) {
    uploaders_.emplace_back([this] { UploaderLoop(); });
  }
}

S3ObjectWriter::~S3ObjectWriter() {
  if (!completed_) {
    absl::MutexLock lock(&mu_);
    // Parts still queued are not uploaded: the upload is going away.
    if (error_.ok()) error_ = absl::AbortedError(absl::StrCat(url_, ": writer abandoned"));
  }
  StopUploaders();
  if (completed_) return;
  {
    absl::MutexLock lock(&mu_);
    // The store stopped answering: an abort would wait its deadline again for nothing.
    if (absl::IsDeadlineExceeded(error_)) store_stuck_ = true;
  }
  // Best effort: a failed or skipped abort leaves the upload for AbortStaleUploads on the
  // rerun.
  if (!store_stuck_) client_->AbortMultipartUpload(bucket_, key_, upload_id_).IgnoreError();
}

void S3ObjectWriter::StopUploaders() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : uploaders_) {
    if (thread.joinable()) thread.join();
  }
  uploaders_.clear();
}

void S3ObjectWriter::UploaderLoop() {
  while (true) {
    Part part;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &S3ObjectWriter::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping, nothing left
      part = std::move(queue_.front());
      queue_.pop_front();
      if (!error_.ok()) {  // an earlier part failed: the upload will be aborted
        --pending_;
        continue;
      }
    }
    absl::StatusOr<std::string> etag =
        client_->UploadPart(bucket_, key_, upload_id_, part.number,
                            absl::string_view(part.data.data(), part.size));
    absl::MutexLock lock(&mu_);
    if (etag.ok()) {
      completed_parts_.push_back({part.number, *std::move(etag)});
    } else if (error_.ok()) {
      error_ = Annotate(etag.status(), absl::StrCat("uploading part ", part.number, " (",
                                                    part.size, " bytes) of ", url_));
    }
    spare_buffers_.push_back(std::move(part.data));
    --pending_;
  }
}

absl::Status S3ObjectWriter::SubmitPart() {
  if (next_part_ > S3Client::kMaxParts) {
    return absl::ResourceExhaustedError(absl::StrCat(url_, ": more than ", S3Client::kMaxParts,
                                                     " parts of ", options_.part_bytes,
                                                     " bytes; use a larger part size"));
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &S3ObjectWriter::HasRoom));
  RETURN_IF_ERROR(error_);
  queue_.push_back(Part{next_part_++, std::move(buffer_), filled_});
  ++pending_;
  filled_ = 0;
  if (spare_buffers_.empty()) {
    buffer_ = PageBuffer();
  } else {
    buffer_ = std::move(spare_buffers_.back());
    spare_buffers_.pop_back();
  }
  return absl::OkStatus();
}

absl::Status S3ObjectWriter::Write(absl::string_view data) {
  if (closed_) return absl::FailedPreconditionError(absl::StrCat(url_, ": write after Close"));
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(error_);
  }
  while (!data.empty()) {
    if (buffer_.size() < options_.part_bytes) buffer_ = PageBuffer(options_.part_bytes);
    const size_t n = std::min<size_t>(data.size(), options_.part_bytes - filled_);
    std::memcpy(buffer_.data() + filled_, data.data(), n);
    filled_ += n;
    data.remove_prefix(n);
    pos_ += n;
    if (filled_ == options_.part_bytes) RETURN_IF_ERROR(SubmitPart());
  }
  return absl::OkStatus();
}

absl::Status S3ObjectWriter::Close() {
  if (closed_) return absl::FailedPreconditionError(absl::StrCat(url_, ": closed twice"));
  closed_ = true;
  if (pos_ == 0) {
    // S3 refuses to complete an upload without parts: an empty object is a plain PUT.
    RETURN_IF_ERROR(client_->AbortMultipartUpload(bucket_, key_, upload_id_),
                    absl::StrCat("replacing the upload of empty ", url_));
    completed_ = true;  // nothing left to abort
    ASSIGN_OR_RETURN(etag_, client_->Put(bucket_, key_, ""), absl::StrCat("writing ", url_));
    StopUploaders();
    return absl::OkStatus();
  }
  if (filled_ > 0) RETURN_IF_ERROR(SubmitPart());
  std::vector<S3CompletedPart> parts;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &S3ObjectWriter::AllDone));
    RETURN_IF_ERROR(error_);
    parts = completed_parts_;
  }
  StopUploaders();
  std::sort(parts.begin(), parts.end(), [](const S3CompletedPart& a, const S3CompletedPart& b) {
    return a.part_number < b.part_number;
  });
  absl::StatusOr<std::string> etag =
      client_->CompleteMultipartUpload(bucket_, key_, upload_id_, parts);
  if (absl::IsDeadlineExceeded(etag.status())) store_stuck_ = true;
  if (absl::IsFailedPrecondition(etag.status())) {
    // NoSuchUpload: a retried completion after a lost success answer, or an upload aborted by
    // someone else (AbortStaleUploads of a concurrent rerun). Only the first leaves the object
    // these parts make: its size, and the ETag S3 gives a multipart object (the MD5 of the
    // parts' MD5s, "-N"). An older object of the same size under the key is not taken for it.
    absl::StatusOr<S3ObjectInfo> info = client_->Head(bucket_, key_);
    absl::StatusOr<std::string> expected = MultipartETag(parts);
    if (info.ok() && info->size == pos_ && expected.ok() && BareETag(info->etag) == *expected) {
      completed_ = true;
      etag_ = info->etag;
      return absl::OkStatus();
    }
  }
  RETURN_IF_ERROR(etag.status(), absl::StrCat("completing the upload of ", url_, " (", parts.size(),
                                              " parts, ", pos_, " bytes)"));
  completed_ = true;
  etag_ = *std::move(etag);
  return absl::OkStatus();
}

int S3ObjectWriter::parts_uploaded() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(completed_parts_.size());
}

absl::StatusOr<int> AbortStaleUploads(S3Client& client, absl::string_view bucket,
                                      absl::string_view prefix) {
  ASSIGN_OR_RETURN(std::vector<S3UploadInfo> uploads, client.ListMultipartUploads(bucket, prefix),
                   absl::StrCat("listing unfinished uploads under s3://", bucket, "/", prefix));
  int aborted = 0;
  for (const S3UploadInfo& upload : uploads) {
    absl::Status status = client.AbortMultipartUpload(bucket, upload.key, upload.upload_id);
    if (absl::IsNotFound(status)) continue;  // gone meanwhile
    RETURN_IF_ERROR(status, absl::StrCat("aborting the unfinished upload ", upload.upload_id,
                                         " of s3://", bucket, "/", upload.key));
    ++aborted;
  }
  return aborted;
}

}  // namespace reshard
