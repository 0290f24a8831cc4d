#include "lib/exec/executor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#if defined(__x86_64__)
// XXH3 of libxxhash with runtime dispatch to AVX2 / AVX-512: its plain entry points use SSE2,
// with which the digest of every byte written takes a quarter of a torch-output split's user CPU.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "lib/core/status.h"
#include "lib/core/stopwatch.h"
#include "lib/exec/source_checksums.h"
#include "lib/exec/tensor_filler.h"
#include "lib/io/atomic_file.h"
#include "lib/io/byte_writer.h"
#include "lib/io/crc32.h"
#include "lib/io/file_access.h"
#include "lib/io/page_buffer.h"

namespace reshard {
namespace {

// Source bytes a worker reads through the mapping before it releases them (see WriteTensor).
constexpr uint64_t kMappedBytesPerFill = 4 << 20;
// A worker's spans (SpanReader: two buffers of this): 4 MiB shared by the active workers when
// sources are read with direct I/O (kDirect; kAuto for dense sources, see SourcesReadDense), as
// the window is, so that two workers stay within the memory of one; 1 MiB for the short rows of
// buffered reads. SpanBytes(io) is the most a mode may use (for the memory estimate).
constexpr uint64_t kDirectSpanBytes = 4 << 20;
constexpr uint64_t kBufferedSpanBytes = 1 << 20;
// Remote sources (s3://) are read in larger spans, shared by the active workers as well, at
// least kRemoteMinSpanBytes: a request costs a round trip however short it is, and each span
// is fetched as several range requests at once (MappedFile::ReadRemote). A 256 MiB checkpoint
// read from a local radosgw: 70 MiB/s in 4 MiB spans cut at every tensor's end, 200-220 MiB/s
// in these whole (SpanReader) 16 MiB spans.
constexpr uint64_t kRemoteSpanBytes = 16 << 20;
constexpr uint64_t kRemoteMinSpanBytes = 4 << 20;
uint64_t SpanBytes(IoMode io) {
  return io == IoMode::kBuffered ? kBufferedSpanBytes : kDirectSpanBytes;
}
// A worker's span when it reads remote sources and `workers` run at once.
uint64_t RemoteSpanBytes(uint64_t workers) {
  return std::max(kRemoteMinSpanBytes, kRemoteSpanBytes / workers);
}

// The workers that run at once for a plan of `files` files.
uint64_t ActiveWorkers(const ExecutorOptions& options, size_t files) {
  return std::max<uint64_t>(1, std::min<uint64_t>(std::max(options.threads, 1), files));
}

// Each worker's share of the window (ExecutorOptions::window_bytes).
uint64_t WorkerWindow(const ExecutorOptions& options, size_t files) {
  return std::max<uint64_t>(options.window_bytes / ActiveWorkers(options, files), 4096);
}

// Shared progress of all workers.
class ProgressTracker {
 public:
  ProgressTracker(const CopyPlan& plan, std::function<void(const Progress&)> callback)
      : callback_(std::move(callback)) {
    progress_.bytes_total = plan.total_bytes;
    progress_.files_total = static_cast<int>(plan.files.size());
    for (const FilePlan& file : plan.files) progress_.tensors_total += file.tensors.size();
  }

  void Add(uint64_t bytes, int64_t tensors, int files) {
    absl::MutexLock lock(&mu_);
    progress_.bytes_done += bytes;
    progress_.tensors_done += tensors;
    progress_.files_done += files;
    if (callback_) callback_(progress_);
  }

  // Serializes the per-file callback with progress reports.
  void Committed(const std::function<void(const WrittenFile&)>& callback, const WrittenFile& file) {
    absl::MutexLock lock(&mu_);
    if (callback) callback(file);
  }

 private:
  absl::Mutex mu_;
  Progress progress_ ABSL_GUARDED_BY(mu_);
  const std::function<void(const Progress&)> callback_;
};

// Hands filled windows to the output's writer chain (lib/io/byte_writer.h: digests, size
// check, file) on its own thread, so that filling the next window (page faults on the sources,
// copies, dtype conversion) overlaps with writing the previous one. Two buffers of half the
// window each: one being filled, one being written.
//
// The buffers belong to the worker thread and serve every file it writes: mapping fresh ones
// per file made the kernel fault in and zero every byte of a many-file output (a DeepSpeed
// universal checkpoint's three files per parameter) once more, 2.4x the kernel time of the
// same bytes written as one file.
class WindowPipeline {
 public:
  using Buffers = std::array<PageBuffer, 2>;
  // Maps `buffers` (half the window each) unless the worker's earlier files did.
  static void Prepare(Buffers& buffers, size_t window_bytes) {
    const size_t half = std::max<size_t>(window_bytes / 2, 4096);
    for (PageBuffer& buffer : buffers) {
      if (buffer.size() < half) buffer = PageBuffer(half);
    }
  }

  WindowPipeline(ByteWriter& sink, Buffers& buffers) : sink_(sink), buffers_(buffers) {
    writer_ = std::thread([this] { WriterLoop(); });
  }
  ~WindowPipeline() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    writer_.join();
  }

  size_t capacity() const { return buffers_[filling_].size(); }
  char* buffer() { return buffers_[filling_].data(); }

  // Hands the first `used` bytes of buffer() to the writer and switches to the other buffer,
  // after the writer has finished the previous one. Returns the writer's error, if any.
  absl::Status Submit(size_t used) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &WindowPipeline::WriterIdle));
    if (!status_.ok()) return status_;
    pending_ = filling_;
    pending_bytes_ = used;
    filling_ = 1 - filling_;
    return absl::OkStatus();
  }

  // Seconds the writer thread spent in the chain's Write. Call after Finish.
  double sink_seconds() {
    absl::MutexLock lock(&mu_);
    return sink_seconds_;
  }

  // Waits for the last write; its status.
  absl::Status Finish() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &WindowPipeline::WriterIdle));
    return status_;
  }

 private:
  bool WriterIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ < 0; }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ >= 0 || stopping_; }

  void WriterLoop() {
    while (true) {
      int index;
      size_t bytes;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &WindowPipeline::HasWork));
        if (pending_ < 0) return;  // stopping with nothing left
        index = pending_;
        bytes = pending_bytes_;
      }
      // Only this thread touches the chain while a buffer is pending.
      const Clock::time_point start = Clock::now();
      absl::Status status = sink_.Write(absl::string_view(buffers_[index].data(), bytes));
      const double seconds = SecondsSince(start);
      absl::MutexLock lock(&mu_);
      sink_seconds_ += seconds;
      if (!status.ok() && status_.ok()) status_ = status;
      pending_ = -1;
    }
  }

  ByteWriter& sink_;
  Buffers& buffers_;
  int filling_ = 0;  // only the filling thread uses it
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = -1;  // buffer being written, -1 when idle
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  double sink_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread writer_;
};

// Writes one output file front to back: segments are copied or filled into the pipeline's
// current buffer, which is handed to the writer thread whenever it is full. Source pages are
// released as soon as their data is in the buffer.
//
// A file is written in one go (Run), or in steps (Start, Advance, Finish) when several files
// are written in turns by one worker (WriteInLockstep): the writer keeps its place, down to
// the element of the tensor it is filling.
class FileWriter {
 public:
  // `checksums` (may be null) is told every source run read.
  // `buffers` are the worker thread's window buffers, reused from file to file, and `spans` its
  // reader of direct reads and short rows (TensorFiller). `window_bytes` is this file's share
  // of the window (both buffers).
  FileWriter(const FilePlan& plan, uint64_t window_bytes, const std::vector<MappedFile>& sources,
             const ExecutorOptions& options, ProgressTracker& progress, SourceChecksums* checksums,
             WindowPipeline::Buffers& buffers, SpanReader& spans)
      : plan_(plan),
        window_bytes_(window_bytes),
        sources_(sources),
        options_(options),
        progress_(progress),
        source_checksums_(checksums),
        buffers_(buffers),
        spans_(spans) {}

  // Writes the file into `dir` as an AtomicFile (direct I/O where options.io allows), or
  // through the writer `sink` opens for it; destroyed unclosed on an error.
  template <typename Destination>
  absl::StatusOr<WrittenFile> Run(Destination& destination) {
    RETURN_IF_ERROR(Start(destination));
    RETURN_IF_ERROR(Advance(plan_.segments.size(), 0));
    return Finish();
  }

  // Opens the file in `dir` (an AtomicFile, direct I/O where options.io allows).
  absl::Status Start(const Directory& dir) {
    ASSIGN_OR_RETURN(AtomicFile created, AtomicFile::Create(dir, plan_.name, options_.io));
    auto file = std::make_unique<AtomicFileWriter>(std::move(created));
    local_file_ = file.get();
    return StartChain(std::move(file));
  }
  // Opens the file through `sink`.
  absl::Status Start(OutputSink& sink) {
    ASSIGN_OR_RETURN(std::unique_ptr<ByteWriter> file, sink.Open(plan_.name, plan_.bytes));
    return StartChain(std::move(file));
  }

  // Writes every segment before `segment` that is not written yet and, when `segment` is a
  // tensor, its first `elements` elements (at most all of them). `following` is set when files
  // take turns (WriteInLockstep): the source run read after this step's last one, another
  // file's; null: the file is written alone, and this file's next tensor follows.
  // `strips_whole`: every file that reads the other strips of this one's rows takes its turn
  // (TensorFiller::set_strips_whole).
  absl::Status Advance(size_t segment, int64_t elements, const SpanReader::Run* following = nullptr,
                       bool strips_whole = false) {
    while (segment_ < plan_.segments.size() && segment_ <= segment) {
      const FramingSegment& current = plan_.segments[segment_];
      if (current.kind == FramingSegment::Kind::kTensor) {
        const TensorCopy& copy = plan_.tensors[current.tensor];
        const int64_t target =
            segment_ < segment ? copy.num_elements : std::min(elements, copy.num_elements);
        if (segment_ == segment && target <= tensor_done_ && target < copy.num_elements) {
          return absl::OkStatus();  // nothing of it yet
        }
        RETURN_IF_ERROR(
            FillTensor(copy, target, following, strips_whole, &checksums_[current.tensor]),
            absl::StrCat("writing tensor \"", copy.name, "\""));
        if (tensor_done_ < copy.num_elements) return absl::OkStatus();
        EndTensor();
      } else if (segment_ == segment) {
        return absl::OkStatus();  // written with the segments before the next step's
      } else if (current.kind == FramingSegment::Kind::kBytes) {
        RETURN_IF_ERROR(AppendBytes(current.bytes));
      } else {  // kDeferred
        const std::string bytes = plan_.deferred(current.deferred, checksums_);
        if (bytes.size() != current.size) {
          return absl::InternalError(absl::StrCat(plan_.name, ": deferred segment ",
                                                  current.deferred, " is ", bytes.size(),
                                                  " bytes, the framing promised ", current.size));
        }
        RETURN_IF_ERROR(AppendBytes(bytes));
      }
      ++segment_;
    }
    return absl::OkStatus();
  }

  // Writes what is left, then commits the file (size checked, then fsync and rename, or the
  // upload completed).
  absl::StatusOr<WrittenFile> Finish() {
    RETURN_IF_ERROR(Advance(plan_.segments.size(), 0));
    RETURN_IF_ERROR(Flush());
    RETURN_IF_ERROR(pipeline_->Finish());
    phases_.write += pipeline_->sink_seconds();
    pipeline_.reset();
    const Clock::time_point commit_start = Clock::now();
    RETURN_IF_ERROR(exact_->Close());
    phases_.fsync += SecondsSince(commit_start);
    direct_ = local_file_ != nullptr && local_file_->file().direct();
    WrittenFile written;
    written.name = plan_.name;
    written.bytes = exact_->pos();
    written.xxh3_64 = digest_->xxh3_64();
    written.tensors = static_cast<int>(plan_.tensors.size());
    progress_.Add(0, pending_tensors_, 1);
    pending_tensors_ = 0;
    return written;
  }

  const FilePlan& plan() const { return plan_; }
  uint64_t bytes_read() const { return bytes_read_; }
  // Whether the file was written with direct I/O to the end.
  bool direct() const { return direct_; }
  // read, convert, write and fsync time of this file (verify is the caller's).
  const PhaseSeconds& phases() const { return phases_; }

 private:
  // The file, then the chain in front of it: the manifest and resumes need the file's
  // XXH3-64; a framing that promised another size than the plan's is a bug caught before the
  // file gets its final name.
  absl::Status StartChain(std::unique_ptr<ByteWriter> file) {
    file_ = std::move(file);
    digest_ = std::make_unique<DigestingWriter>(file_.get(), DigestingWriter::Digests{true, false});
    exact_ = std::make_unique<ExactSizeWriter>(digest_.get(), plan_.bytes, plan_.name);
    WindowPipeline::Prepare(buffers_, window_bytes_);
    pipeline_ = std::make_unique<WindowPipeline>(*exact_, buffers_);
    checksums_.assign(plan_.tensors.size(), 0);
    return absl::OkStatus();
  }

  size_t room() const { return pipeline_->capacity() - used_; }

  absl::Status AppendBytes(absl::string_view bytes) {
    while (!bytes.empty()) {
      if (room() == 0) RETURN_IF_ERROR(Flush());
      const size_t n = std::min(bytes.size(), room());
      std::memcpy(pipeline_->buffer() + used_, bytes.data(), n);
      used_ += n;
      bytes.remove_prefix(n);
    }
    return absl::OkStatus();
  }

  // Fills the tensor's data up to element `target`, creating its fillers at its first
  // element; `crc32` accumulates its CRC-32 when the framing needs it.
  absl::Status FillTensor(const TensorCopy& copy, int64_t target, const SpanReader::Run* following,
                          bool strips_whole, uint32_t* crc32) {
    if (filler_ == nullptr) {
      filler_ = std::make_unique<TensorFiller>(copy, sources_, source_checksums_, &spans_);
      for (const TensorCopy& term : copy.mean_terms) {  // OutputTensor::mean_of
        term_fillers_.push_back(std::make_unique<TensorFiller>(term, sources_, source_checksums_));
      }
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
      if (plan_.needs_crc32) {
        *crc32 = Crc32(*crc32, out, static_cast<size_t>(count) * element_size);
      }
      (filler_->plain_copy() ? phases_.read : phases_.convert) += SecondsSince(fill_start);
      used_ += static_cast<size_t>(count) * element_size;
      tensor_done_ += count;
    }
    return absl::OkStatus();
  }

  // The tensor is written: its fillers go.
  void EndTensor() {
    if (filler_ != nullptr) {
      bytes_read_ += filler_->bytes_read();
      for (const auto& term : term_fillers_) bytes_read_ += term->bytes_read();
    }
    filler_.reset();
    term_fillers_.clear();
    tensor_done_ = 0;
    ++pending_tensors_;
  }

  // `out` holds elements [begin, begin + count) of a mean's first term: adds the other terms'
  // and divides, in float32, in PyTorch's order for `sum(slices) / len(slices)`: 0 + t0 (which
  // makes -0 into +0), + t1, ..., then / n.
  absl::Status AverageInPlace(int64_t begin, int64_t count, float* out) {
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

  absl::Status Flush() {
    if (options_.cancelled != nullptr && options_.cancelled->load(std::memory_order_relaxed)) {
      return absl::CancelledError("conversion cancelled");
    }
    if (used_ == 0) return absl::OkStatus();
    RETURN_IF_ERROR(pipeline_->Submit(used_));
    progress_.Add(used_, pending_tensors_, 0);
    pending_tensors_ = 0;
    used_ = 0;
    return absl::OkStatus();
  }

  const FilePlan& plan_;
  const uint64_t window_bytes_;
  const std::vector<MappedFile>& sources_;
  const ExecutorOptions& options_;
  ProgressTracker& progress_;
  SourceChecksums* const source_checksums_;
  WindowPipeline::Buffers& buffers_;
  SpanReader& spans_;
  // The chain, file first; destroyed unclosed (an error), the file leaves nothing under its
  // name. The pipeline is declared last so that its writer thread stops first.
  std::unique_ptr<ByteWriter> file_;
  AtomicFileWriter* local_file_ = nullptr;  // file_ when it is a local AtomicFile
  std::unique_ptr<DigestingWriter> digest_;
  std::unique_ptr<ExactSizeWriter> exact_;
  std::unique_ptr<WindowPipeline> pipeline_;
  size_t segment_ = 0;                    // the next segment to write (or the tensor being filled)
  std::unique_ptr<TensorFiller> filler_;  // of the tensor being filled
  std::vector<std::unique_ptr<TensorFiller>> term_fillers_;
  int64_t tensor_done_ = 0;  // its elements filled
  size_t used_ = 0;          // bytes filled in the pipeline's current buffer
  uint64_t bytes_read_ = 0;
  bool direct_ = false;
  int64_t pending_tensors_ = 0;
  TensorChecksums checksums_;
  PhaseSeconds phases_;
  std::vector<float> mean_scratch_;  // another term's elements while averaging
};

// A file committed by an earlier attempt, when it is intact: planned size, recorded checksum.
// Anything else under the name is removed so the file is written again. Adds the time spent
// checking to `verify_seconds` and sets `mismatch` when a recorded file failed the check.
std::optional<WrittenFile> ReuseCompletedFile(const FilePlan& file, const Directory& dir,
                                              const ExecutorOptions& options,
                                              double& verify_seconds, bool& mismatch) {
  auto recorded = options.completed_files.find(file.name);
  if (recorded != options.completed_files.end()) {
    const Clock::time_point start = Clock::now();
    auto place = dir.OpenParentOf(file.name);
    auto st = place.ok() ? place->folder.StatChild(place->name) : place.status();
    if (st.ok() && S_ISREG(st->st_mode) && static_cast<uint64_t>(st->st_size) == file.bytes) {
      auto hash = HashFile(dir, file.name);
      verify_seconds += SecondsSince(start);
      if (hash.ok() && *hash == recorded->second) {
        return WrittenFile{file.name, file.bytes, *hash, static_cast<int>(file.tensors.size())};
      }
    }
    mismatch = true;
  }
  // Written again; Create fails loudly if it stays.
  if (auto place = dir.OpenParentOf(file.name); place.ok()) {
    place->folder.RemoveFile(place->name).IgnoreError();
  }
  return std::nullopt;
}

absl::StatusOr<uint64_t> HashMappedFile(const MappedFile& file) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  constexpr uint64_t kChunk = 16 << 20;
  for (uint64_t offset = 0; offset < file.size(); offset += kChunk) {
    const uint64_t length = std::min(kChunk, file.size() - offset);
    XXH3_64bits_update(state, file.data() + offset, length);
    file.Release(offset, length);
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

// Whether `copy` reads strips of rows: rows of its source that it reads only part of, whose
// other bytes other boxes (the other parts of a split along a later dimension) read.
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

// The indices of `file`'s tensor segments, in order.
std::vector<size_t> TensorSegments(const FilePlan& file) {
  std::vector<size_t> segments;
  for (size_t s = 0; s < file.segments.size(); ++s) {
    if (file.segments[s].kind == FramingSegment::Kind::kTensor) segments.push_back(s);
  }
  return segments;
}

// Files written in turns by one worker share the reads of the rows their strips come from:
// at most this many (each has its own window share, pipeline and writer thread).
constexpr size_t kMaxLockstepFiles = 8;

}  // namespace

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
  // in turns all four, the strips of one source evicted the other's spans, and the split read
  // its input 1.6 times. Only the tensors read in strips join files: the replicated ones (the
  // norms, metaseq's `version` and position embeddings) are read by every part from the first
  // source, which joined all four parts of a metaseq split again (1.45x its input read); their
  // bytes are repeated ranges, kept in the page cache for the other parts (AnalyzeSourceReads).
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
    // after the current one read ahead. Dealt into a unit per worker instead (rows read once
    // per unit, through the page cache) the split into 4 of docs/benchmarks.md took 1.22x the
    // wall time and 2.1x the CPU (9 alternating pairs).
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

namespace {

// Writes the started `writers` (files with the same tensors in the same order, WorkUnits) in
// turns, tensor by tensor: each file writes its part of a tensor before the next file writes
// its own. A tensor read in strips goes in rounds of about `round_bytes` of its source, every
// file filling the same share of it, so that the files read the strips of the same rows one
// after the other, out of the worker's current or previous span (SpanReader): the rows come
// from the page cache once, not once per file. Other tensors are written whole, one file after
// the other, each reading ahead the next file's first run. On error: the index of the writer
// that failed and its error.
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

}  // namespace

absl::StatusOr<uint64_t> HashFile(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  if (file.remote()) {
    return absl::UnimplementedError(absl::StrCat("checksumming remote file ", path));
  }
  return HashMappedFile(file);
}

absl::StatusOr<uint64_t> HashFile(const Directory& dir, const std::string& name) {
  ASSIGN_OR_RETURN(Directory::Place place, dir.OpenParentOf(name));
  ASSIGN_OR_RETURN(int fd, place.folder.OpenFile(place.name, O_RDONLY | O_NONBLOCK));
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Adopt(fd, dir.PathOf(name)));
  return HashMappedFile(file);
}

absl::StatusOr<std::vector<MappedFile>> MapSources(const std::vector<SourceFile>& sources) {
  std::vector<MappedFile> mapped;
  mapped.reserve(sources.size());
  for (const SourceFile& source : sources) {
    ASSIGN_OR_RETURN(MappedFile file,
                     MappedFile::Open(source.path, static_cast<int64_t>(source.size)));
    mapped.push_back(std::move(file));
  }
  return mapped;
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

namespace {

// Execute into a local folder (`dir`) or through a sink (`sink`): exactly one is set.
absl::StatusOr<ExecutionResult> ExecuteInto(const CopyPlan& plan, const Directory* dir,
                                            OutputSink* sink, const ExecutorOptions& options) {
  ASSIGN_OR_RETURN(std::vector<MappedFile> sources, MapSources(plan.sources));
  if (options.io != IoMode::kBuffered) {
    const std::vector<SourceReads> reads = AnalyzeSourceReads(plan);
    const std::vector<bool> dense = SourcesReadDense(plan);
    for (size_t s = 0; s < sources.size(); ++s) {
      sources[s].set_drop_behind(reads[s].read_once);
      sources[s].set_repeated_ranges(reads[s].repeated);
      // kDirect: contiguous runs are read past the page cache too (strided and gathered
      // elements still come through the mapping, dropped behind). kAuto does the same for
      // sources read once in whole boxes (a consolidation of whole tensors), where the filesystem
      // takes it: buffered reads that jump from tensor to tensor restart the kernel's readahead
      // at small page-cache folios, and cost 1.27x the wall time and 1.6x the CPU of direct
      // reads into huge-page spans (2 GiB torch.save input). Strided sources (the strips of a
      // split or a TP merge) stay buffered: read directly they cost 1.30x the wall time.
      // A source read once but not all in whole boxes (a split: tensors cut by rows and by
      // columns) has its dense boxes read directly and its strips buffered; so has one whose
      // boxes read some ranges several times (tensors replicated into every part: those
      // ranges stay in the page cache for the parts that read them after the first). Read all
      // buffered, such a source would copy every byte through the page cache (a split with
      // Llama rules, whose norms are replicated into every part, is one).
      if (options.io == IoMode::kAuto && reads[s].read_once) {
        sources[s].EnableDirectReads();  // buffered where the filesystem refuses
        sources[s].set_direct_reads_dense_only(!dense[s] || !reads[s].repeated.empty());
      } else if (options.io == IoMode::kDirect && !sources[s].EnableDirectReads()) {
        return absl::FailedPreconditionError(absl::StrCat("--io direct: the filesystem of ",
                                                          sources[s].path(),
                                                          " refuses direct I/O; use --io auto"));
      }
    }
  }
  ProgressTracker progress(plan, options.on_progress);
  std::optional<SourceChecksums> checksums;
  if (options.check_source_crc32) checksums.emplace(plan.sources);
  SourceChecksums* const checked =
      checksums.has_value() && !checksums->empty() ? &*checksums : nullptr;
  // Every file gets its result from exactly one worker (written, reused or stopped).
  std::vector<std::optional<absl::StatusOr<WrittenFile>>> results(plan.files.size());
  std::vector<uint64_t> bytes_read(plan.files.size(), 0);
  std::vector<PhaseSeconds> phases(plan.files.size());
  std::vector<char> mismatched(plan.files.size(), 0);
  std::vector<char> direct(plan.files.size(), 0);
  std::vector<char> was_reused(plan.files.size(), 0);
  const bool any_direct_reads = std::any_of(sources.begin(), sources.end(),
                                            [](const MappedFile& s) { return s.direct_reads(); });
  const bool any_remote =
      std::any_of(sources.begin(), sources.end(), [](const MappedFile& s) { return s.remote(); });
  // One file, or files written in turns (WriteInLockstep); the workers take them in order.
  const std::vector<WorkUnit> units = WorkUnits(plan);
  const uint64_t active_workers = ActiveWorkers(options, units.size());
  // Spans are sized as if every file had its worker: files written in turns use three span
  // buffers (SpanReader::set_files_in_turns), so one worker then holds no more than two did.
  const uint64_t span_workers = ActiveWorkers(options, plan.files.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    // Per file written at once; mapped at the first file this worker writes.
    std::vector<WindowPipeline::Buffers> buffers(1);
    // Direct reads and short rows go through it; its pages are touched only when there are any.
    SpanReader spans(any_remote ? RemoteSpanBytes(active_workers)
                     : any_direct_reads
                         ? std::max(kBufferedSpanBytes, kDirectSpanBytes / span_workers)
                         : kBufferedSpanBytes);
    for (size_t u = next++; u < units.size(); u = next++) {
      std::vector<size_t> to_write;
      for (size_t f : units[u].files) {
        if (failed.load()) {
          results[f] = absl::CancelledError("stopped after another file failed");
          continue;
        }
        const FilePlan& file = plan.files[f];
        bool mismatch = false;
        std::optional<WrittenFile> reused;
        if (dir != nullptr) {
          reused = ReuseCompletedFile(file, *dir, options, phases[f].verify, mismatch);
        } else if (auto recorded = options.completed_files.find(file.name);
                   recorded != options.completed_files.end()) {
          // The sink holds it already, checked by the caller (see Execute).
          reused = WrittenFile{file.name, file.bytes, recorded->second,
                               static_cast<int>(file.tensors.size())};
        }
        mismatched[f] = mismatch;
        was_reused[f] = reused.has_value();
        if (!reused.has_value()) {
          to_write.push_back(f);
          continue;
        }
        progress.Add(file.bytes, file.tensors.size(), 1);
        results[f] = *std::move(reused);
        progress.Committed(options.on_file_committed, **results[f]);
        // Its sources were not read in this pass, but their checks still have to hold (the
        // earlier attempt may have failed on one): Verify reads the ranges it reads from.
        if (checked != nullptr) {
          for (const TensorCopy& copy : file.tensors) {
            for (const CopyItem& item : copy.items) {
              checked->Record(item.src_file, item.src_offset, 1, nullptr, copy.name);
            }
          }
        }
      }
      if (to_write.empty()) continue;
      // The worker's window, shared by the files it writes at once.
      if (buffers.size() < to_write.size()) buffers.resize(to_write.size());
      const uint64_t window = WorkerWindow(options, units.size()) / to_write.size();
      std::vector<std::unique_ptr<FileWriter>> writers;
      for (size_t i = 0; i < to_write.size(); ++i) {
        writers.push_back(std::make_unique<FileWriter>(plan.files[to_write[i]], window, sources,
                                                       options, progress, checked, buffers[i],
                                                       spans));
      }
      auto record = [&](size_t i) {
        const size_t f = to_write[i];
        bytes_read[f] = writers[i]->bytes_read();
        direct[f] = writers[i]->direct();
        const double verify = phases[f].verify;
        phases[f] = writers[i]->phases();
        phases[f].verify = verify;
        if (results[f]->ok()) {
          progress.Committed(options.on_file_committed, **results[f]);
        } else {
          failed.store(true);
        }
      };
      if (writers.size() == 1) {
        results[to_write[0]] = dir != nullptr ? writers[0]->Run(*dir) : writers[0]->Run(*sink);
        record(0);
        continue;
      }
      // Files written in turns: started together, advanced in rounds, finished together.
      // Whatever fails first fails the unit; the others stop unfinished (no final name).
      absl::Status unit_status;
      size_t failing = 0;
      for (size_t i = 0; i < writers.size() && unit_status.ok(); ++i) {
        unit_status = dir != nullptr ? writers[i]->Start(*dir) : writers[i]->Start(*sink);
        failing = i;
      }
      if (unit_status.ok()) {
        spans.set_files_in_turns(true);
        std::tie(failing, unit_status) =
            WriteInLockstep(writers, spans.capacity() / 2, units[u].whole_rows);
        spans.set_files_in_turns(false);
      }
      for (size_t i = 0; i < writers.size(); ++i) {
        const size_t f = to_write[i];
        if (unit_status.ok()) {
          results[f] = writers[i]->Finish();
        } else {
          results[f] = i == failing ? unit_status
                                    : absl::CancelledError("stopped after another file failed");
        }
        record(i);
      }
    }
  };
  const int threads = std::max(1, std::min<int>(options.threads, static_cast<int>(units.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();

  ExecutionResult result;
  absl::Status first_error;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    result.phases.read += phases[f].read;
    result.phases.convert += phases[f].convert;
    result.phases.write += phases[f].write;
    result.phases.fsync += phases[f].fsync;
    result.phases.verify += phases[f].verify;
    result.verification_failures += mismatched[f];
    absl::StatusOr<WrittenFile>& file_result = *results[f];
    if (!file_result.ok()) {
      // Report the root cause, not a sibling stopped because of it.
      if (first_error.ok() ||
          (absl::IsCancelled(first_error) && !absl::IsCancelled(file_result.status()))) {
        first_error = Annotate(file_result.status(), plan.files[f].name);
      }
      continue;
    }
    result.bytes_written += file_result->bytes;
    if (was_reused[f]) {
      ++result.reused_files;
      result.reused_bytes += file_result->bytes;
    } else {
      ++(direct[f] ? result.direct_files : result.buffered_files);
    }
    result.bytes_read += bytes_read[f];
    result.files.push_back(*std::move(file_result));
  }
  if (!first_error.ok()) return first_error;
  if (checked != nullptr) {
    const Clock::time_point start = Clock::now();
    RETURN_IF_ERROR(checked->Verify(sources));
    result.phases.crc_check = SecondsSince(start);
    result.crc_bytes_reread = checked->bytes_reread();
  }
  if (options.io != IoMode::kBuffered) {
    // What the pass could not drop behind it (sources read more than once, pages shared by
    // strips of rows that went to different files, the CRC check's reads) goes now: the
    // conversion leaves no input in the page cache.
    for (MappedFile& source : sources) {
      source.set_repeated_ranges({});
      source.set_drop_behind(true);
      source.DropCached(0, source.size());
    }
  }
  return result;
}

}  // namespace

absl::StatusOr<ExecutionResult> Execute(const CopyPlan& plan, const Directory& dir,
                                        const ExecutorOptions& options) {
  return ExecuteInto(plan, &dir, nullptr, options);
}

absl::StatusOr<ExecutionResult> Execute(const CopyPlan& plan, OutputSink& sink,
                                        const ExecutorOptions& options) {
  return ExecuteInto(plan, nullptr, &sink, options);
}

uint64_t EstimateExecutionMemory(const CopyPlan& plan, const ExecutorOptions& options) {
  const std::vector<WorkUnit> units = WorkUnits(plan);
  const uint64_t threads = ActiveWorkers(options, units.size());
  size_t files_at_once = 1;  // by one worker
  for (const WorkUnit& unit : units) files_at_once = std::max(files_at_once, unit.files.size());
  uint64_t largest_file = 0;
  uint64_t plan_bytes = sizeof(CopyPlan);
  bool means = false;
  // The local copies of strided items of remote sources one tensor's fillers hold at most.
  uint64_t staging = 0;
  auto add_copy = [&](const TensorCopy& copy) {
    plan_bytes += sizeof(TensorCopy) + copy.name.size();
    for (const CopyItem& item : copy.items) {
      plan_bytes += sizeof(CopyItem) + item.extent.size() * 3 * sizeof(int64_t);
    }
  };
  for (const FilePlan& file : plan.files) {
    largest_file = std::max(largest_file, file.bytes);
    for (const TensorCopy& copy : file.tensors) {
      add_copy(copy);
      for (const TensorCopy& term : copy.mean_terms) add_copy(term);
      means = means || !copy.mean_terms.empty();
      staging = std::max(staging, TensorFiller::StagingMemoryBound(copy, plan.sources));
    }
  }
  // Each worker holds its window, the stage of a direct-I/O file, and the source pages one fill
  // consumed until they are released: kMappedBytesPerFill, plus partly used pages at both ends
  // of every row run, bounded here by one more window.
  const uint64_t window = std::min(WorkerWindow(options, units.size()), largest_file);
  const uint64_t checksums =
      options.check_source_crc32 ? SourceChecksums::MemoryBound(plan.sources) : 0;
  // A mean's other terms are read through a scratch buffer of up to half a window.
  const uint64_t mean_scratch = means ? window / 2 : 0;
  const uint64_t mapped = std::min<uint64_t>(kMappedBytesPerFill, 2 * window);
  // A direct-I/O file's stage, for each file a worker writes at once.
  const uint64_t stage =
      options.io == IoMode::kBuffered ? 0 : files_at_once * std::min<uint64_t>(1 << 20, window);
  const bool remote = std::any_of(plan.sources.begin(), plan.sources.end(),
                                  [](const SourceFile& s) { return IsRemotePath(s.path); });
  const uint64_t span =
      2 * std::min<uint64_t>(remote ? RemoteSpanBytes(threads) : SpanBytes(options.io),
                             plan.source_bytes_read);
  // Each file a worker writes at once has its tensor's fillers.
  return threads * (2 * window + mapped + stage + span + mean_scratch + files_at_once * staging) +
         plan_bytes + checksums;
}
}  // namespace reshard
