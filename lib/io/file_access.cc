#include "lib/io/file_access.h"

#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"
#include "lib/io/kvstore/location.h"

namespace reshard {

struct ScopedRemoteListingCache::Cache {
  std::map<std::string, absl::StatusOr<kvstore::PathStat>> stats;
  std::map<std::string, absl::StatusOr<kvstore::Listing>> listings;  // by folder path
};

namespace {

thread_local ScopedRemoteListingCache::Cache* remote_cache = nullptr;

// The cache in scope for paths of `driver`: only answers that cost a request (a driver whose
// files are not mapped) are remembered.
ScopedRemoteListingCache::Cache* CacheFor(const kvstore::Driver& driver) {
  return driver.maps_files() ? nullptr : remote_cache;
}

// The folder holding URL `url` and the name in it ("s3://b/x", "y" for "s3://b/x/y"), or
// nullopt for a bucket, a URL ending in '/', or one without a scheme.
std::optional<std::pair<std::string, std::string>> SplitUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t slash = url.rfind('/');
  if (scheme == std::string::npos || slash == std::string::npos || slash < scheme + 3 ||
      slash + 1 == url.size()) {
    return std::nullopt;
  }
  const std::string parent = url.substr(0, slash);
  if (parent.size() <= scheme + 3 || parent.back() == '/') return std::nullopt;
  return std::make_pair(parent, url.substr(slash + 1));
}

// What folder `dir` holds (remembered in scope).
absl::StatusOr<kvstore::Listing> ListAt(const kvstore::Location& dir) {
  ScopedRemoteListingCache::Cache* cache = CacheFor(*dir.driver);
  if (cache != nullptr) {
    if (auto it = cache->listings.find(dir.path); it != cache->listings.end()) return it->second;
  }
  absl::StatusOr<kvstore::Listing> listing = dir.driver->List(dir.path);
  if (cache != nullptr && !dir.path.empty() && dir.path.back() != '/') {
    cache->listings.emplace(dir.path, listing);
    if (listing.ok() && (!listing->files.empty() || !listing->folders.empty())) {
      cache->stats.emplace(dir.path, kvstore::PathStat{/*is_folder=*/true, 0});
    }
  }
  return listing;
}

// The driver's Stat of `location`; in scope, remembered, and answered from the listing of its
// folder when that is known to be one.
absl::StatusOr<kvstore::PathStat> StatAt(const kvstore::Location& location) {
  ScopedRemoteListingCache::Cache* cache = CacheFor(*location.driver);
  const std::string& path = location.path;
  if (cache == nullptr) return location.driver->Stat(path);
  if (auto it = cache->stats.find(path); it != cache->stats.end()) return it->second;
  if (std::optional<std::pair<std::string, std::string>> split = SplitUrl(path)) {
    const auto& [parent, name] = *split;
    auto known = cache->stats.find(parent);
    const bool parent_is_folder =
        known != cache->stats.end() && known->second.ok() && known->second->is_folder;
    if (parent_is_folder || cache->listings.count(parent) > 0) {
      absl::StatusOr<kvstore::Listing> listing =
          ListAt(kvstore::Location{location.driver, parent});
      if (listing.ok()) {
        absl::StatusOr<kvstore::PathStat> stat = absl::NotFoundError(absl::StrCat(
            path, " does not exist: no object or folder \"", name, "\" in ", parent, "/"));
        for (const kvstore::FileEntry& file : listing->files) {
          if (file.name == name) {
            stat = kvstore::PathStat{/*is_folder=*/false, file.size, file.version};
          }
        }
        for (const std::string& folder : listing->folders) {
          if (folder == name) stat = kvstore::PathStat{/*is_folder=*/true, 0};
        }
        cache->stats.emplace(path, stat);
        return stat;
      }
    }
  }
  absl::StatusOr<kvstore::PathStat> stat = location.driver->Stat(path);
  cache->stats.emplace(path, stat);
  return stat;
}

// The Location of input `path`.
absl::StatusOr<kvstore::Location> Locate(const std::string& path) {
  return kvstore::ParseLocation(path);
}

// The Stat of input file `path`: InvalidArgument naming it when it is a folder or neither a
// file nor a folder.
absl::StatusOr<kvstore::PathStat> StatFile(const kvstore::Location& location) {
  ASSIGN_OR_RETURN(kvstore::PathStat stat, StatAt(location));
  if (stat.is_folder) {
    return absl::InvalidArgumentError(absl::StrCat(location.path, " is a folder, not a file"));
  }
  if (!stat.special.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(location.path, " is ", stat.special,
                                                   ", not a regular file; reshard reads "
                                                   "regular files only"));
  }
  return stat;
}

// Up to `max_bytes` + 1 bytes from the start of input file `path` (+1 to tell a longer file).
absl::StatusOr<std::string> ReadInputUpTo(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(path));
  ASSIGN_OR_RETURN(kvstore::PathStat stat, StatFile(location));
  std::string contents(static_cast<size_t>(stat.size > max_bytes ? max_bytes + 1 : stat.size),
                       '\0');
  RETURN_IF_ERROR(location.driver->ReadRange(path, 0, absl::MakeSpan(contents), stat));
  return contents;
}

enum class InputKind { kAbsent, kFolder, kFile, kOther };

// What input `path` is (symlinks followed); NotFound is kAbsent, other failures are errors
// naming the path.
absl::StatusOr<InputKind> StatInput(const std::string& path) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(path));
  absl::StatusOr<kvstore::PathStat> stat = StatAt(location);
  if (absl::IsNotFound(stat.status())) return InputKind::kAbsent;
  RETURN_IF_ERROR(stat.status());
  if (stat->is_folder) return InputKind::kFolder;
  return stat->special.empty() ? InputKind::kFile : InputKind::kOther;
}

}  // namespace

absl::Status CheckInputFileType(const std::string& path) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(path));
  ASSIGN_OR_RETURN(kvstore::PathStat stat, StatAt(location));
  if (!stat.special.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input ", path, " is ", stat.special, "; reshard reads regular files and folders only"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes) {
  ASSIGN_OR_RETURN(std::string contents, ReadInputUpTo(path, max_bytes));
  if (contents.size() > max_bytes) contents.resize(max_bytes);
  return contents;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::string contents, ReadInputUpTo(path, max_bytes));
  if (contents.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is larger than ", max_bytes, " bytes; not a file reshard reads"));
  }
  return contents;
}

absl::Status CheckInputPath(const std::string& path, const std::string& what) {
  return Annotate(Locate(path).status(), what);
}

bool InputReadsAreRequests(const std::string& path) {
  absl::StatusOr<kvstore::Location> location = Locate(path);
  return location.ok() && !location->driver->maps_files();
}

bool InputHasFolders(const std::string& path) {
  absl::StatusOr<kvstore::Location> location = Locate(path);
  return location.ok() && location->driver->has_folders();
}

absl::StatusOr<bool> CheckInputFolder(const std::string& path) {
  ASSIGN_OR_RETURN(InputKind kind, StatInput(path));
  return kind == InputKind::kFolder;
}

absl::StatusOr<bool> CheckInputExists(const std::string& path) {
  ASSIGN_OR_RETURN(InputKind kind, StatInput(path));
  return kind != InputKind::kAbsent;
}

absl::StatusOr<bool> CheckInputFile(const std::string& path) {
  ASSIGN_OR_RETURN(InputKind kind, StatInput(path));
  return kind == InputKind::kFile;
}

absl::StatusOr<uint64_t> InputFileSize(const std::string& path) {
  ASSIGN_OR_RETURN(InputFileInfo info, StatInputFile(path));
  return info.size;
}

absl::StatusOr<InputFileInfo> StatInputFile(const std::string& path) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(path));
  ASSIGN_OR_RETURN(kvstore::PathStat stat, StatFile(location));
  return InputFileInfo{stat.size, std::move(stat.version)};
}

absl::StatusOr<InputListing> ListInput(const std::string& dir) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(dir));
  ASSIGN_OR_RETURN(kvstore::Listing listing, ListAt(location));
  InputListing names;
  for (kvstore::FileEntry& entry : listing.files) names.files.push_back(std::move(entry.name));
  names.folders = std::move(listing.folders);
  names.others = std::move(listing.others);
  return names;
}

absl::StatusOr<std::vector<std::string>> ListInputFolderEntries(const std::string& dir) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(dir));
  ASSIGN_OR_RETURN(kvstore::Listing listing, ListAt(location));
  std::vector<std::string> names;
  for (kvstore::FileEntry& entry : listing.files) names.push_back(std::move(entry.name));
  for (std::string& name : listing.folders) names.push_back(std::move(name));
  for (std::string& name : listing.others) names.push_back(std::move(name));
  return names;
}

absl::StatusOr<std::vector<std::string>> ListInputSubfolders(const std::string& dir) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(dir));
  ASSIGN_OR_RETURN(kvstore::Listing listing, ListAt(location));
  return std::move(listing.folders);
}

absl::StatusOr<std::vector<std::string>> ListInputFolder(const std::string& dir) {
  ASSIGN_OR_RETURN(kvstore::Location location, Locate(dir));
  ASSIGN_OR_RETURN(kvstore::Listing listing, ListAt(location));
  std::vector<std::string> names;
  for (kvstore::FileEntry& entry : listing.files) names.push_back(std::move(entry.name));
  return names;
}

ScopedRemoteListingCache::ScopedRemoteListingCache() {
  if (remote_cache == nullptr) {
    cache_ = std::make_unique<Cache>();
    remote_cache = cache_.get();
  }
}

ScopedRemoteListingCache::~ScopedRemoteListingCache() {
  if (cache_ != nullptr) remote_cache = nullptr;
}

}  // namespace reshard
