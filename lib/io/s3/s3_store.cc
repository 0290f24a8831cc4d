#include "lib/io/s3/s3_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/kvstore/location.h"
#include "lib/io/s3/default_client.h"
#include "lib/io/s3/s3_object_writer.h"
#include "lib/io/s3/s3_location.h"

namespace reshard {
namespace {

// The key prefix of folder `key`: "" for the bucket, else the key with one trailing '/'.
std::string FolderPrefix(const std::string& key) {
  if (key.empty() || key.back() == '/') return key;
  return absl::StrCat(key, "/");
}

const kvstore::DriverRegistration<S3Store> register_s3;

// A kvstore::Writer over an S3ObjectWriter.
class S3Writer final : public kvstore::Writer {
 public:
  explicit S3Writer(std::unique_ptr<S3ObjectWriter> object)
      : url_(object->url()), object_(std::move(object)) {}

  absl::Status Append(absl::string_view data) override {
    if (object_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(url_, ": writer aborted"));
    return object_->Write(data);
  }
  absl::StatusOr<std::string> Commit() override {
    if (object_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(url_, ": writer aborted"));
    RETURN_IF_ERROR(object_->Close());
    return object_->etag();
  }
  // Destroying the unclosed S3ObjectWriter aborts its upload.
  void Abort() override { object_.reset(); }
  uint64_t pos() const override { return object_ == nullptr ? 0 : object_->pos(); }

 private:
  const std::string url_;
  std::unique_ptr<S3ObjectWriter> object_;
};

}  // namespace

absl::StatusOr<S3Client*> S3Store::Client() const {
  if (client_ != nullptr) return client_;
  return DefaultS3Client();
}

absl::StatusOr<std::string> S3Store::ConfinedPath(const std::string& url,
                                                  bool /*must_exist*/) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  while (!location.key.empty() && location.key.back() == '/') location.key.pop_back();
  return location.key.empty() ? absl::StrCat("s3://", location.bucket) : location.ToString();
}

absl::StatusOr<kvstore::PathStat> S3Store::Stat(const std::string& url) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  absl::Status head_error;
  if (!location.key.empty() && location.key.back() != '/') {
    absl::StatusOr<S3ObjectInfo> head = client->Head(location.bucket, location.key);
    if (head.ok()) {
      kvstore::PathStat stat{/*is_folder=*/false, head->size, head->etag};
      stat.generation = head->etag;
      return stat;
    }
    head_error = head.status();
  }
  const std::string prefix = FolderPrefix(location.key);
  ASSIGN_OR_RETURN(S3Client::Folder folder,
                   client->ListFolder(location.bucket, prefix, /*max_entries=*/1));
  if (!folder.objects.empty() || !folder.subfolders.empty()) {
    return kvstore::PathStat{/*is_folder=*/true, 0};
  }
  if (!head_error.ok() && !absl::IsNotFound(head_error)) return head_error;
  if (location.key.empty()) {
    return absl::NotFoundError(
        absl::StrCat(url, " does not exist: bucket ", location.bucket, " holds no objects"));
  }
  return absl::NotFoundError(absl::StrCat(url, " does not exist: bucket ", location.bucket,
                                          " has no object with key \"", location.key,
                                          "\" and none under \"", prefix, "\""));
}

absl::StatusOr<kvstore::Listing> S3Store::List(const std::string& url) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  const std::string prefix = FolderPrefix(location.key);
  ASSIGN_OR_RETURN(S3Client::Folder folder, client->ListFolder(location.bucket, prefix));
  kvstore::Listing listing;
  for (S3ObjectInfo& object : folder.objects) {
    if (object.key.size() <= prefix.size()) continue;  // the folder's own marker
    listing.files.push_back(
        kvstore::FileEntry{object.key.substr(prefix.size()), object.size, std::move(object.etag)});
  }
  for (const std::string& sub : folder.subfolders) {
    // "prefix/name/" -> "name"; an empty segment ("prefix//") is no folder a path can name.
    if (sub.size() <= prefix.size() + 1 || sub.back() != '/') continue;
    listing.folders.push_back(sub.substr(prefix.size(), sub.size() - prefix.size() - 1));
  }
  return listing;
}

absl::Status S3Store::ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                                const kvstore::PathStat& opened) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  return client->GetRange(location.bucket, location.key, offset, out,
                          S3ObjectVersion{opened.version, opened.size});
}

absl::Status S3Store::CreateExclusive(const std::string& url, absl::string_view bytes) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  return client->PutIfAbsent(location.bucket, location.key, bytes).status();
}

namespace {

S3ObjectWriter::Options UploadOptions(const kvstore::WriteOptions& options) {
  S3ObjectWriter::Options upload =
      S3ObjectWriter::OptionsFor(options.size_hint, options.memory_budget);
  upload.metadata = options.metadata;
  return upload;
}

}  // namespace

absl::StatusOr<std::unique_ptr<kvstore::Writer>> S3Store::Write(
    const std::string& url, const kvstore::WriteOptions& options) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  ASSIGN_OR_RETURN(std::unique_ptr<S3ObjectWriter> object,
                   S3ObjectWriter::Create(client, location.bucket, location.key,
                                          UploadOptions(options)));
  return std::unique_ptr<kvstore::Writer>(new S3Writer(std::move(object)));
}

absl::StatusOr<std::string> S3Store::WriteFile(const std::string& url,
                                               absl::string_view bytes) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  return client->Put(location.bucket, location.key, bytes);
}

uint64_t S3Store::WriteMemoryBound(const kvstore::WriteOptions& options) const {
  return S3ObjectWriter::MemoryBound(UploadOptions(options));
}

absl::Status S3Store::AbortUnfinishedWrites(const std::string& prefix) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(prefix));
  ASSIGN_OR_RETURN(S3Client * client, Client(), prefix);
  return AbortStaleUploads(*client, location.bucket, location.key).status();
}

absl::Status S3Store::Delete(const std::string& url) const {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  return client->Delete(location.bucket, location.key);
}

}  // namespace reshard
