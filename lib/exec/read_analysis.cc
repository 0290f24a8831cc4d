#include "lib/exec/read_analysis.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "lib/core/dtype.h"

namespace reshard {
namespace {

// Files written in turns by one worker share the reads of the rows their strips come from:
// at most this many (each has its own window share, pipeline and writer thread).
constexpr size_t kMaxLockstepFiles = 8;

}  // namespace

bool ReadsStrips(const TensorCopy& copy) {
  for (const CopyItem& item : copy.items) {
    const size_t n = item.extent.size();
    if (n >= 2 && item.num_elements() > 0 && item.src_strides[n - 1] == 1 &&
        item.src_strides[n - 2] != item.extent[n - 1]) {
      return true;
    }
  }
  return false;
}

std::vector<size_t> TensorSegments(const FilePlan& file) {
  std::vector<size_t> segments;
  for (size_t s = 0; s < file.segments.size(); ++s) {
    if (file.segments[s].kind == FramingSegment::Kind::kTensor) segments.push_back(s);
  }
  return segments;
}

std::vector<WorkUnit> WorkUnits(const CopyPlan& plan) {
  // Files with the same tensors in the same order, one of which reads strips of rows.
  std::map<std::vector<std::string>, std::vector<size_t>> alike;
  std::vector<std::vector<std::string>> names(plan.files.size());
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const FilePlan& file = plan.files[f];
    for (size_t s : TensorSegments(file)) {
      names[f].push_back(file.tensors[file.segments[s].tensor].name);
    }
    if (std::any_of(file.tensors.begin(), file.tensors.end(), ReadsStrips)) {
      alike[names[f]].push_back(f);
    }
  }
  // Of those, the files that read strips from the same source files, directly or through one
  // another: only they share rows. The parts of a model-parallel checkpoint of 2 files split
  // into 4 are two such groups (parts 0 and 1 read the first file, 2 and 3 the second). Written
  // in turns all four, the strips of one source would evict the other's spans, and the input
  // would be read more than once. Only the tensors read in strips join files: the replicated
  // ones (the norms, metaseq's `version` and position embeddings) are read by every part from
  // the first source, and joining on them would put all four parts of a metaseq split in one
  // group again; their bytes are repeated ranges, kept in the page cache for the other parts
  // (AnalyzeSourceReads).
  std::vector<size_t> group_of(plan.files.size());
  for (const auto& [unused, files] : alike) {
    std::map<int, size_t> reader_of_source;  // a source file -> a file that reads strips of it
    for (size_t f : files) {
      group_of[f] = f;
      for (const TensorCopy& copy : plan.files[f].tensors) {
        if (!ReadsStrips(copy)) continue;
        for (const CopyItem& item : copy.items) {
          auto [it, added] = reader_of_source.emplace(item.src_file, f);
          if (added) continue;
          // Joins the two groups (union-find with path halving).
          auto root = [&](size_t x) {
            while (group_of[x] != x) x = group_of[x] = group_of[group_of[x]];
            return x;
          };
          const size_t a = root(it->second), b = root(f);
          if (a != b) group_of[std::max(a, b)] = std::min(a, b);
        }
      }
    }
    for (size_t f : files) {
      size_t x = f;
      while (group_of[x] != x) x = group_of[x];
      group_of[f] = x;
    }
  }
  std::map<size_t, std::vector<size_t>> groups;  // the group's first file -> its files
  for (const auto& [unused, files] : alike) {
    for (size_t f : files) groups[group_of[f]].push_back(f);
  }
  std::vector<WorkUnit> units;
  std::vector<bool> placed(plan.files.size(), false);
  for (size_t f = 0; f < plan.files.size(); ++f) {
    if (placed[f]) continue;
    auto group = groups.find(f);
    if (group == groups.end() || group->second.size() < 2) {
      units.push_back({{f}, false});
      placed[f] = true;
      continue;
    }
    const std::vector<size_t>& files = group->second;
    const size_t n = files.size();
    // One unit when it can hold them all: it reads every row once, directly, with the span
    // after the current one read ahead. A unit per worker would read the rows once per unit,
    // through the page cache, which costs more wall time and CPU than the one unit saves.
    const size_t count = (n + kMaxLockstepFiles - 1) / kMaxLockstepFiles;
    for (size_t u = 0; u < count; ++u) {
      WorkUnit unit{{files.begin() + u * n / count, files.begin() + (u + 1) * n / count},
                    count == 1};
      for (size_t member : unit.files) placed[member] = true;
      units.push_back(std::move(unit));
    }
  }
  return units;
}

std::vector<bool> SourcesReadDense(const CopyPlan& plan) {
  std::vector<bool> dense(plan.sources.size(), true);
  auto add_copy = [&](const TensorCopy& copy) {
    const uint64_t element_size = DTypeSize(copy.src_dtype);
    for (const CopyItem& item : copy.items) {
      const uint64_t elements = item.num_elements();
      if (elements == 0 || static_cast<size_t>(item.src_file) >= dense.size()) continue;
      // Dense: the box reads every byte between its first and its last.
      if (item.src_end(element_size) - item.src_offset != elements * element_size) {
        dense[item.src_file] = false;
      }
    }
  };
  for (const FilePlan& file : plan.files) {
    for (const TensorCopy& copy : file.tensors) {
      add_copy(copy);
      for (const TensorCopy& term : copy.mean_terms) add_copy(term);
    }
  }
  return dense;
}

std::vector<SourceReads> AnalyzeSourceReads(const CopyPlan& plan) {
  // Per source: each distinct box (offset, extent, strides, element size) and how often it
  // is read.
  using Box = std::tuple<uint64_t, std::vector<int64_t>, std::vector<int64_t>, uint64_t>;
  std::vector<std::map<Box, int>> boxes(plan.sources.size());
  auto add_copy = [&](const TensorCopy& copy) {
    const uint64_t element_size = DTypeSize(copy.src_dtype);
    for (const CopyItem& item : copy.items) {
      if (item.num_elements() == 0 || static_cast<size_t>(item.src_file) >= boxes.size()) {
        continue;
      }
      ++boxes[item.src_file][{item.src_offset, item.extent, item.src_strides, element_size}];
    }
  };
  for (const FilePlan& file : plan.files) {
    for (const TensorCopy& copy : file.tensors) {
      add_copy(copy);
      for (const TensorCopy& term : copy.mean_terms) add_copy(term);
    }
  }
  std::vector<SourceReads> reads(plan.sources.size());
  for (size_t s = 0; s < boxes.size(); ++s) {
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    std::vector<std::pair<uint64_t, uint64_t>> repeated;
    uint64_t bytes_read = 0;
    for (const auto& [box, times] : boxes[s]) {
      const auto& [offset, extent, strides, element_size] = box;
      CopyItem item;
      item.src_offset = offset;
      item.extent = extent;
      item.src_strides = strides;
      ranges.emplace_back(offset, item.src_end(element_size));
      bytes_read += item.num_elements() * element_size;
      if (times > 1) repeated.push_back(ranges.back());
    }
    // The map is ordered by offset first, so both lists are sorted by their begins.
    uint64_t union_bytes = 0;
    uint64_t covered_to = 0;
    for (const auto& [begin, end] : ranges) {
      const uint64_t from = std::max(begin, covered_to);
      if (end > from) union_bytes += end - from;
      covered_to = std::max(covered_to, end);
    }
    reads[s].read_once = bytes_read <= union_bytes;
    for (const auto& range : repeated) {
      if (!reads[s].repeated.empty() && range.first <= reads[s].repeated.back().second) {
        reads[s].repeated.back().second = std::max(reads[s].repeated.back().second, range.second);
      } else {
        reads[s].repeated.push_back(range);
      }
    }
  }
  return reads;
}

}  // namespace reshard
