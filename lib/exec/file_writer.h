// Writes one output file of a CopyPlan front to back through a WindowPipeline: segments are
// copied or filled into the pipeline's current buffer, which is handed to the writer thread
// whenever it is full. Source pages are released as soon as their data is in the buffer.
//
// A file is written in one go (Run), or in steps (Start, Advance, Finish) when several files
// are written in turns by one worker (WriteInLockstep): the writer keeps its place, down to
// the element of the tensor it is filling.

#ifndef RESHARD_LIB_EXEC_FILE_WRITER_H_
#define RESHARD_LIB_EXEC_FILE_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/core/status.h"
#include "lib/exec/executor_options.h"
#include "lib/exec/progress_tracker.h"
#include "lib/exec/span_reader.h"
#include "lib/exec/tensor_filler.h"
#include "lib/exec/window_pipeline.h"
#include "lib/io/byte_writer.h"
#include "lib/io/directory.h"
#include "lib/io/mapped_file.h"
#include "lib/io/remote_runs.h"
#include "lib/io/writer_chain.h"
#include "lib/plan/layout.h"

namespace reshard {

class FileWriter {
 public:
  // Source bytes a worker reads through the mapping before it releases them (see FillTensor).
  static constexpr uint64_t kMappedBytesPerFill = 4 << 20;

  // `buffers` are the worker thread's window buffers, reused from file to file, and `spans` its
  // reader of direct reads and short rows (TensorFiller). `window_bytes` is this file's share
  // of the window (both buffers).
  FileWriter(const FilePlan& plan, uint64_t window_bytes, const std::vector<MappedFile>& sources,
             const ExecutorOptions& options, ProgressTracker& progress,
             WindowPipeline::Buffers& buffers, SpanReader& spans)
      : plan_(plan),
        window_bytes_(window_bytes),
        sources_(sources),
        options_(options),
        progress_(progress),
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
  absl::Status Start(const Directory& dir);
  // Opens the file through `sink`.
  absl::Status Start(OutputSink& sink);

  // Writes every segment before `segment` that is not written yet and, when `segment` is a
  // tensor, its first `elements` elements (at most all of them). `following` is set when files
  // take turns (WriteInLockstep): the source run read after this step's last one, another
  // file's; null: the file is written alone, and this file's next tensor follows.
  // `strips_whole`: every file that reads the other strips of this one's rows takes its turn
  // (TensorFiller::set_strips_whole).
  absl::Status Advance(size_t segment, int64_t elements, const SpanReader::Run* following = nullptr,
                       bool strips_whole = false);

  // Writes what is left, then commits the file (size checked, then fsync and rename, or the
  // upload completed).
  absl::StatusOr<WrittenFile> Finish();

  const FilePlan& plan() const { return plan_; }
  uint64_t bytes_read() const { return bytes_read_; }
  // Whether the file was written with direct I/O to the end.
  bool direct() const { return direct_; }
  // read, convert, write and fsync time of this file (verify is the caller's).
  const PhaseSeconds& phases() const { return phases_; }

 private:
  // What the file's chain (lib/io/writer_chain.h) must do, from the plan: the manifest and
  // resumes need the file's XXH3-64; a torch zip framing needs the CRC-32 of each tensor's
  // bytes, which its deferred segments (data descriptors, central directory) carry; a framing
  // that promised another size than the plan's is a bug caught before the file gets its final
  // name.
  WriterChainSpec ChainSpec() const;
  absl::Status StartPipeline();

  size_t room() const { return pipeline_->capacity() - used_; }

  absl::Status AppendBytes(absl::string_view bytes);
  // Leaves `size` bytes of the window for the chain to fill in (a deferred segment).
  absl::Status AppendPlaceholder(uint64_t size);

  // Fills the tensor's data up to element `target`, creating its fillers at its first
  // element.
  absl::Status FillTensor(const TensorCopy& copy, int64_t target, const SpanReader::Run* following,
                          bool strips_whole);

  // The tensor is written: its fillers go.
  void EndTensor();

  // `out` holds elements [begin, begin + count) of a mean's first term: adds the other terms'
  // and divides, in float32, in PyTorch's order for `sum(slices) / len(slices)`: 0 + t0 (which
  // makes -0 into +0), + t1, ..., then / n.
  absl::Status AverageInPlace(int64_t begin, int64_t count, float* out);

  absl::Status Flush();

  const FilePlan& plan_;
  const uint64_t window_bytes_;
  const std::vector<MappedFile>& sources_;
  const ExecutorOptions& options_;
  ProgressTracker& progress_;
  WindowPipeline::Buffers& buffers_;
  SpanReader& spans_;
  // Requests of gathers of remote runs (TensorFiller::set_run_queue), still under way while
  // the next window is filled; the writer thread waits for a window's before writing it
  // (Flush). Declared before the pipeline, whose writer thread waits on it, and the buffers'
  // owner outlives it: its destructor waits for every request.
  RemoteRunQueue run_queue_{MappedFile::kRemotePiecesInFlight, TensorFiller::kRunScratchBytes};
  // Destroyed unclosed (an error), the file leaves nothing under its name. The pipeline is
  // declared last so that its writer thread stops first.
  std::unique_ptr<WriterChain> chain_;
  std::unique_ptr<WindowPipeline> pipeline_;
  size_t segment_ = 0;                    // the next segment to write (or the tensor being filled)
  std::unique_ptr<TensorFiller> filler_;  // of the tensor being filled
  std::vector<std::unique_ptr<TensorFiller>> term_fillers_;
  int64_t tensor_done_ = 0;  // its elements filled
  size_t used_ = 0;          // bytes filled in the pipeline's current buffer
  uint64_t bytes_read_ = 0;
  bool direct_ = false;
  int64_t pending_tensors_ = 0;
  PhaseSeconds phases_;
  std::vector<float> mean_scratch_;  // another term's elements while averaging
};

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
    bool strips_whole);

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_FILE_WRITER_H_
