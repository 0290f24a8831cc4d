#include "lib/io/testing/memory_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace reshard {

void MemoryStore::Put(const std::string& url, std::string data) {
  absl::MutexLock lock(&mu_);
  files_[url] = File{std::move(data), absl::StrCat("\"v", ++puts_, "\"")};
}

std::string MemoryStore::version(const std::string& url) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(url);
  return it == files_.end() ? "" : it->second.version;
}

void MemoryStore::Fail(const std::string& url, absl::Status error) {
  absl::MutexLock lock(&mu_);
  failures_[url] = std::move(error);
}

void MemoryStore::FailLookups(const std::string& url, absl::Status error) {
  absl::MutexLock lock(&mu_);
  lookup_failures_[url] = std::move(error);
}

void MemoryStore::RemovePrefix(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  for (auto it = files_.lower_bound(prefix);
       it != files_.end() && absl::StartsWith(it->first, prefix);) {
    it = files_.erase(it);
  }
}

int MemoryStore::lookups() const {
  absl::MutexLock lock(&mu_);
  return lookups_;
}

int MemoryStore::reads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(ranges_.size());
}

std::vector<std::pair<uint64_t, uint64_t>> MemoryStore::ranges() const {
  absl::MutexLock lock(&mu_);
  return ranges_;
}

absl::StatusOr<RemoteStat> MemoryStore::Stat(const std::string& url) {
  absl::MutexLock lock(&mu_);
  ++lookups_;
  if (auto failure = lookup_failures_.find(url); failure != lookup_failures_.end()) {
    return failure->second;
  }
  auto it = files_.find(url);
  if (it != files_.end()) return RemoteStat{false, it->second.data.size(), it->second.version};
  const std::string prefix = absl::EndsWith(url, "/") ? url : absl::StrCat(url, "/");
  auto next = files_.lower_bound(prefix);
  if (next != files_.end() && absl::StartsWith(next->first, prefix)) return RemoteStat{true, 0};
  return absl::NotFoundError(absl::StrCat(url, " does not exist"));
}

absl::StatusOr<std::vector<RemoteEntry>> MemoryStore::List(const std::string& url) {
  absl::MutexLock lock(&mu_);
  ++lookups_;
  if (auto failure = lookup_failures_.find(url); failure != lookup_failures_.end()) {
    return failure->second;
  }
  const std::string prefix = absl::EndsWith(url, "/") ? url : absl::StrCat(url, "/");
  std::vector<RemoteEntry> entries;
  for (auto it = files_.lower_bound(prefix);
       it != files_.end() && absl::StartsWith(it->first, prefix); ++it) {
    const std::string name = it->first.substr(prefix.size());
    if (!name.empty() && name.find('/') == std::string::npos) {
      entries.push_back(RemoteEntry{name, it->second.data.size(), it->second.version});
    }
  }
  return entries;
}

absl::StatusOr<RemoteListing> MemoryStore::ListEntries(const std::string& url) {
  absl::MutexLock lock(&mu_);
  ++lookups_;
  if (auto failure = lookup_failures_.find(url); failure != lookup_failures_.end()) {
    return failure->second;
  }
  const std::string prefix = absl::EndsWith(url, "/") ? url : absl::StrCat(url, "/");
  RemoteListing listing;
  for (auto it = files_.lower_bound(prefix);
       it != files_.end() && absl::StartsWith(it->first, prefix); ++it) {
    const std::string rest = it->first.substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) {
      if (!rest.empty()) {
        listing.files.push_back(RemoteEntry{rest, it->second.data.size(), it->second.version});
      }
      continue;
    }
    if (slash == 0) continue;
    const std::string name = rest.substr(0, slash);
    if (listing.folders.empty() || listing.folders.back() != name) {
      listing.folders.push_back(name);
    }
  }
  return listing;
}

void MemoryStore::set_read_delay(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  read_delay_ = delay;
}

int MemoryStore::max_concurrent_reads() const {
  absl::MutexLock lock(&mu_);
  return max_concurrent_reads_;
}

void MemoryStore::reset_max_concurrent_reads() {
  absl::MutexLock lock(&mu_);
  max_concurrent_reads_ = 0;
}

absl::Status MemoryStore::ReadRange(const std::string& url, uint64_t offset, absl::Span<char> out,
                                    const RemoteStat& opened) {
  absl::Duration delay;
  {
    absl::MutexLock lock(&mu_);
    ranges_.emplace_back(offset, out.size());
    max_concurrent_reads_ = std::max(max_concurrent_reads_, ++reads_under_way_);
    delay = read_delay_;
  }
  if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
  absl::MutexLock lock(&mu_);
  --reads_under_way_;
  auto failure = failures_.find(url);
  if (failure != failures_.end()) return failure->second;
  auto it = files_.find(url);
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat(url, " does not exist"));
  const File& file = it->second;
  if (!opened.version.empty() && opened.version != file.version) {
    return absl::FailedPreconditionError(absl::StrCat(url, " changed while being read: ETag ",
                                                      opened.version, " at open, ", file.version,
                                                      " at offset ", offset));
  }
  if (offset > file.data.size() || out.size() > file.data.size() - offset) {
    return absl::OutOfRangeError(absl::StrCat(url, ": range past the end"));
  }
  std::memcpy(out.data(), file.data.data() + offset, out.size());
  return absl::OkStatus();
}

MemoryStore* SharedMemStore() {
  static MemoryStore* store = [] {
    auto* created = new MemoryStore;
    RegisterRemoteStore("mem", created);
    return created;
  }();
  return store;
}

}  // namespace reshard
