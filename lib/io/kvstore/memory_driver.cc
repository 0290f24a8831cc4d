#include "lib/io/kvstore/memory_driver.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace reshard {
namespace kvstore {

// Buffers the file; stores it at Commit.
class MemoryWriter final : public Writer {
 public:
  MemoryWriter(const MemoryDriver* driver, std::string url)
      : driver_(driver), url_(std::move(url)) {}

  absl::Status Append(absl::string_view data) override {
    if (done_) return absl::FailedPreconditionError(absl::StrCat(url_, ": writer finished"));
    data_.append(data.data(), data.size());
    pos_ += data.size();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Commit() override {
    if (done_) return absl::FailedPreconditionError(absl::StrCat(url_, ": writer finished"));
    done_ = true;
    absl::MutexLock lock(&driver_->mu_);
    return driver_->PutLocked(url_, std::move(data_));
  }
  void Abort() override {
    done_ = true;
    data_.clear();
  }
  uint64_t pos() const override { return pos_; }

 private:
  const MemoryDriver* const driver_;
  const std::string url_;
  std::string data_;
  uint64_t pos_ = 0;  // bytes appended; data_ is handed over at Commit
  bool done_ = false;
};

std::string MemoryDriver::PutLocked(const std::string& url, std::string data) const {
  std::string version = absl::StrCat("\"v", ++puts_, "\"");
  files_[url] = File{std::move(data), version};
  return version;
}

void MemoryDriver::Put(const std::string& url, std::string data) {
  absl::MutexLock lock(&mu_);
  PutLocked(url, std::move(data));
}

std::string MemoryDriver::version(const std::string& url) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(url);
  return it == files_.end() ? "" : it->second.version;
}

void MemoryDriver::Fail(const std::string& url, absl::Status error) {
  absl::MutexLock lock(&mu_);
  failures_[url] = std::move(error);
}

void MemoryDriver::FailLookups(const std::string& url, absl::Status error) {
  absl::MutexLock lock(&mu_);
  lookup_failures_[url] = std::move(error);
}

void MemoryDriver::RemovePrefix(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  for (auto it = files_.lower_bound(prefix);
       it != files_.end() && absl::StartsWith(it->first, prefix);) {
    it = files_.erase(it);
  }
}

int MemoryDriver::lookups() const {
  absl::MutexLock lock(&mu_);
  return lookups_;
}

int MemoryDriver::reads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(ranges_.size());
}

std::vector<std::pair<uint64_t, uint64_t>> MemoryDriver::ranges() const {
  absl::MutexLock lock(&mu_);
  return ranges_;
}

absl::Status MemoryDriver::LookupLocked(const std::string& url) const {
  ++lookups_;
  auto failure = lookup_failures_.find(url);
  return failure == lookup_failures_.end() ? absl::OkStatus() : failure->second;
}

absl::StatusOr<PathStat> MemoryDriver::Stat(const std::string& url) const {
  absl::MutexLock lock(&mu_);
  if (absl::Status failure = LookupLocked(url); !failure.ok()) return failure;
  auto it = files_.find(url);
  if (it != files_.end()) {
    PathStat stat{/*is_folder=*/false, it->second.data.size(), it->second.version};
    stat.generation = it->second.version;
    return stat;
  }
  const std::string prefix = absl::EndsWith(url, "/") ? url : absl::StrCat(url, "/");
  auto next = files_.lower_bound(prefix);
  if (next != files_.end() && absl::StartsWith(next->first, prefix)) {
    return PathStat{/*is_folder=*/true, 0};
  }
  return absl::NotFoundError(absl::StrCat(url, " does not exist"));
}

absl::StatusOr<Listing> MemoryDriver::List(const std::string& url) const {
  absl::MutexLock lock(&mu_);
  if (absl::Status failure = LookupLocked(url); !failure.ok()) return failure;
  const std::string prefix = absl::EndsWith(url, "/") ? url : absl::StrCat(url, "/");
  Listing listing;
  for (auto it = files_.lower_bound(prefix);
       it != files_.end() && absl::StartsWith(it->first, prefix); ++it) {
    const std::string rest = it->first.substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string::npos) {
      if (!rest.empty()) {
        listing.files.push_back(FileEntry{rest, it->second.data.size(), it->second.version});
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

void MemoryDriver::set_read_delay(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  read_delay_ = delay;
}

int MemoryDriver::max_concurrent_reads() const {
  absl::MutexLock lock(&mu_);
  return max_concurrent_reads_;
}

void MemoryDriver::reset_max_concurrent_reads() {
  absl::MutexLock lock(&mu_);
  max_concurrent_reads_ = 0;
}

absl::Status MemoryDriver::ReadRange(const std::string& url, uint64_t offset,
                                     absl::Span<char> out, const PathStat& opened) const {
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
    return absl::DataLossError(absl::StrCat(url, ": read of ", out.size(),
                                            " bytes at byte offset ", offset,
                                            " passes the end of the file (", file.data.size(),
                                            " bytes)"));
  }
  std::memcpy(out.data(), file.data.data() + offset, out.size());
  return absl::OkStatus();
}

absl::Status MemoryDriver::CreateExclusive(const std::string& url,
                                           absl::string_view bytes) const {
  absl::MutexLock lock(&mu_);
  if (files_.count(url) > 0) return absl::AlreadyExistsError(absl::StrCat(url, " already exists"));
  PutLocked(url, std::string(bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Writer>> MemoryDriver::Write(
    const std::string& url, const WriteOptions& /*options*/) const {
  return std::unique_ptr<Writer>(new MemoryWriter(this, url));
}

absl::Status MemoryDriver::Delete(const std::string& url) const {
  absl::MutexLock lock(&mu_);
  files_.erase(url);
  return absl::OkStatus();
}

MemoryDriver& GetMemoryDriver() {
  static MemoryDriver* driver = new MemoryDriver("mem");
  return *driver;
}

}  // namespace kvstore
}  // namespace reshard
