#include "lib/io/s3/testing/memory_s3_client.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/core/status.h"
#include "lib/io/s3/s3_object_writer.h"

namespace reshard {
namespace {

// "\"<hex MD5 of data>\"": the ETag S3 gives a PUT object or an uploaded part.
std::string QuotedMd5(absl::string_view data) {
  unsigned char md5[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), md5, &size, EVP_md5(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) absl::StrAppendFormat(&hex, "%02x", md5[i]);
  return absl::StrCat("\"", hex, "\"");
}

// "s3://bucket/key", with the '/' after an empty key too (as the test doubles' messages read).
std::string ObjectUrl(absl::string_view bucket, absl::string_view key) {
  return absl::StrCat("s3://", bucket, "/", key);
}

}  // namespace

MemoryS3Client::MemoryS3Client() : S3Client(Options{}, /*curl=*/nullptr) {}

void MemoryS3Client::set_interceptor(Interceptor interceptor) {
  absl::MutexLock lock(&mu_);
  interceptor_ = std::move(interceptor);
}

int MemoryS3Client::count(absl::string_view op) const {
  absl::MutexLock lock(&mu_);
  auto it = counts_.find(op);
  return it == counts_.end() ? 0 : it->second;
}

std::map<std::string, std::string> MemoryS3Client::objects(absl::string_view bucket) const {
  absl::MutexLock lock(&mu_);
  std::map<std::string, std::string> out;
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return out;
  for (const auto& [key, object] : it->second) out[key] = object.data;
  return out;
}

absl::Status MemoryS3Client::Begin(absl::string_view op, absl::string_view key) {
  Interceptor interceptor;
  {
    absl::MutexLock lock(&mu_);
    ++counts_[std::string(op)];
    interceptor = interceptor_;
  }
  return interceptor ? interceptor(op, key) : absl::OkStatus();
}

absl::StatusOr<MemoryS3Client::Bucket*> MemoryS3Client::FindBucket(absl::string_view bucket) {
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) {
    return absl::NotFoundError(absl::StrCat(ObjectUrl(bucket, ""), ": S3 NoSuchBucket (HTTP 404)"));
  }
  return &it->second;
}

absl::StatusOr<const MemoryS3Client::Object*> MemoryS3Client::FindObject(absl::string_view op,
                                                                         absl::string_view bucket,
                                                                         absl::string_view key) {
  ASSIGN_OR_RETURN(Bucket * objects, FindBucket(bucket));
  auto it = objects->find(key);
  if (it == objects->end()) {
    return absl::NotFoundError(
        absl::StrCat(op, " ", ObjectUrl(bucket, key), ": S3 NoSuchKey (HTTP 404)"));
  }
  return &it->second;
}

absl::StatusOr<MemoryS3Client::Upload*> MemoryS3Client::FindUpload(absl::string_view op,
                                                                   absl::string_view bucket,
                                                                   absl::string_view key,
                                                                   absl::string_view upload_id) {
  auto it = uploads_.find(upload_id);
  if (it == uploads_.end() || it->second.bucket != bucket || it->second.key != key) {
    return absl::NotFoundError(
        absl::StrCat(op, " ", ObjectUrl(bucket, key), ": S3 NoSuchUpload (HTTP 404)"));
  }
  return &it->second;
}

absl::Status MemoryS3Client::CreateBucket(absl::string_view bucket) {
  RETURN_IF_ERROR(Begin("CreateBucket", ""));
  absl::MutexLock lock(&mu_);
  if (!buckets_.emplace(std::string(bucket), Bucket()).second) {
    return absl::AlreadyExistsError(
        absl::StrCat(ObjectUrl(bucket, ""), ": S3 BucketAlreadyOwnedByYou"));
  }
  return absl::OkStatus();
}

absl::StatusOr<S3ObjectInfo> MemoryS3Client::Head(absl::string_view bucket, absl::string_view key) {
  RETURN_IF_ERROR(Begin("HEAD", key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Object* object, FindObject("HEAD", bucket, key));
  return S3ObjectInfo{std::string(key), object->data.size(), object->etag};
}

absl::Status MemoryS3Client::GetRange(absl::string_view bucket, absl::string_view key,
                                      uint64_t offset, absl::Span<char> out,
                                      const S3ObjectVersion& expected) {
  if (out.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Begin("GET", key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const Object* object, FindObject("GET", bucket, key));
  if (!expected.etag.empty() && expected.etag != object->etag) {
    return absl::FailedPreconditionError(
        absl::StrCat("GET ", ObjectUrl(bucket, key), ": S3 PreconditionFailed (HTTP 412)"));
  }
  const std::string& data = object->data;
  if (offset > data.size() || out.size() > data.size() - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("GET ", ObjectUrl(bucket, key), ": S3 InvalidRange (HTTP 416)"));
  }
  std::memcpy(out.data(), data.data() + offset, out.size());
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryS3Client::Put(absl::string_view bucket, absl::string_view key,
                                                absl::string_view data) {
  RETURN_IF_ERROR(Begin("PUT", key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Bucket * objects, FindBucket(bucket));
  Object object{std::string(data), QuotedMd5(data)};
  (*objects)[std::string(key)] = object;
  return object.etag;
}

absl::StatusOr<std::string> MemoryS3Client::PutIfAbsent(absl::string_view bucket,
                                                        absl::string_view key,
                                                        absl::string_view data) {
  RETURN_IF_ERROR(Begin("PUT", key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Bucket * objects, FindBucket(bucket));
  if (objects->count(std::string(key)) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("s3://", bucket, "/", key, " already exists"));
  }
  Object object{std::string(data), QuotedMd5(data)};
  (*objects)[std::string(key)] = object;
  return object.etag;
}

absl::StatusOr<std::vector<S3ObjectInfo>> MemoryS3Client::List(absl::string_view bucket,
                                                               absl::string_view prefix,
                                                               int /*page_size*/) {
  RETURN_IF_ERROR(Begin("LIST", prefix));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Bucket * objects, FindBucket(bucket));
  std::vector<S3ObjectInfo> listed;
  for (auto it = objects->lower_bound(prefix);
       it != objects->end() && absl::StartsWith(it->first, prefix); ++it) {
    listed.push_back({it->first, it->second.data.size(), it->second.etag});
  }
  return listed;
}

absl::StatusOr<S3Client::Folder> MemoryS3Client::ListFolder(absl::string_view bucket,
                                                            absl::string_view prefix,
                                                            size_t max_entries) {
  RETURN_IF_ERROR(Begin("LIST", prefix));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Bucket * objects, FindBucket(bucket));
  Folder folder;
  for (auto it = objects->lower_bound(prefix);
       it != objects->end() && absl::StartsWith(it->first, prefix); ++it) {
    if (max_entries > 0 && folder.objects.size() + folder.subfolders.size() >= max_entries) break;
    const size_t slash = it->first.find('/', prefix.size());
    if (slash == std::string::npos) {
      folder.objects.push_back({it->first, it->second.data.size(), it->second.etag});
      continue;
    }
    std::string sub = it->first.substr(0, slash + 1);
    if (folder.subfolders.empty() || folder.subfolders.back() != sub) {
      folder.subfolders.push_back(std::move(sub));
    }
  }
  return folder;
}

absl::Status MemoryS3Client::Delete(absl::string_view bucket, absl::string_view key) {
  RETURN_IF_ERROR(Begin("DELETE", key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Bucket * objects, FindBucket(bucket));
  auto it = objects->find(key);
  if (it != objects->end()) objects->erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryS3Client::CreateMultipartUpload(
    absl::string_view bucket, absl::string_view key,
    const std::map<std::string, std::string>& /*metadata*/) {
  RETURN_IF_ERROR(Begin("CreateMultipartUpload", key));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(FindBucket(bucket).status());
  const std::string id = absl::StrCat("upload-", next_upload_++);
  uploads_[id] = Upload{std::string(bucket), std::string(key), {}};
  return id;
}

absl::StatusOr<std::string> MemoryS3Client::UploadPart(absl::string_view bucket,
                                                       absl::string_view key,
                                                       absl::string_view upload_id, int part_number,
                                                       absl::string_view data) {
  RETURN_IF_ERROR(Begin("UploadPart", key));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Upload * upload, FindUpload("UploadPart", bucket, key, upload_id));
  upload->parts[part_number] = std::string(data);
  return QuotedMd5(data);
}

absl::StatusOr<std::string> MemoryS3Client::CompleteMultipartUpload(
    absl::string_view bucket, absl::string_view key, absl::string_view upload_id,
    const std::vector<S3CompletedPart>& parts) {
  RETURN_IF_ERROR(Begin("CompleteMultipartUpload", key));
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Upload*> upload = FindUpload("CompleteMultipartUpload", bucket, key, upload_id);
  if (!upload.ok()) {
    // As S3Client reports NoSuchUpload of a completion ("may have completed").
    return absl::FailedPreconditionError(upload.status().message());
  }
  std::string data;
  for (const S3CompletedPart& part : parts) {
    auto uploaded = (*upload)->parts.find(part.part_number);
    if (uploaded == (*upload)->parts.end() || QuotedMd5(uploaded->second) != part.etag) {
      return absl::InvalidArgumentError(absl::StrCat("CompleteMultipartUpload ", ObjectUrl(bucket, key),
                                                     ": S3 InvalidPart (HTTP 400)"));
    }
    data += uploaded->second;
  }
  ASSIGN_OR_RETURN(const std::string etag, MultipartETag(parts));
  ASSIGN_OR_RETURN(Bucket * objects, FindBucket(bucket));
  (*objects)[std::string(key)] = Object{std::move(data), absl::StrCat("\"", etag, "\"")};
  uploads_.erase(std::string(upload_id));
  return absl::StrCat("\"", etag, "\"");
}

absl::Status MemoryS3Client::AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                                  absl::string_view upload_id) {
  RETURN_IF_ERROR(Begin("AbortMultipartUpload", key));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(FindUpload("AbortMultipartUpload", bucket, key, upload_id).status());
  uploads_.erase(std::string(upload_id));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<S3UploadInfo>> MemoryS3Client::ListMultipartUploads(
    absl::string_view bucket, absl::string_view prefix) {
  RETURN_IF_ERROR(Begin("ListMultipartUploads", prefix));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(FindBucket(bucket).status());
  std::vector<S3UploadInfo> listed;
  for (const auto& [id, upload] : uploads_) {
    if (upload.bucket == bucket && absl::StartsWith(upload.key, prefix)) {
      listed.push_back({upload.key, id, "2026-01-01T00:00:00.000Z"});
    }
  }
  std::sort(listed.begin(), listed.end(),
            [](const S3UploadInfo& a, const S3UploadInfo& b) { return a.key < b.key; });
  return listed;
}

}  // namespace reshard
