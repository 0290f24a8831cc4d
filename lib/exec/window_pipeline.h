// Hands filled windows to an output's writer chain (lib/io/byte_writer.h: digests, size check,
// file) on its own thread, so that filling the next window (page faults on the sources,
// copies, dtype conversion) overlaps with writing the previous one. Two buffers of half the
// window each: one being filled, one being written.
//
// The buffers belong to the worker thread and serve every file it writes: fresh ones per file
// would make the kernel fault in and zero every byte of a many-file output (a DeepSpeed
// universal checkpoint's three files per parameter) once more.

#ifndef RESHARD_LIB_EXEC_WINDOW_PIPELINE_H_
#define RESHARD_LIB_EXEC_WINDOW_PIPELINE_H_

#include <array>
#include <cstddef>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "lib/io/byte_writer.h"
#include "lib/io/page_buffer.h"

namespace reshard {

class WindowPipeline {
 public:
  using Buffers = std::array<PageBuffer, 2>;
  // Maps `buffers` (half the window each) unless the worker's earlier files did.
  static void Prepare(Buffers& buffers, size_t window_bytes);

  // Writes into `sink` from `buffers` (prepared), on a thread started here.
  WindowPipeline(ByteWriter& sink, Buffers& buffers);
  // Stops the writer thread after the pending write, if any.
  ~WindowPipeline();

  size_t capacity() const { return buffers_[filling_].size(); }
  char* buffer() { return buffers_[filling_].data(); }

  // Hands the first `used` bytes of buffer() to the writer and switches to the other buffer,
  // after the writer has finished the previous one. Returns the writer's error, if any.
  // `ready`, when set, is called on the writer thread before the bytes are written: it waits
  // for what still fills them (reads under way into the buffer, RemoteRunQueue::Wait) and
  // returns their error, which then stands for the write's.
  absl::Status Submit(size_t used, std::function<absl::Status()> ready = nullptr);

  // Seconds the writer thread spent in the chain's Write. Call after Finish.
  double sink_seconds();

  // Waits for the last write; its status.
  absl::Status Finish();

 private:
  bool WriterIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ < 0; }
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ >= 0 || stopping_; }

  void WriterLoop();

  ByteWriter& sink_;
  Buffers& buffers_;
  int filling_ = 0;  // only the filling thread uses it
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = -1;  // buffer being written, -1 when idle
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<absl::Status()> pending_ready_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  double sink_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread writer_;
};

}  // namespace reshard

#endif  // RESHARD_LIB_EXEC_WINDOW_PIPELINE_H_
