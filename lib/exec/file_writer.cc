#include "lib/exec/file_writer.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "lib/core/stopwatch.h"
#include "lib/exec/read_analysis.h"

namespace reshard {

absl::Status FileWriter::Start(const Directory& dir) {
  ASSIGN_OR_RETURN(chain_, WriterChain::ToFile(dir, options_.io, ChainSpec()));
  return StartPipeline();
}

absl::Status FileWriter::Start(OutputSink& sink) {
  ASSIGN_OR_RETURN(std::unique_ptr<ByteWriter> file, sink.Open(plan_.name, plan_.bytes));
  ASSIGN_OR_RETURN(chain_, WriterChain::To(std::move(file), ChainSpec()));
  return StartPipeline();
}

WriterChainSpec FileWriter::ChainSpec() const {
  WriterChainSpec spec;
  spec.name = plan_.name;
  spec.size = plan_.bytes;
  spec.xxh3_64 = true;
  // Indexed like plan_.tensors, so that the chain's CRC-32s are the framing's TensorChecksums.
  if (plan_.needs_crc32) spec.crc32_ranges.resize(plan_.tensors.size());
  std::vector<int> deferred_ids;
  uint64_t offset = 0;
  for (const FramingSegment& segment : plan_.segments) {
    switch (segment.kind) {
      case FramingSegment::Kind::kBytes:
        offset += segment.bytes.size();
        break;
      case FramingSegment::Kind::kTensor: {
        const uint64_t bytes = plan_.tensors[segment.tensor].dst_bytes();
        if (plan_.needs_crc32) spec.crc32_ranges[segment.tensor] = {offset, bytes};
        offset += bytes;
        break;
      }
      case FramingSegment::Kind::kDeferred:
        spec.deferred.push_back({offset, segment.size});
        deferred_ids.push_back(segment.deferred);
        offset += segment.size;
        break;
    }
  }
  if (!spec.deferred.empty()) {
    spec.produce = [this, ids = std::move(deferred_ids)](
                       size_t range, const TensorChecksums& crc32s) -> absl::StatusOr<std::string> {
      return plan_.deferred(ids[range], crc32s);
    };
  }
  return spec;
}

absl::Status FileWriter::Advance(size_t segment, int64_t elements, const SpanReader::Run* following,
                                 bool strips_whole) {
  while (segment_ < plan_.segments.size() && segment_ <= segment) {
    const FramingSegment& current = plan_.segments[segment_];
    if (current.kind == FramingSegment::Kind::kTensor) {
      const TensorCopy& copy = plan_.tensors[current.tensor];
      const int64_t target =
          segment_ < segment ? copy.num_elements : std::min(elements, copy.num_elements);
      if (segment_ == segment && target <= tensor_done_ && target < copy.num_elements) {
        return absl::OkStatus();  // nothing of it yet
      }
      RETURN_IF_ERROR(FillTensor(copy, target, following, strips_whole),
                      absl::StrCat("writing tensor \"", copy.name, "\""));
      if (tensor_done_ < copy.num_elements) return absl::OkStatus();
      EndTensor();
    } else if (segment_ == segment) {
      return absl::OkStatus();  // written with the segments before the next step's
    } else if (current.kind == FramingSegment::Kind::kBytes) {
      RETURN_IF_ERROR(AppendBytes(current.bytes));
    } else {  // kDeferred: produced by the chain (ChainSpec) from the bytes before it
      RETURN_IF_ERROR(AppendPlaceholder(current.size));
    }
    ++segment_;
  }
  return absl::OkStatus();
}

absl::StatusOr<WrittenFile> FileWriter::Finish() {
  RETURN_IF_ERROR(Advance(plan_.segments.size(), 0));
  RETURN_IF_ERROR(Flush());
  RETURN_IF_ERROR(pipeline_->Finish());
  phases_.write += pipeline_->sink_seconds();
  pipeline_.reset();
  const Clock::time_point commit_start = Clock::now();
  RETURN_IF_ERROR(chain_->Close());
  phases_.fsync += SecondsSince(commit_start);
  direct_ = chain_->direct();
  WrittenFile written;
  written.name = plan_.name;
  written.bytes = chain_->front().pos();
  written.xxh3_64 = chain_->xxh3_64();
  written.tensors = static_cast<int>(plan_.tensors.size());
  progress_.Add(0, pending_tensors_, 1);
  pending_tensors_ = 0;
  return written;
}

absl::Status FileWriter::StartPipeline() {
  WindowPipeline::Prepare(buffers_, window_bytes_);
  pipeline_ = std::make_unique<WindowPipeline>(chain_->front(), buffers_);
  return absl::OkStatus();
}

absl::Status FileWriter::AppendBytes(absl::string_view bytes) {
  while (!bytes.empty()) {
    if (room() == 0) RETURN_IF_ERROR(Flush());
    const size_t n = std::min(bytes.size(), room());
    std::memcpy(pipeline_->buffer() + used_, bytes.data(), n);
    used_ += n;
    bytes.remove_prefix(n);
  }
  return absl::OkStatus();
}

absl::Status FileWriter::AppendPlaceholder(uint64_t size) {
  while (size > 0) {
    if (room() == 0) RETURN_IF_ERROR(Flush());
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size, room()));
    used_ += n;  // the chain ignores the placeholder's bytes
    size -= n;
  }
  return absl::OkStatus();
}

absl::Status FileWriter::FillTensor(const TensorCopy& copy, int64_t target,
                                    const SpanReader::Run* following, bool strips_whole) {
  if (filler_ == nullptr) {
    filler_ = std::make_unique<TensorFiller>(copy, sources_, &spans_);
    for (const TensorCopy& term : copy.mean_terms) {  // OutputTensor::mean_of
      term_fillers_.push_back(std::make_unique<TensorFiller>(term, sources_));
    }
    // A gather of remote runs queues its requests, the window's writer waits for them (Flush),
    // unless the filling thread reads the bytes right after the fill (a mean).
    if (copy.mean_terms.empty()) filler_->set_run_queue(&run_queue_);
    tensor_done_ = 0;
  }
  // The run read after this tensor's (or this step's) last is read ahead while that one is
  // copied: the next tensor's first.
  SpanReader::Run next;
  if (following != nullptr) {
    next = *following;
  } else {
    for (size_t n = segment_ + 1; n < plan_.segments.size(); ++n) {
      if (plan_.segments[n].kind != FramingSegment::Kind::kTensor) continue;
      next = TensorFiller::FirstRun(plan_.tensors[plan_.segments[n].tensor]);
      break;
    }
  }
  filler_->set_following(next);
  // Files written in turns: the tensor's rows are read in whole spans, not cut at each
  // window (TensorFiller::set_read_to), and its strips as whole rows when every file that
  // reads them takes its turn.
  if (following != nullptr) {
    filler_->set_read_to(copy.num_elements);
    filler_->set_strips_whole(strips_whole);
  }
  const size_t element_size = DTypeSize(copy.dst_dtype);
  // Converted and gathered elements are read through the mapping: fill at most
  // kMappedBytesPerFill source bytes between releases, so the mapped source pages this
  // worker holds stay small whatever the window (F32 narrowed to 16 bits reads twice the
  // bytes it fills). A gather of remote runs maps nothing: it reads up to its scratch buffer,
  // so that a window's requests are many and long (TensorFiller::kRunScratchBytes).
  const uint64_t fill_source_bytes =
      filler_->gathers_remote_runs() ? TensorFiller::kRunScratchBytes : kMappedBytesPerFill;
  const int64_t max_count =
      filler_->plain_copy() ? INT64_MAX
                            : std::max<int64_t>(1, fill_source_bytes / DTypeSize(copy.src_dtype));
  while (tensor_done_ < target) {
    if (room() < element_size) RETURN_IF_ERROR(Flush());
    const int64_t count =
        std::min({static_cast<int64_t>(room() / element_size), target - tensor_done_, max_count});
    const Clock::time_point fill_start = Clock::now();
    std::byte* out = reinterpret_cast<std::byte*>(pipeline_->buffer() + used_);
    RETURN_IF_ERROR(filler_->Fill(tensor_done_, tensor_done_ + count, out));
    filler_->ReleaseConsumed();  // the data is in the buffer now
    if (!copy.mean_terms.empty()) {
      RETURN_IF_ERROR(AverageInPlace(tensor_done_, count, reinterpret_cast<float*>(out)));
    }
    (filler_->plain_copy() ? phases_.read : phases_.convert) += SecondsSince(fill_start);
    used_ += static_cast<size_t>(count) * element_size;
    tensor_done_ += count;
  }
  return absl::OkStatus();
}

void FileWriter::EndTensor() {
  if (filler_ != nullptr) {
    bytes_read_ += filler_->bytes_read();
    for (const auto& term : term_fillers_) bytes_read_ += term->bytes_read();
  }
  filler_.reset();
  term_fillers_.clear();
  tensor_done_ = 0;
  ++pending_tensors_;
}

absl::Status FileWriter::AverageInPlace(int64_t begin, int64_t count, float* out) {
  mean_scratch_.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = 0.0f + out[i];
  for (const auto& term : term_fillers_) {
    RETURN_IF_ERROR(
        term->Fill(begin, begin + count, reinterpret_cast<std::byte*>(mean_scratch_.data())));
    term->ReleaseConsumed();
    for (int64_t i = 0; i < count; ++i) out[i] += mean_scratch_[i];
  }
  const float n = static_cast<float>(term_fillers_.size() + 1);
  for (int64_t i = 0; i < count; ++i) out[i] /= n;
  return absl::OkStatus();
}

absl::Status FileWriter::Flush() {
  if (options_.cancelled != nullptr && options_.cancelled->load(std::memory_order_relaxed)) {
    return absl::CancelledError("conversion cancelled");
  }
  if (used_ == 0) return absl::OkStatus();
  // The reads still under way into the buffer: the writer waits for them.
  const uint64_t ticket = run_queue_.queued();
  std::function<absl::Status()> ready;
  if (ticket > 0) ready = [this, ticket] { return run_queue_.Wait(ticket); };
  RETURN_IF_ERROR(pipeline_->Submit(used_, std::move(ready)));
  progress_.Add(used_, pending_tensors_, 0);
  pending_tensors_ = 0;
  used_ = 0;
  return absl::OkStatus();
}

std::pair<size_t, absl::Status> WriteInLockstep(
    const std::vector<std::unique_ptr<FileWriter>>& writers, uint64_t round_bytes,
    bool strips_whole) {
  std::vector<std::vector<size_t>> segments;
  for (const auto& writer : writers) segments.push_back(TensorSegments(writer->plan()));
  auto copy_of = [&](size_t k, size_t j) -> const TensorCopy& {
    const FilePlan& plan = writers[k]->plan();
    return plan.tensors[plan.segments[segments[k][j]].tensor];
  };
  const size_t tensors = segments[0].size();
  for (size_t j = 0; j < tensors; ++j) {
    bool strips = false;
    uint64_t source_bytes = 0;
    for (size_t k = 0; k < writers.size(); ++k) {
      const TensorCopy& copy = copy_of(k, j);
      strips = strips || ReadsStrips(copy);
      for (const CopyItem& item : copy.items) {
        source_bytes += item.num_elements() * DTypeSize(copy.src_dtype);
      }
    }
    const uint64_t rounds =
        strips ? std::max<uint64_t>(1, (source_bytes + round_bytes - 1) / round_bytes) : 1;
    for (uint64_t round = 1; round <= rounds; ++round) {
      for (size_t k = 0; k < writers.size(); ++k) {
        // What is read next: the next file's part of this tensor, else the first file's next
        // tensor.
        SpanReader::Run following;
        if (k + 1 < writers.size()) {
          following = TensorFiller::FirstRun(copy_of(k + 1, j));
        } else if (j + 1 < tensors) {
          following = TensorFiller::FirstRun(copy_of(0, j + 1));
        }
        const int64_t elements = copy_of(k, j).num_elements;
        const int64_t upto =
            round == rounds
                ? elements
                : static_cast<int64_t>(static_cast<__int128>(elements) * round / rounds);
        absl::Status status = writers[k]->Advance(segments[k][j], upto, &following, strips_whole);
        if (!status.ok()) return {k, std::move(status)};
      }
    }
  }
  return {0, absl::OkStatus()};
}

}  // namespace reshard
