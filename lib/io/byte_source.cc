#include "lib/io/byte_source.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/core/status.h"

namespace reshard {

absl::Status ByteSource::PastEnd(absl::string_view path, uint64_t size, uint64_t offset,
                                 uint64_t length, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what, " (", length, " bytes at byte offset ",
                                          offset, ") runs past the end of the file (", size,
                                          " bytes)"));
}

absl::StatusOr<absl::string_view> ViewByteSource::Read(uint64_t offset, uint64_t length,
                                                       absl::string_view what) {
  if (offset > bytes_.size() || length > bytes_.size() - offset) {
    return PastEnd(path_, bytes_.size(), offset, length, what);
  }
  return bytes_.substr(offset, length);
}

absl::StatusOr<absl::string_view> SliceByteSource::Read(uint64_t offset, uint64_t length,
                                                        absl::string_view what) {
  if (offset > length_ || length > length_ - offset) {
    return PastEnd(path_, length_, offset, length, what);
  }
  return source_.Read(base_ + offset, length, what);
}

absl::Status SliceByteSource::Prefetch(std::vector<ByteRange> ranges) {
  for (ByteRange& range : ranges) {
    if (range.offset >= length_) {
      range.length = 0;
      continue;
    }
    range.length = std::min(range.length, length_ - range.offset);
    range.offset += base_;
  }
  return source_.Prefetch(std::move(ranges));
}

absl::StatusOr<std::unique_ptr<DriverFileSource>> DriverFileSource::Open(
    const kvstore::Driver& driver, std::string path) {
  ASSIGN_OR_RETURN(kvstore::PathStat stat, driver.Stat(path));
  if (stat.is_folder) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is a folder, not a file"));
  }
  return std::unique_ptr<DriverFileSource>(
      new DriverFileSource(driver, std::move(path), std::move(stat)));
}

absl::StatusOr<absl::string_view> DriverFileSource::Read(uint64_t offset, uint64_t length,
                                                         absl::string_view what) {
  if (offset > stat_.size || length > stat_.size - offset) {
    return PastEnd(path_, stat_.size, offset, length, what);
  }
  buffer_.resize(static_cast<size_t>(length));
  RETURN_IF_ERROR(driver_.ReadRange(path_, offset, absl::MakeSpan(buffer_), stat_),
                  absl::StrCat(what, " (", length, " bytes at byte offset ", offset, ")"));
  return absl::string_view(buffer_);
}

RangeReadSource::RangeReadSource(std::string path, uint64_t size, ReadFunction read)
    : RangeReadSource(std::move(path), size, std::move(read), Options()) {}

RangeReadSource::RangeReadSource(std::string path, uint64_t size, ReadFunction read,
                                 Options options)
    : path_(std::move(path)), size_(size), read_(std::move(read)), options_(options) {}

std::unique_ptr<RangeReadSource> RangeReadSource::Over(const MappedFile& file, Options options) {
  const MappedFile* const source = &file;
  return std::make_unique<RangeReadSource>(
      file.path(), file.size(),
      [source](uint64_t offset, absl::Span<char> out) {
        return source->ReadAt(offset, out.size(), reinterpret_cast<std::byte*>(out.data()));
      },
      options);
}

std::optional<absl::string_view> RangeReadSource::Find(uint64_t offset, uint64_t length) const {
  // Ranges starting at or before `offset`, nearest first; one starting before
  // `offset + length - longest_` cannot reach the end.
  for (auto it = loaded_.upper_bound(offset); it != loaded_.begin();) {
    --it;
    const uint64_t start = it->first;
    if (start + longest_ < offset + length) break;
    if (start + it->second.size() >= offset + length) {
      return absl::string_view(it->second).substr(offset - start, length);
    }
  }
  return std::nullopt;
}

absl::Status RangeReadSource::Reserve(uint64_t offset, uint64_t length, absl::string_view what) {
  const uint64_t before = loaded_bytes_.fetch_add(length);
  if (before + length <= options_.max_loaded_bytes) return absl::OkStatus();
  loaded_bytes_.fetch_sub(length);
  return absl::ResourceExhaustedError(absl::StrCat(
      path_, ": reading ", what, " (", length, " bytes at byte offset ", offset,
      ") would hold more than ", options_.max_loaded_bytes, " bytes of metadata in memory"));
}

absl::Status RangeReadSource::LoadWindow(const ByteRange& read, absl::Span<const ByteRange> keep) {
  std::string buffer(static_cast<size_t>(read.length), '\0');
  reads_.fetch_add(1);
  bytes_read_.fetch_add(read.length);
  RETURN_IF_ERROR(
      read_(read.offset, absl::Span<char>(buffer.data(), buffer.size())),
      absl::StrCat(path_, ": reading ", read.length, " bytes at byte offset ", read.offset));
  absl::MutexLock lock(&mu_);
  for (const ByteRange& part : keep) {
    std::string bytes = keep.size() == 1 && part.length == read.length
                            ? std::move(buffer)
                            : buffer.substr(part.offset - read.offset, part.length);
    longest_ = std::max(longest_, part.length);
    loaded_.emplace(part.offset, std::move(bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::string_view> RangeReadSource::Read(uint64_t offset, uint64_t length,
                                                        absl::string_view what) {
  if (offset > size_ || length > size_ - offset) {
    return PastEnd(path_, size_, offset, length, what);
  }
  {
    absl::MutexLock lock(&mu_);
    if (std::optional<absl::string_view> loaded = Find(offset, length)) return *loaded;
  }
  RETURN_IF_ERROR(Reserve(offset, length, what));
  const ByteRange range{offset, length};
  RETURN_IF_ERROR(LoadWindow(range, absl::MakeConstSpan(&range, 1)), what);
  absl::MutexLock lock(&mu_);
  return *Find(offset, length);
}

absl::Status RangeReadSource::Prefetch(std::vector<ByteRange> ranges) {
  // The ranges not loaded yet, clipped to the file, sorted and joined where they touch.
  std::vector<ByteRange> keep;
  {
    absl::MutexLock lock(&mu_);
    for (ByteRange& range : ranges) {
      if (range.offset >= size_) continue;
      range.length = std::min(range.length, size_ - range.offset);
      if (range.length > 0 && !Find(range.offset, range.length).has_value()) {
        keep.push_back(range);
      }
    }
  }
  std::sort(keep.begin(), keep.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> joined;
  for (const ByteRange& range : keep) {
    if (!joined.empty() && range.offset <= joined.back().offset + joined.back().length) {
      ByteRange& last = joined.back();
      last.length = std::max(last.offset + last.length, range.offset + range.length) - last.offset;
    } else {
      joined.push_back(range);
    }
  }
  // Reads: neighbours closer than merge_gap share one, up to max_read bytes.
  struct Window {
    ByteRange read;
    size_t first = 0;  // joined[first, last) are kept from it
    size_t last = 0;
  };
  std::vector<Window> windows;
  uint64_t kept = 0;
  for (size_t i = 0; i < joined.size(); ++i) {
    const ByteRange& range = joined[i];
    kept += range.length;
    if (!windows.empty()) {
      Window& window = windows.back();
      const uint64_t end = window.read.offset + window.read.length;
      const uint64_t grown = range.offset + range.length - window.read.offset;
      if (range.offset - end <= options_.merge_gap && grown <= options_.max_read) {
        window.read.length = grown;
        window.last = i + 1;
        continue;
      }
    }
    windows.push_back(Window{range, i, i + 1});
  }
  if (windows.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Reserve(joined.front().offset, kept, "prefetched metadata"));
  std::vector<absl::Status> status(windows.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t w = next++; w < windows.size(); w = next++) {
      const Window& window = windows[w];
      status[w] = LoadWindow(window.read, absl::MakeConstSpan(joined.data() + window.first,
                                                              window.last - window.first));
    }
  };
  std::vector<std::thread> threads;
  const size_t helpers =
      std::min<size_t>(windows.size(), std::max(options_.reads_in_flight, 1)) - 1;
  for (size_t t = 0; t < helpers; ++t) threads.emplace_back(work);
  work();
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& window_status : status) RETURN_IF_ERROR(window_status);
  return absl::OkStatus();
}

std::unique_ptr<ByteSource> ByteSourceFor(const MappedFile& file,
                                          RangeReadSource::Options options) {
  if (!file.mapped()) return RangeReadSource::Over(file, options);
  return std::make_unique<ViewByteSource>(
      absl::string_view(reinterpret_cast<const char*>(file.data()), file.size()), file.path());
}

}  // namespace reshard
