#include "lib/io/s3/s3_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/s3/default_client.h"
#include "lib/io/s3/s3_location.h"

namespace reshard {
namespace {

// The key prefix of folder `key`: "" for the bucket, else the key with one trailing '/'.
std::string FolderPrefix(const std::string& key) {
  if (key.empty() || key.back() == '/') return key;
  return absl::StrCat(key, "/");
}

const RemoteStoreRegistration<S3Store> register_s3("s3");

}  // namespace

absl::StatusOr<S3Client*> S3Store::Client() const {
  if (client_ != nullptr) return client_;
  return DefaultS3Client();
}

absl::StatusOr<RemoteStat> S3Store::Stat(const std::string& url) {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  absl::Status head_error;
  if (!location.key.empty() && location.key.back() != '/') {
    absl::StatusOr<S3ObjectInfo> head = client->Head(location.bucket, location.key);
    if (head.ok()) return RemoteStat{/*is_folder=*/false, head->size, head->etag};
    head_error = head.status();
  }
  const std::string prefix = FolderPrefix(location.key);
  ASSIGN_OR_RETURN(S3Client::Folder folder,
                   client->ListFolder(location.bucket, prefix, /*max_entries=*/1));
  if (!folder.objects.empty() || !folder.subfolders.empty()) {
    return RemoteStat{/*is_folder=*/true, 0};
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

absl::StatusOr<std::vector<RemoteEntry>> S3Store::List(const std::string& url) {
  ASSIGN_OR_RETURN(RemoteListing listing, ListEntries(url));
  return std::move(listing.files);
}

absl::StatusOr<RemoteListing> S3Store::ListEntries(const std::string& url) {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  const std::string prefix = FolderPrefix(location.key);
  ASSIGN_OR_RETURN(S3Client::Folder folder, client->ListFolder(location.bucket, prefix));
  RemoteListing listing;
  for (S3ObjectInfo& object : folder.objects) {
    if (object.key.size() <= prefix.size()) continue;  // the folder's own marker
    listing.files.push_back(
        RemoteEntry{object.key.substr(prefix.size()), object.size, std::move(object.etag)});
  }
  for (const std::string& sub : folder.subfolders) {
    // "prefix/name/" -> "name"; an empty segment ("prefix//") is no folder a path can name.
    if (sub.size() <= prefix.size() + 1 || sub.back() != '/') continue;
    listing.folders.push_back(sub.substr(prefix.size(), sub.size() - prefix.size() - 1));
  }
  return listing;
}

absl::Status S3Store::ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                                const RemoteStat& opened) {
  ASSIGN_OR_RETURN(S3Location location, ParseS3Url(url));
  ASSIGN_OR_RETURN(S3Client * client, Client(), url);
  return client->GetRange(location.bucket, location.key, offset, out,
                          S3ObjectVersion{opened.version, opened.size});
}

}  // namespace reshard
